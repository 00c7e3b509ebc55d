"""Which scaled_dot_product_attention backend is fastest at the model's attention shape.

    python bench/attention_backends.py [--shape qwen2.5-1.5b] [--batch 8] [--seq-len 2048]

Times forward + backward of causal attention in bf16 on one GPU for each SDPA backend that accepts
the shape, both with grouped-query attention handled by the kernel (enable_gqa=True: K/V keep
their few heads) and with K/V repeated to every query head first (what transformers does when it
cannot pass enable_gqa). Prints one JSON line per (backend, gqa) pair: milliseconds per
forward+backward, achieved TFLOP/s (causal: half of 4·B·H·S²·D forward, 2.5x that with backward),
or the reason the backend refused the inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def attention_flops(batch: int, heads: int, seq: int, head_dim: int) -> float:
    """Causal forward + backward FLOPs: forward 4·B·H·S²·D halved by the mask, backward 2.5x forward."""
    forward = 4 * batch * heads * seq * seq * head_dim / 2
    return forward * 3.5


def time_backend(backend: Any, q: Any, k: Any, v: Any, *, gqa: bool, iters: int) -> float:
    """Milliseconds per forward + backward (CUDA events, after two warm-up passes)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    groups = q.shape[1] // k.shape[1]
    if not gqa:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    k, v = k.detach().requires_grad_(), v.detach().requires_grad_()
    grad = torch.randn_like(q)

    def once() -> None:
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        out.backward(grad)

    for _ in range(2):
        once()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        once()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)

    import torch
    from torch.nn.attention import SDPBackend

    from training.model.build import SHAPES

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    shape = SHAPES[args.shape]
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim = shape["hidden_size"] // heads
    dev = torch.device("cuda")
    torch.manual_seed(0)
    q = torch.randn(args.batch, heads, args.seq_len, head_dim, device=dev, dtype=torch.bfloat16)
    k = torch.randn(args.batch, kv_heads, args.seq_len, head_dim, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q.requires_grad_()
    flops = attention_flops(args.batch, heads, args.seq_len, head_dim)
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                      "q": list(q.shape), "kv": list(k.shape)}), flush=True)  # fmt: skip
    backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    for backend in backends:
        for gqa in (True, False):
            row: dict[str, Any] = {"backend": backend.name, "enable_gqa": gqa}
            try:
                ms = time_backend(backend, q, k, v, gqa=gqa, iters=args.iters)
                row.update(ms=ms, tflops=flops / (ms / 1e3) / 1e12)
            except RuntimeError as exc:
                row["refused"] = " ".join(str(exc).split())[:200]
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

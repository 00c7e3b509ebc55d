"""Liger's fused linear cross-entropy with its lm_head weight gradient summed in bf16 (the loop's
setting today, `accum_dtype=None`) against fp32 (`accum_dtype=torch.float32`), both measured
against an fp32 reference, at the loop's chunk sizes.

    python bench/liger_accum.py [--shapes qwen2.5-1.5b,qwen2.5-7b] [--points 16x2048:4096,1x2048:512]
                                [--repeats 5]

A point is MICROxSEQ:CHUNK_TOKENS: the tokens of one micro-batch and the loss chunk the loop would
give them (training/sizing/loss_chunks.py: 4,096 tokens on GPUs of 40 GB or more, 512 below; 0 is Liger's
own chunks). Per shape (vocab and hidden size from the catalogue) and point, on the GPU:

- hidden states [tokens, hidden] in bf16 (unit scale, as after the final RMSNorm), the lm_head
  weight [vocab, hidden] in bf16 (std 0.02), labels uniform over the vocabulary with half the
  positions ignored (-100, as chat data's prompts are), and the step's divisor as the loop passes
  it (`num_items_in_batch`: the target count, reduction "sum");
- the reference: the same bf16 values in fp32, logits and cross-entropy in fp32 (torch), and its
  gradients of the weight and of the hidden states;
- Liger with `accum_dtype` None and float32, through `LigerForCausalLMLoss` (what the patched
  model's forward calls) with the loop's `chunk_mem_const`.

For each it prints one JSON line: the relative error ||g - g_ref|| / ||g_ref|| of the weight and
input gradients, the floor (the reference rounded once to bf16: what any bf16 gradient carries),
the loss's absolute difference, the median time of a forward and backward over --repeats (the host
waits for the GPU before each clock read) and the peak memory above the inputs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from training.model.shapes import SHAPES  # noqa: E402
from training.sizing.loss_chunks import chunk_mem_const, chunk_tokens  # noqa: E402


def parse_point(text: str) -> tuple[int, int, int]:
    """MICROxSEQ:CHUNK_TOKENS -> (micro, seq, chunk tokens)."""
    tokens, _, chunk = text.partition(":")
    micro, _, seq = tokens.partition("x")
    if not (micro.isdigit() and seq.isdigit() and chunk.isdigit()) or int(micro) < 1 or int(seq) < 1:
        raise argparse.ArgumentTypeError(f"point {text!r}: MICROxSEQ:CHUNK_TOKENS, e.g. 16x2048:4096")
    return int(micro), int(seq), int(chunk)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="qwen2.5-1.5b,qwen2.5-7b")
    p.add_argument("--points", default="16x2048:4096,1x2048:512,1x2048:0")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    return p


def _rel(got: Any, ref: Any) -> float:
    return float((got.float() - ref).norm() / ref.norm())


def measure(shape: str, point: tuple[int, int, int], *, repeats: int, seed: int) -> list[dict[str, Any]]:
    import torch
    from liger_kernel.transformers.model.loss_utils import LigerForCausalLMLoss

    micro, seq, chunk = point
    cfg = SHAPES[shape]
    vocab, hidden = int(cfg["vocab_size"]), int(cfg["hidden_size"])
    n = micro * seq
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    h = torch.randn(n, hidden, device=dev, generator=gen).to(torch.bfloat16)
    w = (torch.randn(vocab, hidden, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (1, n), device=dev, generator=gen)
    labels[torch.rand(1, n, device=dev, generator=gen) < 0.5] = -100
    targets = int((labels[..., 1:] != -100).sum())
    mem_const = chunk_mem_const(n, vocab, hidden, chunk)

    # The reference: fp32 logits, loss and gradients of the same (bf16-valued) inputs.
    h32, w32 = h.float().requires_grad_(), w.float().requires_grad_()
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].reshape(-1)
    logits = h32 @ w32.t()
    ref_loss = torch.nn.functional.cross_entropy(logits, shifted, reduction="sum") / targets
    ref_loss.backward()
    assert h32.grad is not None and w32.grad is not None
    ref_gw, ref_gh, ref = w32.grad.detach(), h32.grad.detach(), float(ref_loss)
    floor_w, floor_h = _rel(ref_gw.to(torch.bfloat16), ref_gw), _rel(ref_gh.to(torch.bfloat16), ref_gh)
    del h32, w32, logits, ref_loss
    torch.cuda.empty_cache()

    rows: list[dict[str, Any]] = []
    for accum in (None, torch.float32):
        hh, ww = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()

        def run(hh: Any, ww: Any, accum: Any) -> Any:
            hh.grad = ww.grad = None
            loss = LigerForCausalLMLoss(
                hh,
                ww,
                labels,
                hidden,
                num_items_in_batch=targets,
                accum_dtype=accum,
                chunk_mem_const=mem_const,
            )
            loss.backward()
            return loss

        loss = run(hh, ww, accum)  # first call: Triton compiles its kernels
        hh.grad = ww.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        times = []
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = run(hh, ww, accum)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        peak = torch.cuda.max_memory_allocated() - base
        assert hh.grad is not None and ww.grad is not None
        rows.append(
            {
                "shape": shape,
                "tokens": f"{micro}x{seq}",
                "chunk_tokens_asked": chunk,
                "chunk_tokens": chunk_tokens(n, vocab, hidden, mem_const),
                "accum_dtype": "fp32" if accum is not None else "bf16 (None)",
                "rel_err_grad_weight": _rel(ww.grad, ref_gw),
                "rel_err_grad_input": _rel(hh.grad, ref_gh),
                "floor_grad_weight": floor_w,
                "floor_grad_input": floor_h,
                "loss_abs_diff": abs(float(loss) - ref),
                "ms_median": 1000 * statistics.median(times),
                "peak_gib_above_inputs": peak / 2**30,
            }
        )
        del hh, ww
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> None:
    p = build_parser()
    args = p.parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        p.error(f"--shapes: {', '.join(unknown)} not among {', '.join(sorted(SHAPES))}")
    try:
        points = [parse_point(t) for t in args.points.split(",")]
    except argparse.ArgumentTypeError as e:
        p.error(f"--points: {e}")
    if args.repeats < 1:
        p.error("--repeats: must be at least 1")
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (Liger's kernels are Triton)")
    for shape in shapes:
        for micro, seq, chunk in points:
            for row in measure(shape, (micro, seq, chunk), repeats=args.repeats, seed=args.seed):
                rounded = {k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()}
                print(json.dumps(rounded), flush=True)


if __name__ == "__main__":
    main()

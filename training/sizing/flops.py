"""FLOPs per token and MFU.

FLOPs per token follow the PaLM appendix-B estimate (Chowdhery et al., 2022, "Model FLOPs
utilization": 6N + 12·L·H·Q·T): 6·N for the dense matmuls (forward + backward) plus 12·L·H·Q·T for
attention scores and values, where N counts every parameter once (tied embeddings once), L is the
number of layers, H the attention heads, Q the head dimension and T the sequence length. H·Q is the
hidden size d for Qwen2 and Llama 3.1 shapes, not for Qwen3 or Gemma (head_dim x heads != d).

LoRA: `lora_flops_per_token` (4 x the base's matmul weights + 6 x the adapters + attention).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from training.model.lora_spec import LoraSpec
    from training.sizing.memory_plan import Dims

# Dense (no 2:4 sparsity) bf16 Tensor Core peak, TFLOP/s per GPU, from NVIDIA's data sheets:
#   H100 SXM / H200 SXM: 989 (H100 and H200 Tensor Core GPU data sheets, "BF16 Tensor Core 1,979*",
#     * = with sparsity, so 989.5 dense); H100 PCIe / NVL: 756 (H100 data sheet, PCIe column 1,513*).
#   A100 (SXM and PCIe): 312 (A100 data sheet, "BF16 Tensor Core 312 | 624*").
#   L40S: 362 (L40S data sheet, "BF16 Tensor Core 362.05 | 733*").
#   L4: 121 (L4 data sheet, "BF16 Tensor Core 242*", * with sparsity).
#   A10: 125 (A10 data sheet, "BF16 Tensor Core 125 | 250*"). The A10G in g5 instances is a variant with
#     no separate NVIDIA data sheet; it is left out rather than guessed: pass --peak-tflops to get MFU on it.
# Names are matched as substrings of torch.cuda.get_device_name(), most specific first.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989.0),
    ("H100 PCIE", 756.0),
    ("H100 NVL", 835.0),  # H100 NVL data sheet: 1,671* with sparsity
    ("H100", 989.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10G", 0.0),  # unknown on purpose, see above
    ("A10", 125.0),
)


def peak_tflops(device_name: str) -> float | None:
    """Peak dense bf16 TFLOP/s for a GPU name, or None when it is not in the table."""
    upper = device_name.upper()
    for key, value in PEAK_BF16_TFLOPS:
        if key in upper:
            return value or None
    return None


def count_params(model: Any) -> int:
    """Parameters counted once each (a tied lm_head shares the embedding's tensor)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def flops_per_token(n_params: int, n_layers: int, attn_dim: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N + 12·L·(H·Q)·T, `attn_dim` = heads x head_dim."""
    return 6.0 * n_params + 12.0 * n_layers * attn_dim * seq_len


def mfu(tokens_per_s: float, flops_tok: float, n_gpus: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None when the peak is unknown (CPU, unlisted GPU)."""
    if not peak or n_gpus <= 0:
        return None
    return tokens_per_s * flops_tok / (peak * 1e12 * n_gpus)


def lora_flops_per_token(dims: Dims, lora: LoraSpec, seq_len: int) -> float:
    """Training FLOPs per token of LoRA, counted as the GPU runs them (not 6N).

    The frozen base's matmuls run forward (2 per weight) and backward for their input's gradient
    only (2 per weight; no weight gradient): 4 x (the decoder layers' linear weights + lm_head's
    V x d, tied or not: the embedding itself is a lookup). The adapters A and B train like any
    weight: 6 per parameter. Attention's scores and values: 12 L T (heads x head_dim), forward
    and backward, as in `flops_per_token` (not halved for the causal mask). Norms, biases and
    the rotary embedding are left out (under 0.1 %)."""
    shapes = dims.linear_shapes()
    base = dims.layers * sum(i * o for i, o in shapes.values()) + dims.vocab * dims.hidden
    adapters = dims.layers * lora.params_per_layer(shapes)
    attention_width = shapes["o_proj"][0]  # heads x head_dim
    return 4.0 * base + 6.0 * adapters + 12.0 * dims.layers * attention_width * seq_len

"""When the job trains with float8 linears, without torch: the loop decides per worker from its
GPU, and synthesis (config/settings) decides the same for the RayJob from the node type."""

from __future__ import annotations

FLOAT8_MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (L4, L40S) and Hopper onwards

# The smallest micro-batch (tokens per forward pass) at which float8 was measured faster than bf16:
# 8 x 2048 on an H200, 312 against 350 ms per step (16 x 2048: 543 against 633 ms; with the loop's
# later defaults 289.6 against 322.8 ms at 8 x 2048, BENCHMARKS.md). Its per-tensor
# scaling kernels cost about the same at any size while the GEMMs shrink with the micro-batch, and
# smaller ones (the L4 environments' 1 x 2048) were not measured: those stay bf16 unless asked.
FLOAT8_MIN_TOKENS = 16_384


def float8_by_default(
    capability: tuple[int, int] | None, *, compiled: bool, torchao: bool, tokens: int
) -> bool:
    """--float8 unset: on for compiled GPU workers with FP8 tensor cores where torchao is installed,
    at micro-batches of at least FLOAT8_MIN_TOKENS tokens (1.54x the original recipe on an H200,
    loss within bf16's spread: BENCHMARKS.md). Eager layers would run float8's scaling as separate
    kernels, so they stay bf16 unless asked."""
    has_fp8 = capability is not None and capability >= FLOAT8_MIN_CAPABILITY
    return has_fp8 and compiled and torchao and tokens >= FLOAT8_MIN_TOKENS

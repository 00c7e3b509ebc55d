"""How many tokens Liger's fused linear cross-entropy computes at once, without torch.

Liger (liger_kernel/ops/fused_linear_cross_entropy.py) splits a micro-batch's tokens into chunks
so the [chunk, vocab] logits stay about as large as the [tokens, hidden] input:
chunk = next_pow2(ceil(tokens / ceil(vocab / (C x hidden)))) with C = chunk_mem_const (1 by
default), so Qwen2.5-1.5B (vocab 151,936, hidden 1,536) always runs about 64 chunks: 32 tokens
each at 1 x 2048. Every chunk reads the whole lm_head weight twice and reads and writes its
gradient (4 x vocab x hidden x 2 B = 1.87 GB): at 1 x 2048 on an H200 the loss took 41 ms of GPU
time per micro-batch, the decoder layers' 28 forwards and backwards 33 ms (profile in
BENCHMARKS.md), and on an L4 (300 GB/s) the weight traffic alone would be ~0.4 s per micro-batch.
Chunks of LOSS_CHUNK_TOKENS (the loop's default on GPUs of 40 GB or more) make that traffic
small next to the chunk's GEMMs (one pass over the weight per 4,096 tokens: 1.87 GB against
5.7 TFLOP) for 2 B x 4,096 x vocab of logits (1.16 GiB), freed before the backward. Measured on an
H200 (BENCHMARKS.md, 2026-12-02): 1 x 2048 x 2 steps 311 against ~400 ms, 16 x 2048 float8 532
against 544 ms, at the same peak memory. Smaller GPUs default to 512-token chunks (below);
`--loss-chunk-tokens 0` keeps Liger's own chunks.

The chunks' shares of the lm_head gradient are summed in the weight's dtype (bf16; Liger's
`accum_dtype` left None): summing in fp32 measured no more accurate at the L4's 512-token chunks and
a tenth less error at the H200's 4,096 for 0.4-1.9 GiB more (bench/liger_accum.py, BENCHMARKS.md).
"""

from __future__ import annotations

import math

LOSS_CHUNK_TOKENS = 4096
# GPUs with less memory than LARGE_GPU_GIB (the L4's 24 GB, the A10G's) get SMALL_GPU_CHUNK_TOKENS: the
# 2 B x chunk x vocab logits block sits on top of the loss's peak (0.58 GiB at 2,048 tokens, 1.16 at
# 4,096), which the L4 jobs cannot spare (the memory plan's margin); 512 tokens cost 0.15 GiB and cut
# the L4's lm_head traffic from 64 to 4 passes per 1 x 2048 micro-batch (training/sizing/step_time.py).
LARGE_GPU_GIB = 40.0
SMALL_GPU_CHUNK_TOKENS = 512


def default_chunk_tokens(gpu_memory_gib: float) -> int:
    """--loss-chunk-tokens unset: the chunk for a GPU with this much memory (the loop reads its own
    device's; synthesis and `raytrain plan` the node type's from the catalogue)."""
    return LOSS_CHUNK_TOKENS if gpu_memory_gib >= LARGE_GPU_GIB else SMALL_GPU_CHUNK_TOKENS


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def chunk_mem_const(tokens: int, vocab: int, hidden: int, chunk_tokens: int = LOSS_CHUNK_TOKENS) -> int:
    """Liger's `chunk_mem_const` that gives chunks of at least min(tokens, chunk_tokens) tokens
    (0: Liger's own default, 1)."""
    if chunk_tokens <= 0:
        return 1
    chunks = math.ceil(tokens / min(tokens, _next_pow2(chunk_tokens)))
    # inc_factor = ceil(vocab / (C x hidden)) must not exceed `chunks`.
    return max(1, math.ceil(vocab / (hidden * chunks)))


def chunk_tokens(tokens: int, vocab: int, hidden: int, mem_const: int = 1) -> int:
    """The chunk Liger computes for this input (its formula, as above)."""
    inc_factor = math.ceil(vocab / (mem_const * hidden))
    return min(tokens, _next_pow2(math.ceil(tokens / inc_factor)))

"""Will it fit? The GPU memory of one training rank, from the job's settings, without torch.

Pure Python on purpose: synthesis (config/settings) imports it to refuse a job that would not fit
its node group's GPU, and `raytrain plan` prints it. The model follows what `python -m training`
does on a GPU (training/model/build.py, training/run/trainer.py); every term below says where its size comes
from. Sizes are bytes of one rank; N counts parameters once (a tied lm_head shares the embedding).

Sharding: FSDP2 shards every parameter over the shard group: all ranks (`full`), or the GPUs of a
node (`hsdp`, and `auto` with more than one node of several GPUs each), so S = world or GPUs per
node.

Persistent between steps (on every rank, sharded 1/S):
  master weights   4 N / S    fp32 (MixedPrecisionPolicy keeps the sharded parameters in fp32)
  AdamW state      8 N / S    exp_avg and exp_avg_sq, both in the parameter's dtype (fp32)
Built during a step:
  gradients        4 N / S    fp32 (reduce_dtype=float32), reduce-scattered layer by layer in
                              the backward of the step's last micro-batch, freed by zero_grad
  accumulated      4 N        with gradient accumulation (more than one micro-batch per step) the
                              loop turns gradient sync off for all but the last micro-batch
                              (set_requires_gradient_sync(False)); FSDP2 then keeps every layer's
                              *unsharded* gradient, upcast to reduce_dtype, until the last backward
                              reduce-scatters it (torch/distributed/fsdp/_fully_shard/
                              _fsdp_param.py: to_accumulated_grad_if_needed,
                              _fsdp_param_group.py: post_backward). It is not sharded: 4 N bytes.
  gathered params  2 N_root + 2 x 2 N_layer   bf16 copies all-gathered for compute (param_dtype
                              bf16): the root unit (embedding = tied lm_head, final norm) stays
                              gathered from forward to backward (the root does not reshard after
                              forward: _fsdp_state.py), and a layer plus the prefetched next one
  activations      per micro-batch: tokens x layers x (bf16 elements a layer saves per token) x 2,
                   see SAVED_PER_TOKEN; with activation checkpointing only each layer's input is
                   kept, and one layer's activations are rebuilt at a time in the backward
  loss             Liger's fused linear cross-entropy computes the loss and its gradients in the
                   forward, chunk by chunk, so the [tokens, vocab] logits never exist: it keeps
                   grad_input [tokens, d] and grad_weight [vocab, d] (both bf16, the dtype of its
                   inputs) for the backward, and one [chunk, vocab] logits block at a time with
                   chunk = next_pow2(ceil(tokens / ceil(vocab / d))) by Liger's default, or
                   --loss-chunk-tokens' (training/sizing/loss_chunks.py; liger_kernel/ops/
                   fused_linear_cross_entropy.py). The block lives only inside the loss's forward
                   (the "loss" moment, before the backward's working set exists). Without Liger,
                   Hugging Face's loss upcasts the full logits to fp32 and log_softmax saves an
                   fp32 copy: 12 bytes per token x vocab at the start of the backward (bf16
                   logits 2 + fp32 4 + saved log-probabilities 4, then the fp32 gradient 4 while
                   the bf16 logits are gone)
Outside torch's allocator (what `torch.cuda.max_memory_allocated` does not see):
  allocator slack  the caching allocator reserves more than is allocated (block rounding and
                   fragmentation): ALLOCATOR_SLACK of the allocated peak, as measured
                   (ALLOCATOR_SLACK_LORA for LoRA, whose pool fragments far less)
  CUDA context     CUDA_CONTEXT_GIB: the context, cuBLAS/cuDNN kernels and workspaces, measured
  NCCL             NCCL_GIB per communicator the rank holds (world, and HSDP's shard and
                   replicate groups)

The peak is the largest of three moments of the step (each term above lives in some of them):
  backward start   after the last micro-batch's forward: persistent + accumulated + all
                   activations + loss + gathered params + one layer's backward working set
  backward end     all sharded gradients + the root unit's fp32 reduce-scatter input (the root
                   is reduced last)
  optimizer step   persistent + gradients (fused AdamW and the foreach norm need no full copy)
On one GPU at micro-batch 8 the first wins; at micro-batch 1, or with activation checkpointing, the
backward's end can (gradients grow by 4/S bytes per parameter while activations shrink).

Calibration: tests/test_memory_plan.py pins the measured peaks (H200, BENCHMARKS.md and the
`bench/memory_peaks.py` runs) and checks this model within 10 % of each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from training.model.dims import Dims
from training.model.lora_spec import LoraSpec
from training.sizing.loss_chunks import LOSS_CHUNK_TOKENS, chunk_mem_const, chunk_tokens

GIB = 2**30

# Bytes per element.
FP32, BF16 = 4, 2

# What CUDA/torch hold beyond the allocated bytes, from bench/memory_peaks.py on H200s
# (tests/fixtures/memory_peaks_h200.jsonl, BENCHMARKS.md):
# - the caching allocator reserved 10-41 % more than it allocated at its peak (one rank: micro-batch
#   1: 28.18 against 23.94 GiB, 4: 36.76 / 29.37, 8: 48.56 / 40.44, 16: 71.15 / 62.60; activation
#   checkpointing 9-15 %; two ranks: micro-batch 1: 17.99 / 12.77, the outlier, 8: 38.04 / 31.94).
#   Cached blocks that are free are not lost: on a failed cudaMalloc the allocator releases them and
#   retries before raising OOM (c10/cuda/CUDACachingAllocator.cpp, release_cached_blocks), so the
#   slack is a margin for fragmentation, not memory the rank must have; 26 % covers every one-rank
#   point and keeps the plan within a quarter of what the process used at micro-batch 16
# - one rank used 0.82 GiB of the device beyond what the allocator reserved at every point (CUDA
#   context, kernels, cuBLAS/cuDNN workspaces, a one-rank NCCL communicator)
ALLOCATOR_SLACK = 0.26
# LoRA: the allocator reserved 1.8-6.9 % more than it allocated at eight LoRA points on one H200
# (Qwen2.5-1.5B at 2048 tokens, micro-batch 1 / 4 / 16 and 8 checkpointed; Qwen2.5-7B at 4096, 1 /
# 4 / 8 and 4 checkpointed: BENCHMARKS.md "The allocator's slack under LoRA"). A full fine-tune's
# fp32 gradients are allocated layer by layer among the activations being freed, which leaves holes;
# LoRA's gradients are the adapters' few MB, so the pool holds activations and same-sized gathered
# layers that reuse each other's blocks. 15 % of the planned peak covers every LoRA point's reserved
# bytes, the plan's own shortfall included (at most 13.1 %, the checkpointed 1.5B point).
ALLOCATOR_SLACK_LORA = 0.15
CUDA_CONTEXT_GIB = 0.82
# Each NCCL communicator with peers: its buffers grow with the channels NCCL opens (buffer size x
# protocols x peers x channels). Two ranks on one H200 host (NVLink, NCCL 2.28, many channels) used
# 0.75 GiB more beyond the reserved bytes than one rank did (1.57 against 0.82 GiB at every point);
# the plan serves the L4s of g6 (PCIe, a few channels), where it is an estimate, not measured.
NCCL_GIB = 0.15

# `--micro-batch-size auto` / `job.micro_batch_size: auto` keep this share of the GPU free: the plan is
# checked within 10 % of every measured peak (tests/test_memory_plan.py), so a choice that needs more
# than 90 % of the GPU could be one the GPU does not have. An explicit micro-batch is held only to the
# plan itself.
AUTO_HEADROOM = 0.10

# How many all-gathered layers are alive at once: the one computing and the prefetched next one.
GATHERED_LAYERS = 2


def saved_per_token(dims: Dims, *, compile: bool, liger_layers: bool) -> int:
    """bf16 elements one decoder layer saves for its backward, per token (no checkpointing).

    compiled (inductor, SwiGLU product recomputed: training.model.build.recompute_materialized_pointwise):
        layer input x (the norms are recomputed from it), q, k, v after RoPE (SDPA), the attention
        output (SDPA and o_proj), the residual after attention, gate and up: 4d + 2kv + 2ffn
        (16 d for Qwen2.5-1.5B, as counted on a compiled layer: BENCHMARKS.md)
    Liger's layer kernels (eager, or compiled: dynamo runs Liger's Triton kernels as opaque calls,
        BENCHMARKS.md, so nothing around them is recomputed): RMSNorm saves its input, SwiGLU
        recomputes silu but down_proj saves the product: x, norm1 out, q, attention out, h,
        norm2 out = 6d, + 2kv, + gate, up, product = 3 ffn
    eager, Hugging Face layers: each RMSNorm saves its fp32 upcast input (2d) and the bf16
        normalised value (d) besides its output (d); SiLU saves gate, the product saves silu(gate)
        and up, down_proj the product: 2 x 4d + q, attention out (2d) + 2kv + 4 ffn
    Each also keeps small fp32 statistics: attention's log-sum-exp per head (2 x heads in bf16
    units) and each norm's reciprocal RMS (2 per norm). The rotary cos/sin tables are computed once
    per forward and shared by the layers (counted with the root, not here).
    Queries and the attention output are heads x head_dim wide (q), which is d for the Qwen2 and
    Llama 3.1 shapes and not for Qwen3 or Gemma. Beyond the Qwen2 layout (the one measured):
    Gemma's post-attention and post-feedforward norms keep their inputs (+2 d; eager, each norm's
    4 d), and Qwen3/Gemma 3's q/k norms their inputs (+q +kv; eager 4 (q + kv)): counted from the
    layers' structure, not measured.
    """
    d, kv, q, ffn = dims.hidden, dims.kv_dim, dims.q_dim, dims.ffn
    stats = 2 * dims.heads + 2 * dims.layer_norms
    extra_norms = dims.layer_norms - 2
    if liger_layers:
        base = 4 * d + 2 * q + 2 * kv + 3 * ffn
    elif compile:
        base = 2 * d + 2 * q + 2 * kv + 2 * ffn
    else:
        base = 8 * d + 2 * q + 2 * kv + 4 * ffn
    eager = not (liger_layers or compile)
    extras = extra_norms * d * (4 if eager else 1) + dims.qk_norm * (q + kv) * (4 if eager else 1)
    return base + extras + stats


def eager_attention_per_token(dims: Dims, seq_len: int) -> int:
    """bf16 elements per token a layer with eager attention (a soft-capped model: Gemma 2) saves
    besides `saved_per_token`: each head's row of attention probabilities over the block, kept for the
    product with V (bf16, 1) and for softmax's backward (its fp32 output, 2), where SDPA keeps only a
    log-sum-exp per head (transformers models/gemma2/modeling_gemma2.py eager_attention_forward:
    `softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)`). Counted from the code,
    not measured; compiled layers may recompute part of it, so it is an upper bound there."""
    return 3 * dims.heads * seq_len if dims.attn_softcap else 0


def lora_saved_per_token(dims: Dims, lora: LoraSpec) -> int:
    """bf16 elements LoRA's adapters add to what a decoder layer saves, per token: each adapter's
    low-rank intermediate A x (r, for B's weight gradient); with dropout, each target's dropped-out
    input (in_features, for A's weight gradient; peft applies a separate nn.Dropout per target) and
    its keep mask (1 byte per element: half a bf16 unit). The layer input each adapter reads is the
    base linear's, already counted by saved_per_token."""
    shapes = dims.linear_shapes()
    extra = len(lora.targets) * lora.rank
    if lora.dropout > 0:
        extra += sum(shapes[t][0] * 3 // 2 for t in lora.targets)
    return extra


def backward_working_per_token(dims: Dims) -> int:
    """bf16 elements per token a layer's backward allocates besides what it saved: the gradients
    of the MLP's [tokens, ffn] intermediates (gate, up and the recomputed product)."""
    return 3 * dims.ffn


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    formula: str

    @property
    def gib(self) -> float:
        return self.bytes / GIB


@dataclass(frozen=True)
class JobMemory:
    """One rank's plan: `moments` holds the terms of each moment; the peak is the largest."""

    moments: dict[str, list[Term]]
    overhead: list[Term]
    inputs: dict[str, Any] = field(default_factory=dict)

    def moment_bytes(self, name: str) -> int:
        return sum(t.bytes for t in self.moments[name])

    @property
    def peak_moment(self) -> str:
        return max(self.moments, key=self.moment_bytes)

    @property
    def peak_terms(self) -> list[Term]:
        return self.moments[self.peak_moment]

    @property
    def allocated_bytes(self) -> int:
        """What torch.cuda.max_memory_allocated would report."""
        return self.moment_bytes(self.peak_moment)

    @property
    def device_bytes(self) -> int:
        """What the rank needs of the GPU: the allocated peak plus slack, context and NCCL."""
        return self.allocated_bytes + sum(t.bytes for t in self.overhead)

    def fits(self, capacity_bytes: int) -> bool:
        return self.device_bytes <= capacity_bytes


def plan(
    shape: str | Dims,
    *,
    seq_len: int,
    micro_batch: int,
    accum: int = 1,
    shard: int = 1,
    communicators: int = 1,
    compile: bool = True,
    activation_checkpointing: bool = False,
    liger: bool = True,
    liger_layers: bool | None = None,
    float8: bool = False,
    reshard_after_forward: bool = True,
    master_bf16: bool = False,
    loss_chunk_tokens: int = LOSS_CHUNK_TOKENS,
    lora: LoraSpec | None = None,
) -> JobMemory:
    """The memory of one rank of `python -m training` with these options.

    `shard` is S, the ranks a parameter is sharded over; `accum` the micro-batches per optimizer
    step; `communicators` the NCCL communicators with peers the rank holds (0 for a single rank,
    1 for the world; HSDP adds the shard and the replicate group). `liger_layers` defaults as in
    the loop: only when the layers are not compiled. `float8` (torchao float8 linears, tensorwise
    scales, all-gather in bf16) changes no term: the layers keep what the compiled bf16 layers keep
    (62.4 GiB against 62.6 GiB at micro-batch 16 on an H200, BENCHMARKS.md).
    `reshard_after_forward=False` keeps every layer's all-gathered bf16 parameters from its
    forward to its backward: 2 B x the layers' parameters, unsharded, at the backward's start.
    `loss_chunk_tokens` is the loop's --loss-chunk-tokens (0: Liger's own ~64 chunks).
    `master_bf16` models the AWS sample's original recipe (the whole model, its gradients and
    AdamW state in bf16), for comparison.
    """
    dims = shape if isinstance(shape, Dims) else Dims.of(shape)
    for name, value in (("seq_len", seq_len), ("micro_batch", micro_batch), ("accum", accum)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if shard < 1:
        raise ValueError(f"shard must be >= 1, got {shard}")
    if liger_layers is None:
        liger_layers = liger and not compile
    n_layer, n_root = dims.layer_params, dims.root_params
    d, v, L = dims.hidden, dims.vocab, dims.layers
    tokens = micro_batch * seq_len
    master = BF16 if master_bf16 else FP32

    weights, adam, grads, trained, n_adapter_layer = _persistent(dims, lora, shard, master)
    # FSDP2 upcasts the kept unsharded gradient to reduce_dtype only when it differs from the
    # parameter's dtype: fp32 with mixed precision, bf16 for an all-bf16 model.
    accumulated = (
        [
            Term(
                "accumulated gradients (unsharded)",
                master * trained,
                f"{master} B x N_trained, accum={accum}",
            )
        ]
        if accum > 1
        else []
    )
    held = GATHERED_LAYERS if reshard_after_forward else L
    gathered = Term(
        "all-gathered bf16 params",
        BF16 * (n_root + held * (n_layer + n_adapter_layer)),
        f"2 B x (root {n_root / 1e6:.0f} M + {held} layers x {(n_layer + n_adapter_layer) / 1e6:.1f} M)",
    )
    per_token = saved_per_token(dims, compile=compile, liger_layers=liger_layers)
    per_token += eager_attention_per_token(dims, seq_len)
    if lora is not None:
        per_token += lora_saved_per_token(dims, lora)
    if activation_checkpointing:
        acts = [
            Term("checkpointed layer inputs", BF16 * tokens * d * L, f"2 B x {tokens} tokens x d x {L}"),
            Term(
                "one layer recomputed",
                BF16 * tokens * per_token,
                f"2 B x {tokens} tokens x {per_token / d:.1f} d",
            ),
        ]
        # Measured: at a checkpointed step's backward peak nine [tokens, ffn] bf16 tensors were
        # alive (torch.cuda.memory._record_memory_history over one LoRA step, 7B 4 x 4096 and 1.5B
        # 8 x 2048, BENCHMARKS.md), three more than the recomputed layer's saved MLP intermediates
        # and its backward's working set count. Alive in the backward only.
        recompute = [
            Term("recomputed MLP intermediates", BF16 * tokens * 3 * dims.ffn, "2 B x tokens x 3 ffn")
        ]
    else:
        recompute = []
        acts = [
            Term(
                "activations",
                BF16 * tokens * per_token * L,
                f"2 B x {tokens} tokens x {per_token / d:.1f} d x {L} layers",
            )
        ]
    # Outside the layers: the final norm (not compiled: Hugging Face's saves its fp32 input and
    # the bf16 normalised value, 3 d in bf16 units; Liger's its input, d) and the rotary cos/sin
    # tables all layers share (2 x head_dim).
    norm_units = 1 if liger_layers else 3
    rotary = 2 * dims.head_dim
    acts.append(
        Term(
            "final norm, rotary tables",
            BF16 * tokens * (d * norm_units + rotary),
            f"2 B x tokens x ({norm_units} d + 2 head_dim)",
        )
    )
    working = Term(
        "one layer's backward",
        BF16 * tokens * backward_working_per_token(dims),
        "2 B x tokens x 3 ffn",
    )
    if liger and lora is not None:
        # A frozen lm_head gets no weight gradient: Liger allocates grad_weight only for a weight
        # that requires grad (liger_kernel/ops/fused_linear_cross_entropy.py).
        chunk = chunk_tokens(tokens, v, d, chunk_mem_const(tokens, v, d, loss_chunk_tokens))
        loss = [Term("loss: grad_input", BF16 * tokens * d, "2 B x tokens x d (frozen lm_head)")]
        logits = [Term("loss: logits chunk", BF16 * chunk * v, f"2 B x {chunk} x V (Liger chunk)")]
    elif liger:
        chunk = chunk_tokens(tokens, v, d, chunk_mem_const(tokens, v, d, loss_chunk_tokens))
        loss = [
            Term("loss: grad_input + grad_weight", BF16 * (tokens * d + v * d), "2 B x (tokens x d + V x d)")
        ]
        # Alive only inside the loss's forward (Liger computes the gradients there, chunk by chunk).
        logits = [Term("loss: logits chunk", BF16 * chunk * v, f"2 B x {chunk} x V (Liger chunk)")]
    else:
        loss = [Term("loss: full logits", 12 * tokens * v, f"12 B x {tokens} tokens x V={v}")]
        logits = []

    # The root unit is reduced last: the reduce-scatter's fp32 input (a copy of its unsharded
    # gradient, foreach_reduce in _fsdp_collectives.py) is alive next to all the sharded gradients
    # (on one H200 at micro-batch 1: 23.94 GiB in the backward against 23.07 at the optimizer step,
    # 4 B x N_root = 0.87 GiB apart).
    # With LoRA the root (embedding, lm_head, final norm) is frozen: nothing to reduce.
    root_reduce = [Term("root reduce-scatter input", FP32 * n_root, "4 B x N_root")] if lora is None else []
    moments = {
        "loss": [weights, adam, *accumulated, *acts, *loss, *logits, gathered],
        "backward start": [weights, adam, *accumulated, *acts, *loss, gathered, working, *recompute],
        "backward end": [weights, adam, grads, *root_reduce],
        "optimizer step": [weights, adam, grads],
    }
    allocated = max(sum(t.bytes for t in terms) for terms in moments.values())
    slack = ALLOCATOR_SLACK if lora is None else ALLOCATOR_SLACK_LORA
    overhead = [
        Term("allocator slack", int(slack * allocated), f"{slack:.0%} of allocated"),
        Term("CUDA context", int(CUDA_CONTEXT_GIB * GIB), "context, kernels, cuBLAS/cuDNN workspaces"),
        Term(
            "NCCL",
            int(NCCL_GIB * GIB * communicators),
            f"{communicators} communicator(s) x {NCCL_GIB} GiB",
        ),
    ]
    inputs = dict(
        seq_len=seq_len,
        micro_batch=micro_batch,
        accum=accum,
        shard=shard,
        compile=compile,
        activation_checkpointing=activation_checkpointing,
        liger=liger,
        liger_layers=liger_layers,
        float8=float8,
        reshard_after_forward=reshard_after_forward,
        master_bf16=master_bf16,
        loss_chunk_tokens=loss_chunk_tokens,
        lora=lora,
    )
    return JobMemory(moments=moments, overhead=overhead, inputs=inputs)


def _persistent(
    dims: Dims, lora: LoraSpec | None, shard: int, master: int
) -> tuple[Term, Term, Term, int, int]:
    """Weights, AdamW state and sharded gradients of one rank, the trained parameters' count and
    the adapters' parameters per layer (0 without LoRA)."""
    n = dims.params
    gib = f"{n / 1e9:.3f} B params"
    if lora is None:
        weights = Term("master weights", master * n // shard, f"{master} B x N / S ({gib}, S={shard})")
        adam = Term("AdamW state", 2 * master * n // shard, f"2 x {master} B x N / S")
        grads = Term("gradients (sharded)", master * n // shard, f"{master} B x N / S")
        trained, n_adapter_layer = n, 0
    else:
        # LoRA: the base is frozen and stored in bf16 (no master copy, no optimizer state, no
        # gradients); the adapters A and B train as a full fine-tune does (fp32 master, AdamW,
        # fp32 gradients), sharded with their layer.
        n_adapter_layer = lora.params_per_layer(dims.linear_shapes())
        trained = dims.layers * n_adapter_layer
        na = f"{trained / 1e6:.1f} M adapter params, r={lora.rank}"
        weights = Term(
            "frozen bf16 base + fp32 adapters",
            (BF16 * n + FP32 * trained) // shard,
            f"(2 B x N + 4 B x N_lora) / S ({gib}, {na}, S={shard})",
        )
        adam = Term("AdamW state (adapters)", 2 * FP32 * trained // shard, "2 x 4 B x N_lora / S")
        grads = Term("gradients (adapters, sharded)", FP32 * trained // shard, "4 B x N_lora / S")
    return weights, adam, grads, trained, n_adapter_layer


def largest_micro_batch(capacity_bytes: int, *, limit: int = 1024, **kwargs: Any) -> int:
    """The largest micro-batch whose plan fits `capacity_bytes` (0: not even 1), other options as
    in `plan`. Memory grows with the micro-batch, so a bisection finds it."""
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if plan(micro_batch=mid, **kwargs).fits(capacity_bytes):
            lo = mid
        else:
            hi = mid - 1
    return lo


def divisors(n: int) -> list[int]:
    return [m for m in range(1, n + 1) if n % m == 0]


def auto_micro_batch(per_rank: int, capacity_bytes: int, options: Callable[[int], dict[str, Any]]) -> int:
    """`--micro-batch-size auto`: of the micro-batches that split a rank's `per_rank` sequences per
    step evenly, the largest whose plan leaves AUTO_HEADROOM of the GPU free; when none does, the
    largest that fits at all (fewer micro-batches can need less: accumulating keeps unsharded
    gradients), and when none fits the one that needs least (the fit check then says what would,
    from the point nearest to fitting: a 7B full fine-tune sharded over 8 L4s needs 24.7 GiB at
    4 x 1 and 56.4 at 1 x 4, the unsharded fp32 gradients). `options(m)` gives `plan`'s other
    arguments at micro-batch m (float8's default follows the micro-batch's tokens).

    Larger is faster at a fixed global batch on every point measured: fewer, larger kernels per
    token and no unsharded gradients kept between micro-batches (BENCHMARKS.md, "A larger
    micro-batch, chosen by the memory plan"); the optimizer step and the data are the same.
    Activation checkpointing is never turned on for it (a third more compute)."""
    needs = {
        m: plan(micro_batch=m, accum=per_rank // m, **options(m)).device_bytes for m in divisors(per_rank)
    }
    for budget in (capacity_bytes * (1 - AUTO_HEADROOM), capacity_bytes):
        fitting = [m for m, need in needs.items() if need <= budget]
        if fitting:
            return max(fitting)
    return min(needs, key=lambda m: (needs[m], -m))


def auto_reshard_after_forward(capacity_bytes: int, options: Mapping[str, Any]) -> bool:
    """--reshard-after-forward's default on a GPU: False (keep every layer's gathered bf16
    parameters from its forward to its backward, and across the step's micro-batches) when the plan
    with them kept still leaves AUTO_HEADROOM of the GPU free, else True. `options` are `plan`'s
    arguments at the micro-batch already chosen: the micro-batch comes first (the larger lever),
    the memory left over then buys one all-gather per layer per step instead of two per
    micro-batch (BENCHMARKS.md, "Keeping parameters gathered when the memory allows")."""
    kept = plan(**{**options, "reshard_after_forward": False})
    return kept.device_bytes > capacity_bytes * (1 - AUTO_HEADROOM)

"""How long a training step takes, from the job's settings and the hardware, without torch.

Beside the memory plan (training/sizing/memory_plan.py): synthesis-light, used by `raytrain plan`.
A step of `accum` micro-batches of `micro` sequences on one rank is three things that overlap:

GPU work (G), per micro-batch:
  tokens    T x 2048-token sequence cost: SEQ_MS_H200 on an H200 at 989 TFLOP/s (the slope between
            micro-batch 8 and 16 of the GPU-busy profile, bf16: 335 -> 621 ms busy, BENCHMARKS.md),
            scaled by the GPU's dense bf16 peak (training/sizing/flops.py), times a small-GEMM penalty
            1 + SMALL_K / u^2 with u = tokens per SM (calibrated on the H200's micro-batch 1: 108.6 ms
            busy); float8 multiplies it by FLOAT8_TOKEN_FACTOR (H200 micro-batch 16: 527 ms busy)
  loss      Liger's fused loss runs ~64 chunks whatever the micro-batch (training/sizing/loss_chunks.py);
            each reads the lm_head weight twice and reads and writes its gradient: 4 x V x d x 2 B per
            chunk, at the GPU's memory bandwidth x MEM_EFFICIENCY
 and once per step the fused AdamW: 28 B per local parameter (read p, g, m, v; write p, m, v in fp32)
  at the same bandwidth (12.7 ms for 1.54 B parameters on an H200: 3.4 TB/s, 71 % of 4.8 TB/s).
 and per FSDP all-gather its copies on the GPU (torch/distributed/fsdp/_fully_shard/
  _fsdp_collectives.py: the fp32 shard cast to bf16, copied into the collective's buffer, the
  gathered buffer split into the parameters): 10 / S + 4 B per parameter at the same bandwidth, 6.3
  ms on one H200 (session 11's profile showed ~6 + 6 ms of copies for a step's two all-gathers).
  Freed after each forward (--reshard-after-forward), two all-gathers per micro-batch; kept
  gathered, one per step. (An approximation: FSDP2 re-gathers neither the root, embedding and
  final norm, nor the last layer, kept by training/model/build.py, in the backward: 18 % of the
  parameters, so a freed micro-batch moves 1.82, not 2, times them; on one H200 ~1 ms of copies
  and host. Counted exactly, the traffic-bound two-emulated-hosts full-sharding step would be
  predicted 12 % short, outside its 10 %, instead of 8 %: part of that step's socket time is not
  modelled, and the count stays approximate until it is.)
  Kept against freed the model predicts 1.03x at float8 8 x 2048 (measured 1.01-1.04x in six
  comparisons) and 1.05x at bf16 2 x 2048 x 1, where through Ray Train two comparisons on one
  lease measured 1.03x and 1.07x and one on another 0.92x (not explained, not fitted).
Host work (H): HOST_STEP_MS + accum x HOST_MICRO_MS (Python, FSDP2 hooks and ~2,500 kernel launches
  per micro-batch), less HOST_GATHER_MS per all-gather saved by keeping parameters gathered, less
  HOST_CHUNK_MS per Liger chunk fewer than its own 64 and HOST_SKIP_GUARDS_MS
  with --skip-guard-eval. Both terms are the host's own time per phase of a host-bound step, read
  on the H200 machine without a sync inside the step (gpu_busy.py's host phases, 1 x 2048 x 4, the
  GPU busy 31 %); float8's host per micro-batch from two host-bound steps of one session. The host
  of a g6 node is assumed to be as fast (not measured: no such machine here). The same
  configuration's host-bound step has differed by up to 24 % between leases of the machine.
Activation checkpointing: the layers' forward again in the backward, a third more of their FLOPs
  and AC_HOST_SHARE more host per micro-batch (from FLOPs; on the H200 at 4 x 2048 the host grew
  33 % and the GPU work 25 %, and the model is within 0.2 % of the step: BENCHMARKS.md).
Host and GPU overlap: the step is (H^P + G^P)^(1/P), which is max(H, G) when one dominates and more
  when they are close (each is the bottleneck for part of the step). P = 4.4 was calibrated on the
  H200's 4 x 2 point through Ray (440 ms measured) and kept when the host terms were re-read from
  the host phases (a later lease, 2026-12-02). With the copies' term (2026-12-03) P = 5 is the
  smallest of 3 to 8 that keeps that lease's near-balanced steps (4 x 1, 4 x 1 with activation
  checkpointing, 8 x 1 bf16 and float8) within 5 % (largest 3.8 %) and the ratios inside one
  invocation within 8 % (largest 7.2 %); 5.5-6 fit the lease better (2.4 %) and the ratios worse
  (8-9 %). One reason host and GPU
  overlap only partly: Liger's fused loss reads its target count with .item() in every forward
  (liger_kernel/ops/fused_linear_cross_entropy.py), so the host waits there for the GPU's forward.
Communication (C), per rank per step, ring collectives (each rank moves (n-1)/n of the buffer):
  FSDP   all-gather of bf16 parameters in each micro-batch's forward and again in its backward
         (reshard after forward), reduce-scatter of fp32 gradients once per step (accumulation
         keeps them unsharded until the last micro-batch), over the shard group's link
  HSDP   the same inside a node, then an all-reduce of each rank's fp32 gradient shard across nodes
         (2 (R-1)/R x 4 B x N / S, all the node's GPUs through its one NIC)
  links  inside a node the catalogue's gpu_link (NVLink or PCIe) x LINK_EFFICIENCY; between nodes
         EFA at network_gbps, TCP sockets at SOCKET_GBYTES (measured between emulated hosts on the
         H200 machine's eth0: NCCL's socket transport, not EC2's NIC)
  overlap FSDP2 prefetches the next layer's all-gather and reduces the previous layer's gradients
         while a layer computes: communication hides behind G except what exceeds it, plus one
         layer's share (the first all-gather and the root's reduce-scatter have nothing to hide
         behind).
Other models: the token work scales by FLOPs per token against the calibration model's (Qwen2.5-1.5B
at 2048 tokens, 10.32 GFLOP), with the attention term 12 L (heads x head_dim) T (training/sizing/flops.py);
the other terms follow the model's parameters, vocabulary and hidden size (training/model/dims.py).
LoRA (training/model/lora_spec.py), PREDICTIONS until LoRA steps are measured on the H200 (the figures
will replace or calibrate these terms):
  tokens    the frozen base's matmuls run forward (2 per weight) and input-gradient (2) but no
            weight-gradient GEMM, the adapters train (6 per parameter): training/sizing/flops.py
            lora_flops_per_token, the FLOPs the loop's MFU counts, instead of 6N + ...
  adapters  their small GEMMs (rank r) are bound by memory: each target reads its input and writes
            its output about ADAPTER_PASSES times (forward, the backward's two gradients), 2 B an
            element, per token and layer, at the GPU's bandwidth
  loss      a frozen lm_head has no weight gradient: Liger's chunks read the weight twice and write
            no gradient (2, not 4, x V x d x 2 B per chunk)
  optimizer AdamW over the adapters only: 28 B x N_lora / S
  copies    the base is stored in bf16: no fp32 -> bf16 cast before its all-gathers, (4 / S + 4) B
            per base parameter; the fp32 adapters as before
  traffic   the all-gathers move the bf16 base and the adapters; reduce-scatter and HSDP's
            all-reduce only the adapters' fp32 gradients (the base has none)
  host      assumed as a full fine-tune's (peft adds a few small kernels per target, compiled with
            the layer: not measured)
Tests: tests/test_step_time.py checks every measured point within its stated tolerance.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from training.model.lora_spec import LoraSpec
from training.sizing.flops import PEAK_BF16_TFLOPS, flops_per_token, lora_flops_per_token
from training.sizing.loss_chunks import LOSS_CHUNK_TOKENS, chunk_mem_const, chunk_tokens
from training.sizing.memory_plan import Dims

# GPU constants. Memory bandwidth per the data sheets: H100 SXM 3.35 TB/s, H200 4.8 TB/s,
# L4 300 GB/s, L40S 864 GB/s, A100 40 GB 1,555 GB/s, A10G 600 GB/s (A10 data sheet).
# SMs: H100/H200 SXM 132, L4 58, L40S 142, A100 108, A10G 80 (NVIDIA architecture white papers).
MEM_GBYTES = {"H200": 4800.0, "H100": 3350.0, "L4": 300.0, "L40S": 864.0, "A100": 1555.0, "A10G": 600.0}
SMS = {"H200": 132, "H100": 132, "L4": 58, "L40S": 142, "A100": 108, "A10G": 80}
# A10G: no NVIDIA data sheet of its own (training/sizing/flops.py leaves it out); the A10's 125 is used.
PEAK = {**{k: v for k, v in PEAK_BF16_TFLOPS if v}, "A10G": 125.0}


def modelled_gpu(gpu: str) -> bool:
    """Whether the model has figures for this GPU (peak, memory bandwidth, SMs): step_time needs them."""
    return gpu in PEAK and gpu in MEM_GBYTES and gpu in SMS


# Calibration on the H200 (BENCHMARKS.md; one 2048-token sequence of Qwen2.5-1.5B: 21.1 TFLOP).
SEQ_MS_H200 = 35.8  # GPU ms per sequence at large micro-batches: (621 - 335) / 8
# Penalty 1 + K / u^2: 47.2 ms of token work at u = 2048 / 132 (micro-batch 1: 108.6 ms busy, less
# the loss's 35.9, AdamW's 12.7 and the two all-gathers' copies, 12.7). 161 before the copies had a
# term of their own.
SMALL_K = 76.8
# (527 - 12.7 - 36 - 12.7) / (16 x 35.8): H200 micro-batch 16, float8, less AdamW, the loss and the
# all-gathers' copies (0.835 before they had a term of their own).
FLOAT8_TOKEN_FACTOR = 0.813
MEM_EFFICIENCY = 0.71  # fused AdamW: 43 GB in 12.7 ms on an H200 (4.8 TB/s peak)
# Host per chunk of Liger's loss, calibrated on one invocation of gpu_busy.py at 1 x 2048 x 2 (bf16,
# 2026-12-02): 4,096-token chunks (1 instead of Liger's 64) stepped in 311.3 ms against 400.9 ms (the
# mean of two runs of Liger's own chunks, 406.5 and 395.4): 44.8 ms per micro-batch, 0.71 ms a chunk.
# The host profile had seen only ~17 ms of that as launches: the rest is the host's wait at Liger's
# `.item()` (target count, every forward) for the chunks' GPU work, which a sync cannot overlap.
HOST_CHUNK_MS = (400.9 - 311.3) / 2 / 63
LIGER_OWN_CHUNKS = 64  # what every calibration point above ran (training/sizing/loss_chunks.py)
# Host per micro-batch that --skip-guard-eval saves: 285 -> 262 ms at 1 x 2048 x 2 (gpu_busy.py,
# gathered parameters, 4,096-token chunks, 2026-12-02): 23 ms over two micro-batches.
HOST_SKIP_GUARDS_MS = 11.5
# Host per step and per micro-batch, from gpu_busy.py's host phases at 1 x 2048 x 4 (bf16, the loop's
# defaults: 4,096-token chunks, guards skipped; one H200 lease, 2026-12-02; the GPU busy 31 %, so
# the phases are the host's own work): forward 263.2 ms and backward 276.1 ms over the 4
# micro-batches; clip_grad_norm_ 11.8, optimizer 13.5, zero_grad 1.0 and the rest of the step 11.2
# once per step (learning rate, the step's tokens and labels, the gradient norm's full_tensor, the
# loss all-reduce and the wait for the GPU's last kernels: an upper bound, as that wait may hold
# part of the optimizer's GPU time, which the GPU term also counts). The micro-batch term is stated
# for Liger's own chunks with every guard evaluated, which the two savings above then take off.
# (Before, 139 and 120 ms, split from a 1 x 1 and a 1 x 2 step of two other leases: the per-step
# share was four times what the phases show.)
HOST_STEP_MS = 11.8 + 13.5 + 1.0 + 11.2
HOST_MICRO_MS = (263.2 + 276.1) / 4 + (LIGER_OWN_CHUNKS - 1) * HOST_CHUNK_MS + HOST_SKIP_GUARDS_MS
# float8's host per micro-batch against bf16's: Ray Train at 1 x 2048 x 2, both host-bound, one
# session (2026-12-01): 512.0 ms (8.0k tokens/s) against 379.3 ms (10.8k), less the per-step host.
# (Before, the kernel-count ratio 4,215 / 2,787 = 1.51, which overstated it: float8's extra kernels
# are small and launched from the same compiled graphs.)
FLOAT8_HOST_FACTOR = (512.0 - HOST_STEP_MS) / (379.3 - HOST_STEP_MS)
OVERLAP_P = 5.0  # see the docstring
# Activation checkpointing launches each layer's forward again in the backward: its host share is
# assumed to be the forward's third of a micro-batch's host work, as its GPU share is a third of the
# layers' FLOPs. Checked since on the H200 at 4 x 2048 (gpu_busy.py): host +33 %, GPU work +25 %,
# 248.6 ms predicted against 249.0 measured.
AC_HOST_SHARE = 1 / 3
# Host per all-gather of every layer (FSDP2's pre-forward/pre-backward hooks, the cast, copy-in,
# collective and copy-out launches: ~11 kernels per layer), from one invocation of gpu_busy.py at
# 1 x 2048 x 2 (bf16, 4,096-token chunks, guards evaluated, host-bound, 2026-12-02): kept gathered
# 285.1 against freed 311.3 ms, one all-gather a step against four, 986 fewer kernels.
HOST_GATHER_MS = (311.3 - 285.1) / 3
# Collectives: NCCL reaches about 70 % of a link's nominal bandwidth as bus bandwidth (an assumption
# for PCIe and EFA, which cannot be measured here); the socket transport's 3.4 GB/s was measured.
LINK_EFFICIENCY = 0.7
SOCKET_GBYTES = 3.4
DEFAULT_NVLINK_GBYTES = 450.0  # H200 SXM: 900 GB/s bidirectional (H200 data sheet)
# The model SEQ_MS_H200 and SMALL_K were measured on (its FLOPs per 2048-token sequence scale them).
CALIBRATION_SHAPE = "qwen2.5-1.5b"
# LoRA's adapters: passes over each target's input and output per token (a prediction, see above).
ADAPTER_PASSES = 3


@dataclass(frozen=True)
class Hardware:
    gpu: str
    gpus_per_node: int
    nodes: int
    intra_link: str = "NVLink"
    intra_gbytes: float = DEFAULT_NVLINK_GBYTES
    inter_link: str = "efa"  # efa, tcp, sockets (emulated hosts)
    inter_gbytes: float = 5.0

    def __post_init__(self) -> None:
        if self.gpu not in PEAK:
            raise ValueError(
                f"gpu: no step-time constants for {self.gpu!r}; known: {', '.join(sorted(PEAK))}"
            )
        if self.inter_link not in ("efa", "tcp", "sockets"):
            raise ValueError(f"inter_link must be efa, tcp or sockets, got {self.inter_link!r}")


@dataclass(frozen=True)
class StepTime:
    step_s: float
    gpu_s: float
    host_s: float
    compute_s: dict[str, float]
    comm_s: dict[str, float]
    exposed_comm_s: float
    tokens_per_s: float
    mfu: float
    bottleneck: str
    inputs: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ring(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def step_time(  # noqa: PLR0912, PLR0915  (one formula, term by term)
    shape: str | Dims,
    hw: Hardware,
    *,
    seq_len: int,
    micro_batch: int,
    accum: int = 1,
    mesh: tuple[int, ...] = (1,),
    float8: bool = False,
    liger: bool = True,
    loss_chunk_tokens: int = LOSS_CHUNK_TOKENS,
    reshard_after_forward: bool = True,
    skip_guards: bool = True,
    activation_checkpointing: bool = False,
    lora: LoraSpec | None = None,
) -> StepTime:
    """One rank's step of `python -m training` (compiled layers) on `hw` with this mesh; with
    `lora`, LoRA's predicted terms (see the module's docstring)."""
    dims = shape if isinstance(shape, Dims) else Dims.of(shape)
    for name, value in (("seq_len", seq_len), ("micro_batch", micro_batch), ("accum", accum)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    n, d, v = dims.params, dims.hidden, dims.vocab
    world = math.prod(mesh)
    shard = mesh[-1]
    replicas = mesh[0] if len(mesh) == 2 else 1
    tokens = micro_batch * seq_len
    gpu = hw.gpu
    bandwidth = MEM_GBYTES[gpu] * 1e9 * MEM_EFFICIENCY
    q = dims.q_dim
    n_lora = dims.layers * lora.params_per_layer(dims.linear_shapes()) if lora else 0
    trained = n_lora if lora else n
    # LoRA's FLOPs as training/sizing/flops.py counts them for the loop's MFU (4 x base matmuls
    # + 6 x adapters).
    f_tok = lora_flops_per_token(dims, lora, seq_len) if lora else flops_per_token(n, dims.layers, q, seq_len)
    # The token-proportional work, scaled from the H200 calibration (Qwen2.5-1.5B, 2048 tokens) by
    # dense peak and by FLOPs per token.
    ref = Dims.of(CALIBRATION_SHAPE)
    f_ref = flops_per_token(ref.params, ref.layers, ref.q_dim, 2048)
    per_token_s = SEQ_MS_H200 / 1e3 / 2048 * (f_tok / f_ref) * (PEAK["H200"] / PEAK[gpu])
    per_sm = tokens / SMS[gpu]
    token_s = tokens * per_token_s * (1 + SMALL_K / per_sm**2)
    if float8:
        token_s *= FLOAT8_TOKEN_FACTOR
    ac_factor = 1.0
    if activation_checkpointing:
        # Each decoder layer's forward runs again in the backward: 2 N_layers (+ 2 N_lora) + 4 L q T
        # per token (without the lm_head's V d), not the loss's.
        layer_forward = 2 * (n - v * d + n_lora) + 4 * dims.layers * q * seq_len
        ac_factor = 1 + layer_forward / f_tok
        token_s *= ac_factor
    loss_s, chunks = 0.0, LIGER_OWN_CHUNKS
    if liger:
        c = chunk_mem_const(tokens, v, d, loss_chunk_tokens)
        chunks = math.ceil(tokens / chunk_tokens(tokens, v, d, c))
        # Each chunk reads the lm_head weight twice and reads and writes its gradient; a frozen
        # lm_head (LoRA) has none.
        loss_s = chunks * (2 if lora else 4) * v * d * 2 / bandwidth
    optimizer_s = 28 * trained / shard / bandwidth
    # Each FSDP2 all-gather copies on the GPU too: the fp32 shard cast to bf16 (read 4, write 2 B
    # per local parameter) and copied into the collective's buffer (2 + 2), then the gathered
    # buffer split into the layers' parameters (2 + 2 B per parameter): 10 / S + 4 B per parameter.
    # With parameters kept gathered, one all-gather a step (the loop reshards only after the last
    # micro-batch's backward); freed, one in each micro-batch's forward and one in its backward.
    gathers = 1 if not reshard_after_forward else 2 * accum
    copy_bytes = (4 / shard + 4) * n + (10 / shard + 4) * n_lora if lora else (10 / shard + 4) * n
    copies_s = gathers * copy_bytes / bandwidth
    compute = {
        "layers and loss GEMMs": accum * token_s,
        "loss weight traffic": accum * loss_s,
        "optimizer": optimizer_s,
        "parameter copies (FSDP all-gathers)": copies_s,
    }
    if lora:
        per_token = sum(i + o for t, (i, o) in dims.linear_shapes().items() if t in lora.targets)
        adapter_s = ADAPTER_PASSES * 2 * per_token * dims.layers * tokens / bandwidth
        compute["LoRA adapters (small GEMMs, memory-bound)"] = accum * adapter_s
    gpu_s = sum(compute.values())
    micro_ms = HOST_MICRO_MS * (FLOAT8_HOST_FACTOR if float8 else 1.0)
    micro_ms -= (LIGER_OWN_CHUNKS - chunks) * HOST_CHUNK_MS + (HOST_SKIP_GUARDS_MS if skip_guards else 0.0)
    if activation_checkpointing:
        micro_ms *= 1 + AC_HOST_SHARE
    # HOST_MICRO_MS was read with parameters freed (two all-gathers a micro-batch); kept, fewer.
    host_s = (HOST_STEP_MS + accum * micro_ms - (2 * accum - gathers) * HOST_GATHER_MS) / 1e3
    busy = (host_s**OVERLAP_P + gpu_s**OVERLAP_P) ** (1 / OVERLAP_P)

    # Communication, per rank per step.
    nodes = hw.nodes
    shard_crosses_nodes = len(mesh) == 1 and nodes > 1
    inter = (SOCKET_GBYTES if hw.inter_link != "efa" else hw.inter_gbytes) * 1e9
    intra = hw.intra_gbytes * LINK_EFFICIENCY * 1e9
    gather_bytes = _ring(shard) * gathers * 2 * (n + n_lora)
    fsdp_bytes = gather_bytes + _ring(shard) * 4 * trained
    comm: dict[str, float] = {}
    grad_s = 0.0  # the gradients' share: reduce-scatter and HSDP all-reduce
    gather_s = 0.0  # the all-gathers' share
    if shard > 1:
        link = inter if shard_crosses_nodes else intra
        # A ring over every rank crosses each node's NIC once per direction: every byte a rank
        # receives passes some NIC, and a node's GPUs share one.
        name = f"FSDP over {hw.inter_link if shard_crosses_nodes else hw.intra_link}"
        comm[name] = fsdp_bytes / link
        grad_s += _ring(shard) * 4 * trained / link
        gather_s = gather_bytes / link
    if replicas > 1:
        per_rank = 2 * _ring(replicas) * 4 * trained / shard
        comm[f"HSDP all-reduce over {hw.inter_link}"] = per_rank * hw.gpus_per_node / inter
        grad_s += comm[f"HSDP all-reduce over {hw.inter_link}"]
    total_comm = sum(comm.values())
    # All traffic hides behind the step's GPU work at best; the gradients' only behind the last
    # micro-batch's backward (accumulation keeps them unsharded until then), which is two thirds of
    # its layer work, plus the recompute with activation checkpointing.
    # (Liger's loss computes its gradients in the forward: no window there.) Kept gathered, the
    # step's one all-gather per layer runs in the first micro-batch's forward, a third of its layer
    # work, and only there can it hide; freed, the all-gathers spread over every forward and backward.
    backward_s = token_s * (2 / 3 if not activation_checkpointing else 1 - 1 / 3 / ac_factor)
    forward_s = token_s / ac_factor / 3
    gather_exposed = 0.0 if reshard_after_forward else max(0.0, gather_s - forward_s)
    exposed = max(0.0, total_comm - gpu_s, gather_exposed + max(0.0, grad_s - backward_s))
    exposed += total_comm / dims.layers
    step_s = busy + exposed
    tps = world * accum * tokens / step_s
    mfu = tps * f_tok / (world * PEAK[gpu] * 1e12)
    if exposed > 0.25 * step_s:
        bottleneck = max(comm, key=comm.__getitem__)
    elif host_s > gpu_s:
        bottleneck = "host (kernel launches, FSDP hooks)"
    elif loss_s > token_s:
        bottleneck = "loss weight traffic (Liger's ~64 chunks)"
    else:
        bottleneck = "GPU compute"
    inputs = dict(
        seq_len=seq_len, micro_batch=micro_batch, accum=accum, mesh=list(mesh), float8=float8,
        liger=liger, loss_chunk_tokens=loss_chunk_tokens, reshard_after_forward=reshard_after_forward,
        skip_guards=skip_guards, activation_checkpointing=activation_checkpointing,
        gpu=gpu, nodes=nodes, gpus_per_node=hw.gpus_per_node, intra_link=hw.intra_link,
        inter_link=hw.inter_link, lora=lora,
    )  # fmt: skip
    return StepTime(
        step_s=step_s,
        gpu_s=gpu_s,
        host_s=host_s,
        compute_s=compute,
        comm_s=comm,
        exposed_comm_s=exposed,
        tokens_per_s=tps,
        mfu=mfu,
        bottleneck=bottleneck,
        inputs=inputs,
    )


def original_recipe_step(shape: str | Dims, hw: Hardware, *, seq_len: int, micro_batch: int) -> float:
    """The AWS sample's step (bf16 model, FSDP1 full sharding over every rank, plain AdamW, HF loss):
    its traffic is bf16 all-gathers in forward and backward and a bf16 reduce-scatter, 6 B x N x
    (world-1)/world per rank; its compute at seq 128 is small next to that. Used to check the model
    against the sample's published two-node figures."""
    dims = shape if isinstance(shape, Dims) else Dims.of(shape)
    n = dims.params
    world = hw.nodes * hw.gpus_per_node
    bandwidth = MEM_GBYTES[hw.gpu] * 1e9 * MEM_EFFICIENCY
    # At 128 tokens every GEMM is bound by reading its weights: 2 B x N in the forward, twice that in
    # the backward; plain AdamW in bf16 reads and writes 14 B per local parameter.
    gpu_s = 6 * n / bandwidth + 14 * n / world / bandwidth
    host_s = (HOST_STEP_MS + HOST_MICRO_MS) / 1e3
    busy = (host_s**OVERLAP_P + gpu_s**OVERLAP_P) ** (1 / OVERLAP_P)
    inter = (SOCKET_GBYTES if hw.inter_link != "efa" else hw.inter_gbytes) * 1e9
    comm = _ring(world) * 6 * n / inter
    # FSDP1 overlaps less (one unit per ~10 M parameters, no per-layer prefetch of the backward's
    # reduce-scatter); the traffic is counted in full.
    return busy + comm

"""An environment's training job against its GPU's memory: the settings' side of the memory plan.

training/sizing/memory_plan.py models one rank (pure Python, no torch); this maps the settings onto it the
way the RayJob runs (one Ray Train worker per GPU, `gpus` workers per node, the job's sharding,
micro-batch and accumulation) and says what to change when the job would not fit. The GPU's usable
memory comes from the instance catalogue (`Instance.gpu_memory_cuda_gib`).

The plan sizes the job's model by its own config (config/models.py: the catalogue, or a local copy
of its config.json), with LoRA's terms when `job.lora` is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from training.model.lora_spec import LoraSpec
from training.model.sharding import mesh_shape
from training.sizing.loss_chunks import default_chunk_tokens
from training.sizing.memory_plan import (
    GIB,
    JobMemory,
    auto_micro_batch,
    auto_reshard_after_forward,
    divisors,
    largest_micro_batch,
    plan,
)

if TYPE_CHECKING:
    from config.catalogue import Instance

    # config.settings imports this module, so the job is typed by the fields the plan reads.
    from config.memory_job import PlannedJob as JobSettings


def plan_options(job: JobSettings, gpu: Instance, nodes: int, micro: int | None = None) -> dict[str, Any]:
    """`plan` keyword arguments for this job on `nodes` nodes of `gpu` (all but micro_batch/accum),
    float8 as the job has it at micro-batch `micro` (default: the job's)."""
    world = nodes * gpu.gpus
    mesh = mesh_shape(str(job.sharding), world, gpu.gpus)
    return dict(
        shape=job.model_plan.dims,
        seq_len=job.seq_len,
        lora=job.lora_spec,
        shard=mesh[-1],
        # The world group, and with an HSDP mesh its shard and replicate sub-groups; a single rank's
        # communicator has no peers (its few bytes are in the CUDA context term).
        communicators=0 if world == 1 else 1 if len(mesh) == 1 else 3,
        compile=job.compile,
        activation_checkpointing=job.activation_checkpointing,
        liger=job.liger,
        float8=job.float8_on(gpu, micro),
        # The loop's --loss-chunk-tokens default for this GPU (the RayJob does not set it).
        loss_chunk_tokens=default_chunk_tokens(gpu.gpu_memory_cuda_gib),
    )


def accumulation(global_batch: int, micro_batch: int, world: int) -> int:
    """Micro-batches per optimizer step on each worker (training/run/trainer.py)."""
    return max(1, global_batch // (micro_batch * world))


def micro_batch(job: JobSettings, gpu: Instance, nodes: int) -> int:
    """The micro-batch the job runs: job.micro_batch_size, or for `auto` the memory plan's choice
    for one GPU of `gpu` (training/sizing/memory_plan.py auto_micro_batch, the rule `python -m training
    --micro-batch-size auto` applies on the worker). The RayJob carries the number chosen here."""
    if job.micro_batch_size != "auto":
        return job.micro_batch_size
    world = nodes * gpu.gpus
    if not world or job.global_batch_size % world:
        return 1  # no GPU to plan for, or a batch the workers cannot share (refused by the settings)
    return auto_micro_batch(
        job.global_batch_size // world, capacity_bytes(gpu), lambda m: plan_options(job, gpu, nodes, m)
    )


def reshard_after_forward(
    job: JobSettings, gpu: Instance, nodes: int, *, loss_chunk_tokens: int | None = None
) -> bool:
    """Whether the job's workers free each layer's gathered parameters after its forward: the
    RayJob leaves --reshard-after-forward to the worker, which keeps them gathered when the memory
    plan at its micro-batch still leaves AUTO_HEADROOM of the GPU free (training/sizing/memory_plan.py
    auto_reshard_after_forward, applied by training/run/trainer.py). `loss_chunk_tokens`: a worker's
    --loss-chunk-tokens other than its default (not a job setting)."""
    world = nodes * gpu.gpus
    if not world:
        return True
    micro = micro_batch(job, gpu, nodes)
    options = plan_options(job, gpu, nodes, micro)
    if loss_chunk_tokens is not None:
        options["loss_chunk_tokens"] = loss_chunk_tokens
    return auto_reshard_after_forward(
        capacity_bytes(gpu),
        {**options, "micro_batch": micro, "accum": accumulation(job.global_batch_size, micro, world)},
    )


def job_memory(job: JobSettings, gpu: Instance, nodes: int) -> JobMemory:
    world = nodes * gpu.gpus
    micro = micro_batch(job, gpu, nodes)
    options = plan_options(job, gpu, nodes, micro)
    options["reshard_after_forward"] = reshard_after_forward(job, gpu, nodes)
    return plan(micro_batch=micro, accum=accumulation(job.global_batch_size, micro, world), **options)


def capacity_bytes(gpu: Instance) -> int:
    return int(gpu.gpu_memory_cuda_gib * GIB)


def valid_micro_batches(global_batch: int, world: int) -> list[int]:
    """Micro-batches the settings accept for this global batch: micro x workers divides it, i.e.
    the divisors of a worker's share (none when the workers cannot share it evenly)."""
    return [] if global_batch % world else divisors(global_batch // world)


def largest_fitting_micro_batch(job: JobSettings, gpu: Instance, nodes: int) -> int:
    """Among the micro-batches valid for job.global_batch_size, the largest that fits (0: none).
    Each has its own accumulation: fewer micro-batches per step also drops FSDP's unsharded
    gradients when there is only one."""
    world = nodes * gpu.gpus
    fitting = [
        m
        for m in valid_micro_batches(job.global_batch_size, world)
        if plan(
            micro_batch=m,
            accum=accumulation(job.global_batch_size, m, world),
            **plan_options(job, gpu, nodes, m),
        ).fits(capacity_bytes(gpu))
    ]
    return max(fitting, default=0)


def largest_micro_batch_for(
    job: JobSettings, gpu: Instance, nodes: int, *, seq_len: int, accumulate: bool, **overrides: Any
) -> int:
    """The largest micro-batch at `seq_len` that fits, accumulating (>1 micro-batch per step) or
    not, other settings as the job's (or `overrides`)."""
    options = {**plan_options(job, gpu, nodes, micro_batch(job, gpu, nodes)), "seq_len": seq_len, **overrides}
    return largest_micro_batch(capacity_bytes(gpu), accum=2 if accumulate else 1, **options)


# The most GPU nodes a fix may propose (job.nodes; gpu_nodes.max_size must allow it).
MAX_NODES_SUGGESTED = 16


def fit_problem(job: JobSettings, gpu: Instance, nodes: int) -> str | None:
    """None when the job fits one GPU of `gpu`, else one message: what it needs, what the GPU has,
    and the changes of settings that would fit, each with its predicted memory per GPU (each checked
    with the plan). When none does, the model cannot be trained on this GPU type at all."""
    if not gpu.gpus:
        return None
    need = job_memory(job, gpu, nodes)
    have = capacity_bytes(gpu)
    if need.fits(have):
        return None
    world = nodes * gpu.gpus
    micro = micro_batch(job, gpu, nodes)
    options = plan_options(job, gpu, nodes, micro)
    accum = accumulation(job.global_batch_size, micro, world)
    fixes: list[str] = []

    def gib(memory: JobMemory) -> str:
        return f"{memory.device_bytes / GIB:.1f} GiB"

    best = largest_fitting_micro_batch(job, gpu, nodes)
    if best:
        fixes.append(
            f"job.micro_batch_size: {best} (the largest that fits with global_batch_size "
            f"{job.global_batch_size} over {world} GPUs)"
        )
    if accum > 1:
        one = plan(micro_batch=micro, accum=1, **options)
        if one.fits(have):
            fixes.append(
                f"job.global_batch_size: {micro * world} (one micro-batch per step: FSDP then keeps no "
                f"unsharded gradients between micro-batches; {gib(one)})"
            )
    fixes += _method_and_scale_fixes(job, gpu, nodes, have)
    # Each figure is the plan once the change is made: at the micro-batch `auto` takes then, which
    # can be larger than today's (it is what `raytrain plan` shows after the change).
    if not job.activation_checkpointing:
        ac = _changed(job, gpu, nodes, activation_checkpointing=True)
        if ac.fits(have):
            fixes.append(f"job.activation_checkpointing: true ({gib(ac)})")
    seq = _longest_fitting_seq_len(micro, accum, options, have)
    if seq:
        shorter = _changed(job, gpu, nodes, seq_len=seq)
        fixes.append(f"job.seq_len: {seq} or less ({gib(shorter)})")
    top = sorted(need.peak_terms, key=lambda t: -t.bytes)[:3]
    biggest = ", ".join(f"{t.name} {t.gib:.1f} GiB" for t in top)
    head = (
        f"needs {need.device_bytes / GIB:.1f} GiB per GPU ({need.peak_moment}: {biggest}, ...) but "
        f"one {gpu.gpu_model} of {gpu.name} has {gpu.gpu_memory_cuda_gib} GiB"
    )
    if not fixes:
        fixes += _combined_fix(job, gpu, nodes, have)
    if not fixes and not _fits_anywhere(job, gpu, have):
        return (
            f"{head}, and the model ({job.model_plan.source}, {job.model_plan.dims.params / 1e9:.1f} B "
            f"parameters) fits no job on {gpu.name}: not with LoRA, activation checkpointing, full "
            f"sharding over {MAX_NODES_SUGGESTED} nodes and 128-token sequences; use a "
            "gpu_nodes.instance_type with more memory per GPU or a smaller job.model"
        )
    largest = (
        f"the largest micro-batch that fits is {best}"
        if best
        else f"no micro-batch fits global_batch_size {job.global_batch_size}"
    )
    return (
        f"{head}; {largest}. Any of these fits: "
        f"{'; '.join([*fixes, 'a gpu_nodes.instance_type with more memory per GPU'])} "
        "(`raytrain plan --env NAME` shows the breakdown)"
    )


def _changed(job: JobSettings, gpu: Instance, nodes: int, **overrides: Any) -> JobMemory:
    """The plan of the job with `plan` options overridden, at the micro-batch `auto` would take
    then (or the job's set one)."""
    world = nodes * gpu.gpus

    def options(m: int) -> dict[str, Any]:
        return {**plan_options(job, gpu, nodes, m), **overrides}

    micro = job.micro_batch_size
    if micro == "auto":
        micro = (
            1
            if job.global_batch_size % world
            else auto_micro_batch(job.global_batch_size // world, capacity_bytes(gpu), options)
        )
    return plan(micro_batch=micro, accum=accumulation(job.global_batch_size, micro, world), **options(micro))


def _method_and_scale_fixes(job: JobSettings, gpu: Instance, nodes: int, have: int) -> list[str]:
    """LoRA instead of a full fine-tune, full sharding instead of HSDP, more GPU nodes: each at
    the micro-batch auto would take then (or the set one), with its predicted memory per GPU."""
    fixes: list[str] = []
    if job.lora is None and job.init.value == "pretrained":
        lora = _changed(job, gpu, nodes, lora=LoraSpec())
        if lora.fits(have):
            fixes.append(
                "job.lora: {} (LoRA rank 16 on every linear layer of the frozen bf16 base; "
                f"{lora.device_bytes / GIB:.1f} GiB)"
            )
    world = nodes * gpu.gpus
    if len(mesh_shape(str(job.sharding), world, gpu.gpus)) == 2:
        full = _changed(job, gpu, nodes, shard=world, communicators=1)
        if full.fits(have):
            fixes.append(
                f"job.sharding: full (parameters sharded over all {world} GPUs instead of a node's "
                f"{gpu.gpus}; more inter-node traffic; {full.device_bytes / GIB:.1f} GiB)"
            )
    for more in range(nodes + 1, MAX_NODES_SUGGESTED + 1):
        if job.global_batch_size % (more * gpu.gpus):
            continue
        memory = _changed(job, gpu, more, shard=more * gpu.gpus, communicators=1)
        if memory.fits(have):
            fixes.append(
                f"job.nodes: {more} with job.sharding: full ({more * gpu.gpus} GPUs, gpu_nodes.max_size "
                f">= {more}; {memory.device_bytes / GIB:.1f} GiB)"
            )
            break
    return fixes


def _combined_fix(job: JobSettings, gpu: Instance, nodes: int, have: int) -> list[str]:
    """When no single change fits: LoRA (when pretrained) with activation checkpointing and full
    sharding, on the fewest nodes (from the job's) where that fits."""
    lora = job.lora_spec or (LoraSpec() if job.init.value == "pretrained" else None)
    for more in range(nodes, MAX_NODES_SUGGESTED + 1):
        if job.global_batch_size % (more * gpu.gpus):
            continue
        world = more * gpu.gpus
        memory = _changed(
            job, gpu, more, lora=lora, activation_checkpointing=True, shard=world, communicators=1
        )
        if memory.fits(have):
            changes = [
                *(["job.lora: {}"] if job.lora is None and lora is not None else []),
                "job.activation_checkpointing: true",
                "job.sharding: full",
                *([f"job.nodes: {more} (gpu_nodes.max_size >= {more})"] if more != nodes else []),
            ]
            return [f"together {', '.join(changes)} ({memory.device_bytes / GIB:.1f} GiB)"]
    return []


def _fits_anywhere(job: JobSettings, gpu: Instance, have: int) -> bool:
    """Whether the model fits one GPU of `gpu` in the smallest job the settings allow: LoRA (when
    pretrained), activation checkpointing, one 128-token sequence, full sharding over
    MAX_NODES_SUGGESTED nodes."""
    lora = job.lora_spec or (LoraSpec() if job.init.value == "pretrained" else None)
    options = {
        **plan_options(job, gpu, MAX_NODES_SUGGESTED, 1),
        "seq_len": 128,
        "shard": MAX_NODES_SUGGESTED * gpu.gpus,
        "communicators": 1,
        "activation_checkpointing": True,
        "lora": lora,
    }
    return plan(micro_batch=1, accum=1, **options).fits(have)


def _longest_fitting_seq_len(micro: int, accum: int, options: dict[str, Any], have: int) -> int:
    """The longest sequence (a multiple of 128) that fits at this micro-batch, 0 if none."""
    lo, hi = 0, options["seq_len"] // 128
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if plan(micro_batch=micro, accum=accum, **{**options, "seq_len": mid * 128}).fits(have):
            lo = mid
        else:
            hi = mid - 1
    return lo * 128

"""Synthesis refuses a job that would not fit its GPU, and says what would."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from ruamel.yaml import YAML

from config.catalogue import CATALOGUE, GPU_MEMORY_CUDA_GIB
from config.loader import SettingsError, environments_dir, load_settings, parse_settings
from config.memory import (
    capacity_bytes,
    job_memory,
    largest_fitting_micro_batch,
    micro_batch,
    reshard_after_forward,
    valid_micro_batches,
)
from k8s.job import training_args
from training.options.train import parse_args
from training.run.loop import planned_micro_batch, planned_reshard
from training.sizing.loss_chunks import SMALL_GPU_CHUNK_TOKENS
from training.sizing.memory_plan import AUTO_HEADROOM, GIB, plan

SOURCE = "config/environments/dev.yaml"
# The headroom the shipped jobs keep on a 24 GB L4 (docs/training.md states it).
SHIPPED_MARGIN_GIB = 3.0


def dev_data() -> dict[str, Any]:
    data: dict[str, Any] = YAML(typ="safe", pure=True).load((environments_dir() / "dev.yaml").read_text())
    return data


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(SettingsError) as info:
        parse_settings(json.dumps(data), name="dev", source=SOURCE)
    return str(info.value)


@pytest.mark.parametrize("env", ["dev", "prod", "example"])
def test_shipped_jobs_fit_an_l4_with_margin(env: str) -> None:
    settings = load_settings(env)
    gpu = settings.gpu_nodes.instance
    need = job_memory(settings.job, gpu, settings.num_workers // gpu.gpus)
    headroom = gpu.gpu_memory_cuda_gib - need.device_bytes / GIB
    assert gpu.gpu_model == "L4"
    assert headroom >= SHIPPED_MARGIN_GIB, (env, need.device_bytes / GIB)


def test_every_gpu_type_has_its_cuda_visible_memory() -> None:
    for inst in CATALOGUE.values():
        if inst.gpus:
            assert 0.85 * inst.gpu_memory_gib < inst.gpu_memory_cuda_gib < inst.gpu_memory_gib, inst.name
        else:
            assert inst.gpu_memory_cuda_gib == 0.0
    assert GPU_MEMORY_CUDA_GIB["L4"] == 21.96


def test_a_job_that_does_not_fit_is_refused_with_the_largest_micro_batch() -> None:
    data = dev_data()
    # 8 GPUs, global 64: micro-batches 1, 2, 4, 8 are valid; 8 x 2048 tokens needs ~36 GiB.
    data["job"].update(seq_len=2048, global_batch_size=64, micro_batch_size=8)
    message = error_of(data)
    (line,) = message.splitlines()  # one problem, one line
    assert line.startswith(f"{SOURCE}: job.micro_batch_size: needs "), line
    assert "one L4 of g6.12xlarge has 21.96 GiB" in line
    best = int(re.search(r"the largest micro-batch that fits is (\d+)", line).group(1))  # type: ignore[union-attr]
    assert f"job.micro_batch_size: {best} (the largest that fits" in line
    assert "job.activation_checkpointing: true" in line
    # What the message offers does fit: the settings pass with it.
    data["job"]["micro_batch_size"] = best
    parse_settings(json.dumps(data), name="dev", source=SOURCE)
    data["job"].update(micro_batch_size=8, activation_checkpointing=True)
    parse_settings(json.dumps(data), name="dev", source=SOURCE)


def test_when_no_micro_batch_fits_the_message_offers_dropping_accumulation() -> None:
    data = dev_data()
    # Accumulating 4 micro-batches keeps 5.8 GiB of unsharded fp32 gradients per GPU.
    data["job"].update(seq_len=8192, global_batch_size=32, micro_batch_size=1)
    (line,) = error_of(data).splitlines()
    assert "no micro-batch fits global_batch_size 32" in line
    assert "job.global_batch_size: 8 (one micro-batch per step" in line
    seq = int(re.search(r"job.seq_len: (\d+) or less", line).group(1))  # type: ignore[union-attr]
    for fix in ({"global_batch_size": 8}, {"seq_len": seq}, {"activation_checkpointing": True}):
        ok = dev_data()
        ok["job"].update(seq_len=8192, global_batch_size=32, micro_batch_size=1)
        ok["job"].update(fix)
        parse_settings(json.dumps(ok), name="dev", source=SOURCE)


def test_largest_fitting_micro_batch_is_the_boundary_among_valid_ones() -> None:
    settings = load_settings("dev")
    gpu = settings.gpu_nodes.instance
    job = settings.job.model_copy(update={"global_batch_size": 256, "seq_len": 1024})
    best = largest_fitting_micro_batch(job, gpu, 2)
    valid = valid_micro_batches(256, 8)
    assert valid == [1, 2, 4, 8, 16, 32]
    assert best in valid
    # The oracle is the L4's usable memory as torch reports it (config/catalogue.py), not the
    # plan's own `fits` or capacity_bytes.
    assert gpu.gpu_model == "L4"
    usable = int(21.96 * 2**30)
    for m in valid:
        need = job_memory(job.model_copy(update={"micro_batch_size": m}), gpu, 2).device_bytes
        assert (need <= usable) == (m <= best), m


def test_the_plan_follows_the_jobs_sharding() -> None:
    settings = load_settings("dev")
    gpu = settings.gpu_nodes.instance
    auto = job_memory(settings.job, gpu, 2)  # two nodes: HSDP, shard group = 4 GPUs of a node
    full = job_memory(settings.job.model_copy(update={"sharding": "full"}), gpu, 2)  # over 8
    assert auto.inputs["shard"] == 4 and full.inputs["shard"] == 8
    one_node = job_memory(settings.job, gpu, 1)
    assert one_node.inputs["shard"] == 4
    # The loop's loss chunk on a 24 GB L4 (training/sizing/loss_chunks.py) is the plan's too.
    assert auto.inputs["loss_chunk_tokens"] == SMALL_GPU_CHUNK_TOKENS
    # dev's micro_batch_size is auto: 2 sequences per GPU per step, in one micro-batch; with the
    # parameters kept gathered the plan still leaves the headroom, so the workers keep them.
    expected = plan(
        "qwen2.5-1.5b", seq_len=2048, micro_batch=2, accum=1, shard=4, communicators=3,
        loss_chunk_tokens=SMALL_GPU_CHUNK_TOKENS, reshard_after_forward=False,
    )  # fmt: skip
    assert auto.device_bytes == expected.device_bytes
    assert auto.device_bytes <= capacity_bytes(gpu) * (1 - AUTO_HEADROOM)


DATA_FLAGS = (
    "--data",
    "--prepared-data",
    "--eval-data",
    "--eval-every",
    "--early-stop-patience",
    "--data-format",
)


def _without_data(args: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(args):
        if args[i] in DATA_FLAGS:
            i += 2
            continue
        out.append(args[i])
        i += 1
    return [*out, "--data", "random"]


def _workers_reshard(settings: Any, opts: Any, micro: int, accum: int) -> bool:
    """--reshard-after-forward as a worker of the job would resolve it (training/run/trainer.py), with the
    layers as a rank built them (Liger and torchao are the pods' packages, not this machine's)."""
    gpu, job = settings.gpu_nodes.instance, settings.job
    return planned_reshard(
        opts,
        shape=job.model_plan.dims,
        world=settings.num_workers,
        local_world=gpu.gpus,
        kernels=(job.compile, job.liger, not job.compile),
        capacity=capacity_bytes(gpu),
        micro=micro,
        accum=accum,
        float8=job.float8_on(gpu, micro),
    )


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_the_worker_chooses_what_synthesis_wrote(env: str) -> None:
    """The RayJob's --micro-batch-size (settings: auto) is what a worker of that job would choose
    itself from its GPU's memory with `--micro-batch-size auto` and the job's other arguments."""
    settings = load_settings(env)
    gpu, job = settings.gpu_nodes.instance, settings.job
    assert job.micro_batch_size == "auto"
    args = training_args(settings, checkpoint_uri="s3://bucket/checkpoints")
    written = int(args[args.index("--micro-batch-size") + 1])
    assert written == micro_batch(job, gpu, job.nodes)
    # The last of a flag wins. Liger and torchao are the pods' packages, not necessarily this
    # machine's: the layers as a rank built them are `kernels` and `float8_at` below. The data
    # (S3, not reachable here) does not enter the plan: random ids instead.
    opts = parse_args([*_without_data(args), "--micro-batch-size", "auto", "--no-liger", "--no-float8"])
    # A worker plans for the model it built: the one planned at synthesis (--planned-dims checks it).
    chosen = planned_micro_batch(
        opts,
        shape=job.model_plan.dims,
        world=settings.num_workers,
        local_world=gpu.gpus,
        kernels=(job.compile, job.liger, not job.compile),
        capacity=capacity_bytes(gpu),
        float8_at=lambda m: job.float8_on(gpu, m),
    )
    assert chosen == written
    # The RayJob leaves --reshard-after-forward to the worker; the plan synthesis and `raytrain
    # plan` show is the one the worker's rule gives at that micro-batch.
    assert "--reshard-after-forward" not in args and "--no-reshard-after-forward" not in args
    accum = job.global_batch_size // (written * settings.num_workers)
    worker = _workers_reshard(settings, opts, written, accum)
    assert worker == reshard_after_forward(job, gpu, job.nodes)
    assert job_memory(job, gpu, job.nodes).inputs["reshard_after_forward"] == worker


@pytest.mark.parametrize(("chunk", "kept"), [(None, True), (32768, False)])
def test_raytrain_plan_decides_a_changed_jobs_parameters_as_its_workers_would(
    chunk: int | None, kept: bool
) -> None:
    """`raytrain plan`'s alternatives change the job (here dev at seq 4096, 6 x 1 checkpointed);
    its parameters are kept or freed by the worker's rule for the job so changed, the loop's own
    --loss-chunk-tokens included: 32,768-token chunks leave too little of the L4 to keep them."""
    from raytrain.plan import predict

    base = load_settings("dev")
    settings = base.model_copy(update={"job": base.job.model_copy(update={"seq_len": 4096})})
    world = settings.num_workers
    change: dict[str, Any] = dict(micro_batch=6, accum=1, activation_checkpointing=True)
    flags = ["--micro-batch-size", "6", "--global-batch-size", str(6 * world), "--activation-checkpointing"]
    if chunk:
        change["loss_chunk_tokens"] = chunk
        flags += ["--loss-chunk-tokens", str(chunk)]
    predicted = predict(settings, **change).inputs["reshard_after_forward"]
    args = training_args(settings, checkpoint_uri="s3://bucket/checkpoints")
    opts = parse_args([*_without_data(args), *flags, "--no-liger", "--no-float8"])
    assert predicted == _workers_reshard(settings, opts, 6, 1) == (not kept)


def test_auto_is_the_largest_micro_batch_that_leaves_the_headroom() -> None:
    """`job.micro_batch_size: auto` against every valid micro-batch: the largest whose plan leaves
    AUTO_HEADROOM of the L4 free; an explicit one is held to the plan alone."""
    settings = load_settings("dev")
    gpu = settings.gpu_nodes.instance
    budget = capacity_bytes(gpu) * (1 - AUTO_HEADROOM)
    for global_batch, seq_len in ((16, 2048), (32, 2048), (64, 1024), (128, 512), (8, 8192)):
        job = settings.job.model_copy(update={"global_batch_size": global_batch, "seq_len": seq_len})
        chosen = micro_batch(job, gpu, 2)
        valid = valid_micro_batches(global_batch, 8)
        leaving = [
            m
            for m in valid
            if job_memory(job.model_copy(update={"micro_batch_size": m}), gpu, 2).device_bytes <= budget
        ]
        assert chosen == max(leaving, default=1), (global_batch, seq_len)
    # dev's 4 sequences per GPU: without activation checkpointing 4 x 1 fits the plan (explicitly
    # allowed) but not with the headroom, so auto takes 1 x 4; checkpointed, it takes 4 x 1.
    four_per_gpu = settings.job.model_copy(update={"global_batch_size": 32})
    assert micro_batch(four_per_gpu, gpu, 2) == 1
    four = job_memory(four_per_gpu.model_copy(update={"micro_batch_size": 4}), gpu, 2)
    assert four.fits(capacity_bytes(gpu)) and four.device_bytes > budget
    checkpointed = four_per_gpu.model_copy(update={"activation_checkpointing": True})
    assert micro_batch(checkpointed, gpu, 2) == 4
    # prod's 7B LoRA job: 4 x 1 with checkpointing; without, not even one sequence fits.
    prod = load_settings("prod")
    assert prod.job.activation_checkpointing and micro_batch(prod.job, gpu, 2) == 4
    plain = prod.job.model_copy(update={"activation_checkpointing": False, "micro_batch_size": 1})
    assert not job_memory(plain, gpu, 2).fits(capacity_bytes(gpu))


def test_auto_needs_a_global_batch_the_workers_share() -> None:
    data = dev_data()
    data["job"].update(global_batch_size=12, micro_batch_size="auto")
    (line,) = error_of(data).splitlines()
    assert line == (
        f"{SOURCE}: job.global_batch_size: 12 is not a multiple of workers (8 = 2 nodes x 4 GPUs); "
        "valid: global_batch_size 8 or 16"
    ), line
    data["job"]["micro_batch_size"] = "two"
    (line,) = error_of(data).splitlines()
    assert line == f"{SOURCE}: job.micro_batch_size: must be a positive integer or 'auto', got 'two'", line


def test_auto_takes_the_largest_that_fits_when_none_leaves_the_headroom() -> None:
    """dev at seq 4096: 1 x 2 needs more than an L4 (it accumulates, keeping unsharded gradients),
    2 x 1 fits with less than 10 % to spare: auto takes 2 rather than a 1 that cannot run."""
    data = dev_data()
    data["job"].update(seq_len=4096)
    settings = parse_settings(json.dumps(data), name="dev", source=SOURCE)
    gpu = settings.gpu_nodes.instance
    assert micro_batch(settings.job, gpu, 2) == 2
    one = job_memory(settings.job.model_copy(update={"micro_batch_size": 1}), gpu, 2)
    two = job_memory(settings.job, gpu, 2)
    assert not one.fits(capacity_bytes(gpu))
    assert two.fits(capacity_bytes(gpu)) and two.device_bytes > capacity_bytes(gpu) * (1 - AUTO_HEADROOM)

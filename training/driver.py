"""The driver: checks the options against the cluster, prepares data, runs the TorchTrainer.

It holds no training data: workers read their blocks from the prepared shards (training.shards).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from training import summary as summary_mod
from training.batch import accumulation_steps
from training.options import OptionError, TrainOptions
from training.ray_session import init_ray_at


class TransportGateFailed(Exception):
    """The transport gate stopped the run before training; the message says why."""


class _GateVerdict:
    """Holds rank 0's transport-gate failure for the driver (a Ray actor, see run())."""

    def __init__(self) -> None:
        self.failure: tuple[str, dict[str, Any]] | None = None

    def set(self, message: str, result: dict[str, Any]) -> None:
        self.failure = (message, result)

    def get(self) -> tuple[str, dict[str, Any]] | None:
        return self.failure


def check_model(opts: TrainOptions) -> Any:
    """Load the model config (no weights) and check the sequence length against its positions."""
    from training.model import model_config

    try:
        cfg = model_config(opts.init, opts.shape, opts.model)
    except Exception as exc:
        raise OptionError(f"--model: cannot load the config of {opts.model!r}: {exc}") from None
    max_pos = getattr(cfg, "max_position_embeddings", None)
    if max_pos and opts.seq_len > max_pos:
        raise OptionError(f"--seq-len: {opts.seq_len} is beyond the model's {max_pos} positions")
    if opts.prepared_data is not None and opts.shape != "tiny":  # raw text to tokenize
        from training.data import load_tokenizer

        try:
            load_tokenizer(opts.shape, opts.model)
        except Exception as exc:
            raise OptionError(f"--model: cannot load the tokenizer of {opts.model!r}: {exc}") from None
    if opts.liger is True:
        import liger_kernel.transformers as lk

        model_type = getattr(cfg, "model_type", "")
        if not hasattr(lk, f"apply_liger_kernel_to_{model_type}"):
            raise OptionError(f"--liger: liger-kernel has no patch for model type {model_type!r}")
    return cfg


def init_ray(opts: TrainOptions) -> None:
    init_ray_at(opts.address)


def resolve_workers(opts: TrainOptions) -> tuple[int, bool]:
    """Worker count and whether they use GPUs, checked against the cluster and the batch sizes."""
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0))
    use_gpu = gpus > 0
    workers = opts.num_workers or (gpus if use_gpu else 2)
    if use_gpu and workers > gpus:
        raise OptionError(f"--num-workers: {workers} is more than the cluster's {gpus} GPUs")
    if not use_gpu:
        cpus = int(ray.cluster_resources().get("CPU", 0))
        if workers > cpus:
            raise OptionError(f"--num-workers: {workers} CPU workers but Ray has {cpus} CPUs")
    if opts.emulate_hosts and workers % opts.emulate_hosts:
        raise OptionError(f"--emulate-hosts: {opts.emulate_hosts} hosts must divide the {workers} workers")
    global_batch, micro = opts.global_batch_size, opts.micro_batch_size
    if global_batch is not None and accumulation_steps(global_batch, micro, workers) is None:
        raise OptionError(
            f"--global-batch-size: {global_batch} is not a multiple of micro batch × "
            f"workers = {micro} × {workers} = {micro * workers}"
        )
    return workers, use_gpu


def resolve_data(opts: TrainOptions, vocab_size: int) -> str | None:
    """The prepared shards the workers read (None for random data). Raw jsonl/parquet is prepared
    first, in parallel on the cluster (training.prepare; nothing if already prepared). The driver
    reads only the manifest: the workers read their blocks from the shards themselves."""
    if opts.data == "random":
        return None
    from training import shards

    location = shards.manifest_location(opts.data)
    if location is None:
        from training.prepare import prepare

        assert opts.prepared_data is not None  # set by parse_args for raw data
        prepare(opts.data, opts.prepared_data, seq_len=opts.seq_len, text_field=opts.text_field,
                shape=opts.shape, model=opts.model, log=lambda line: print(line, flush=True))  # fmt: skip
        location = shards.join(opts.prepared_data, shards.MANIFEST)
    try:
        manifest = shards.read_manifest(location)
    except shards.ShardError as exc:
        raise OptionError(f"--data: {exc}") from None
    tok = manifest["tokenizer"]
    if tok["vocab_size"] > vocab_size:
        raise OptionError(
            f"--data: {location} was tokenized by {tok['name']!r} ({tok['vocab_size']} ids), more "
            f"than the model's {vocab_size}-entry vocabulary"
        )
    if opts.init == "pretrained" and tok["name"] not in ("byte", opts.model):
        raise OptionError(
            f"--data: {location} was tokenized by {tok['name']!r}, not by --model {opts.model!r}: "
            "prepare it with the model's tokenizer"
        )
    if manifest["seq_len"] != opts.seq_len:
        raise OptionError(
            f"--seq-len: {opts.seq_len}, but {location} holds blocks of {manifest['seq_len']} tokens"
        )
    print(
        f"[train] data: {manifest['blocks']} blocks of {opts.seq_len} tokens in "
        f"{len(manifest['shards'])} shards ({location})",
        flush=True,
    )
    return location


def run(opts: TrainOptions) -> dict[str, Any]:
    """Run (or resume) the training run; return the summary."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from training.loop import train_loop

    t0 = time.time()
    cfg = check_model(opts)
    init_ray(opts)
    workers, use_gpu = resolve_workers(opts)
    data = resolve_data(opts, int(cfg.vocab_size))
    verdict: Any = ray.remote(num_cpus=0)(_GateVerdict).remote()
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"options": opts.to_dict(), "data": data, "gate_verdict": verdict},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=use_gpu,
            resources_per_worker=None if use_gpu else {"CPU": 1},
        ),
        run_config=RunConfig(
            name=opts.run_name,
            storage_path=opts.storage_path,
            failure_config=FailureConfig(max_failures=opts.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=opts.keep_checkpoints),
        ),
    )
    result = trainer.fit()
    failure = ray.get(verdict.get.remote())
    if failure is not None:
        message, gate = failure
        os.makedirs(opts.output_dir, exist_ok=True)
        record = {"run_name": opts.run_name, "error": message, "transport": gate}
        Path(opts.output_dir, summary_mod.SUMMARY_FILE).write_text(json.dumps(record, indent=2, default=str))
        raise TransportGateFailed(message)
    if result.checkpoint is None:
        raise RuntimeError("the run ended without a checkpoint")
    from training.checkpoint import read_state

    # Only the small state file, from the storage itself: as_directory() would first download the
    # whole checkpoint (model and optimizer shards, ~20 GB for Qwen2.5-1.5B) into the head pod.
    meta = read_state(result.checkpoint.filesystem, result.checkpoint.path)
    summ = summary_mod.summarize(meta, opts.to_dict(), time.time() - t0)
    summ["checkpoint"] = result.checkpoint.path
    for written in summary_mod.write(summ, opts.output_dir, opts.storage_path):
        print(f"[train] wrote {written}", flush=True)
    return summ

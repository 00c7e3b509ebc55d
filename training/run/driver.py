"""The driver: checks the options against the cluster, prepares data, runs the TorchTrainer.

It holds no training data: workers read their blocks from the prepared shards (training.data.shards).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from training.checkpoint import best as best_checkpoint
from training.checkpoint import run_state
from training.checkpoint.notice import driver_running, head_notice, is_preemption
from training.common.errors import find_input_error
from training.options.train import OptionError, TrainOptions, batch_split_error
from training.reporting import summary as summary_mod
from training.run import quiet
from training.run.ray_session import init_ray_at
from training.sizing.batch import accumulation_steps


class RunPreempted(Exception):
    """The run stopped on a notice past its --max-preemptions: a rerun continues it."""

    EXIT = 75  # EX_TEMPFAIL (sysexits.h): try again later


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


def stop_on_input_error() -> Any:
    """A Ray Train callback that ends the run, without FailureConfig retries, when a worker raised
    an InputError: the same data or checkpoint would fail the same way on every attempt.

    How (Ray 2.58 and 2.60, ray/train/v2/_internal): the controller polls the workers and hands
    their errors to the user callbacks' after_exception (UserCallbackHandler, called from
    WorkerGroup.poll_status) before its failure policy sees them. An exception raised there
    leaves the control-loop iteration, which wraps it in a ControllerError; DefaultFailurePolicy
    retries a ControllerError only for worker-group start-up failures, so the decision is RAISE,
    the workers are shut down, and fit() raises that ControllerError, our error inside it.
    """
    from ray.train import UserCallback

    class StopOnInputError(UserCallback):
        def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
            found = find_input_error(worker_exceptions.values())
            if found is not None:
                quiet.hide_input_error_tracebacks()  # the controller logs what it raises here
                raise found

    return StopOnInputError()


def check_model(opts: TrainOptions) -> Any:
    """Load the model config (no weights) and check the sequence length against its positions."""
    from training.model.build import model_config

    try:
        cfg = model_config(opts.init, opts.shape, opts.model)
    except Exception as exc:
        raise OptionError(f"--model: cannot load the config of {opts.model!r}: {exc}") from None
    _check_planned_dims(opts, cfg)
    _check_lora_fits_model(opts, cfg)
    max_pos = getattr(cfg, "max_position_embeddings", None)
    if max_pos and opts.seq_len > max_pos:
        raise OptionError(f"--seq-len: {opts.seq_len} is beyond the model's {max_pos} positions")
    if opts.prepared_data is not None and opts.data_format == "chat":  # chat records to render
        from training.methods.sft import ChatRenderer, load_chat_tokenizer

        try:
            ChatRenderer(load_chat_tokenizer(opts.model), opts.model)
        except ValueError as exc:
            raise OptionError(str(exc)) from None
        except Exception as exc:
            raise OptionError(f"--model: cannot load the tokenizer of {opts.model!r}: {exc}") from None
    elif opts.prepared_data is not None and opts.shape != "tiny":  # raw text to tokenize
        from training.data.batches import load_tokenizer

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


def _check_planned_dims(opts: TrainOptions, cfg: Any) -> None:
    """The model is the one synthesis planned for (memory, micro-batch, cost: config/models.py)."""
    if not opts.planned_dims:
        return
    from training.model.dims import ArchitectureError, Dims

    try:
        dims = Dims.from_config(cfg.to_dict())
    except ArchitectureError as exc:
        raise OptionError(f"--model: {opts.model}: {exc}") from None
    diff = dims.signature_mismatch(opts.planned_dims)
    if diff:
        raise OptionError(
            f"--planned-dims: the job was planned for another architecture than {opts.model} has "
            f"({'; '.join(diff)}): set job.config_json to this model's config.json, or job.model to "
            "the model planned, and deploy again"
        )


def _check_lora_fits_model(opts: TrainOptions, cfg: Any) -> None:
    """LoRA's targets and rank against the model's layers, before any data is prepared. A model
    whose dimensions training/model/dims.py cannot read is left to the worker's check
    (training/model/lora.py)."""
    spec = opts.lora
    if spec is None:
        return
    from training.model.dims import ArchitectureError, Dims
    from training.model.lora_spec import FLAG_NAMES

    try:
        dims = Dims.from_config(cfg.to_dict())
    except ArchitectureError:
        return
    problem = spec.model_problem(dims.linear_shapes(), dims.model_type, FLAG_NAMES)
    if problem:
        raise OptionError(problem[1])


def _same_model(a: str, b: str) -> bool:
    """Two --model references to one model: equal, or one local folder however it was written
    (data prepared with a relative path, a run given the absolute one)."""
    if a == b:
        return True
    try:
        return os.path.isdir(a) and os.path.isdir(b) and os.path.samefile(a, b)
    except OSError:
        return False


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
    if global_batch is not None and accumulation_steps(global_batch, micro or 1, workers) is None:
        raise OptionError(batch_split_error(global_batch, micro, workers))
    return workers, use_gpu


def resolve_data(opts: TrainOptions, vocab_size: int) -> str | None:
    """The prepared shards the workers read (None for random data). Raw jsonl/parquet is prepared
    first, in parallel on the cluster (training.run.prepare; nothing if already prepared). The driver
    reads only the manifest: the workers read their blocks from the shards themselves."""
    if opts.data == "random":
        return None
    from training.data import shards

    location = shards.manifest_location(opts.data)
    if location is None:
        from training.run.prepare import prepare

        assert opts.prepared_data is not None  # set by parse_args for raw data
        prepare(opts.data, opts.prepared_data, seq_len=opts.seq_len, text_field=opts.text_field,
                shape=opts.shape, model=opts.model, max_skipped_fraction=opts.max_skipped_fraction,
                log=lambda line: print(line, flush=True), data_format=opts.data_format,
                too_long=opts.too_long, max_dropped_fraction=opts.max_dropped_fraction)  # fmt: skip
        location = shards.join(opts.prepared_data, shards.MANIFEST)
    try:
        manifest = shards.read_manifest(location)
    except shards.ShardError as exc:
        raise OptionError(f"--data: {exc}") from None
    from training.data import shard_check

    # Sizes, counts and the recorded token bound against the manifest: once, here, before any
    # worker starts, without reading a shard.
    shard_check.validate(location, manifest, vocab_size=vocab_size)
    tok = manifest["tokenizer"]
    if tok["vocab_size"] > vocab_size:
        raise OptionError(
            f"--data: {location} was tokenized by {tok['name']!r} ({tok['vocab_size']} ids), more "
            f"than the model's {vocab_size}-entry vocabulary"
        )
    if opts.init == "pretrained" and tok["name"] != "byte" and not _same_model(tok["name"], opts.model):
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


def epochs_to_steps(opts: TrainOptions, data: str | None, workers: int) -> TrainOptions:
    """--epochs as a step count: the prepared data's training sequences (less --eval-fraction's
    held-out blocks) over the global batch."""
    from training.data import shards
    from training.methods.evaluate import held_out_split
    from training.options.schedule import with_epochs

    assert data is not None  # --epochs needs --data (options/schedule.py)
    blocks = int(shards.read_manifest(data)["blocks"])
    try:
        sequences = held_out_split(blocks, opts.eval_fraction) if opts.eval_fraction else blocks
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    global_batch = opts.global_batch_size or (opts.micro_batch_size or 1) * workers
    opts = with_epochs(opts, sequences=sequences, global_batch=global_batch)
    print(
        f"[train] {opts.epochs:g} epochs of {sequences} sequences at {global_batch} a step: "
        f"{opts.steps} steps, {opts.warmup_steps} of warm-up",
        flush=True,
    )
    return opts


def exportable(opts: TrainOptions) -> bool:
    """A servable folder needs a Hugging Face tokenizer: --model's, which the run used unless it
    trained --shape tiny on random ids or byte-tokenized text."""
    return opts.init == "pretrained" or opts.shape != "tiny" or opts.data_format == "chat"


def export_final(opts: TrainOptions, checkpoint_path: str) -> str:
    """The final checkpoint as a Hugging Face folder under the run (training/export/command.py), from the
    storage directly: read one output file's tensors at a time, nothing gathered on a GPU."""
    from training.data import shards
    from training.export.command import export

    remote = "://" in opts.storage_path
    scheme = opts.storage_path.split("://", 1)[0] if remote else ""
    source = f"{scheme}://{checkpoint_path}" if remote else checkpoint_path
    log = lambda line: print(line, flush=True)  # noqa: E731
    if opts.lora is not None:  # the adapter; the merged model too when asked
        adapter = export(
            source, shards.join(opts.storage_path, opts.run_name, "adapter"), replace=True, log=log
        )
        if not opts.export_merged:
            return adapter
        return export(source, shards.join(opts.storage_path, opts.run_name, "model"), replace=True, log=log,
                      merged=True)  # fmt: skip
    target = shards.join(opts.storage_path, opts.run_name, "model")
    return export(source, target, replace=True, log=log)


def resolve_eval_data(opts: TrainOptions, train: str | None) -> str | None:
    """The prepared eval set of --eval-data (prepared first if raw, like --data), checked to be
    tokenized like the training data; None without --eval-data."""
    if opts.eval_data is None or train is None:
        return None
    from training.data import shards

    location = shards.manifest_location(opts.eval_data)
    if location is None:
        from training.run.prepare import prepare

        assert opts.eval_prepared is not None  # set by parse_args for raw eval data
        prepare(opts.eval_data, opts.eval_prepared, seq_len=opts.seq_len, text_field=opts.text_field,
                shape=opts.shape, model=opts.model, log=lambda line: print(line, flush=True),
                data_format=opts.data_format, too_long=opts.too_long,
                max_dropped_fraction=opts.max_dropped_fraction)  # fmt: skip
        location = shards.join(opts.eval_prepared, shards.MANIFEST)
    try:
        evals, trains = shards.read_manifest(location), shards.read_manifest(train)
    except shards.ShardError as exc:
        raise OptionError(f"--eval-data: {exc}") from None
    for key, what in (("format", "data format"), ("seq_len", "block length"), ("tokenizer", "tokenizer")):
        if evals[key] != trains[key]:
            raise OptionError(
                f"--eval-data: {location} differs from the training data in its {what} "
                f"({evals[key] if key != 'tokenizer' else evals[key].get('name')!r}); prepare both alike"
            )
    print(f"[train] eval data: {evals['blocks']} blocks ({location})", flush=True)
    return location


def resolve_inputs(
    opts: TrainOptions, vocab_size: int, workers: int, record: dict[str, Any] | None
) -> tuple[TrainOptions, Any, Any, dict[str, Any]]:
    """The training and eval data (prepared when raw), the options with --epochs become steps (and
    the run's start decided then: `record` is None until the steps are known), then the run record:
    written only once every input is accepted, so a start refused for its data leaves no run.json."""
    data = resolve_data(opts, vocab_size)
    eval_data = resolve_eval_data(opts, data)
    if opts.epochs is not None:
        opts = epochs_to_steps(opts, data, workers)
        record = run_state.begin(opts)
    assert record is not None  # decided before Ray started, or just now
    run_state.record(opts, record)
    return opts, data, eval_data, record


def _why_it_ended(opts: TrainOptions, exc: Exception) -> Exception:
    """What fit() raising `exc` means: an input error (one line), a preemption past
    --max-preemptions (recorded in run.json; a rerun continues), or the failure itself."""
    found = find_input_error(exc)
    if found is not None:
        return found
    if not is_preemption(exc):
        return exc
    step = run_state.latest_of(opts)
    run_state.end(opts, "preempted", step)
    return RunPreempted(
        f"preempted; the newest complete checkpoint is step {step}: run the same job again, or "
        f"with --resume, to continue run {opts.run_name!r}"
    )


def run(opts: TrainOptions) -> dict[str, Any]:
    """Run (or resume) the training run; return the summary."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    t0 = time.time()
    cfg = check_model(opts)
    # A new run, or one to continue: refused before Ray starts (with --epochs, once the data says
    # how many steps the run has).
    record = run_state.begin(opts) if opts.epochs is None else None
    init_ray(opts)
    logs = quiet.driver(prepares=opts.data != "random")  # library chatter to a log file
    workers, use_gpu = resolve_workers(opts)
    opts, data, eval_data, record = resolve_inputs(opts, int(cfg.vocab_size), workers, record)
    verdict: Any = ray.remote(num_cpus=0)(_GateVerdict).remote()
    trainer = TorchTrainer(
        quiet.train_worker,  # training/run/loop.py's train_loop
        train_loop_config={
            "log_dir": logs,
            "options": opts.to_dict(),
            "data": data,
            "eval_data": eval_data,
            "gate_verdict": verdict,
        },
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=use_gpu,
            resources_per_worker=None if use_gpu else {"CPU": 1},
        ),
        run_config=RunConfig(
            name=opts.run_name,
            storage_path=opts.storage_path,
            # Preemptions (a notice, then the node's end: training/checkpoint/notice.py) have their
            # own budget: a Spot job is not ended by its failure budget (Ray 2.58 and 2.60).
            # Train V2's FailureConfig (ray.train's under RAY_TRAIN_V2_ENABLED, the default since 2.58;
            # ray/train/v2/api/config.py): the type checker reads the V1 class ray.train imports first.
            failure_config=FailureConfig(  # type: ignore[call-arg]
                max_failures=opts.max_failures, max_preemption_failures=opts.max_preemptions
            ),
            checkpoint_config=best_checkpoint.checkpoint_config(opts),
            callbacks=[stop_on_input_error(), head_notice()],
            **quiet.train_logging_config(),
        ),
    )
    try:
        with driver_running():  # what the head pod's preStop waits on (training/checkpoint/notice.py)
            result = trainer.fit()
    except Exception as exc:
        raise _why_it_ended(opts, exc) from None
    failure = ray.get(verdict.get.remote())
    if failure is not None:
        message, gate = failure
        os.makedirs(opts.output_dir, exist_ok=True)
        record = {"run_name": opts.run_name, "error": message, "transport": gate}
        Path(opts.output_dir, summary_mod.SUMMARY_FILE).write_text(json.dumps(record, indent=2, default=str))
        raise TransportGateFailed(message)
    if result.checkpoint is None:
        raise RuntimeError("the run ended without a checkpoint")
    from training.checkpoint.dcp import read_state

    # Only the small state file, from the storage itself: as_directory() would first download the
    # whole checkpoint (model and optimizer shards, ~20 GB for Qwen2.5-1.5B) into the head pod.
    meta = read_state(result.checkpoint.filesystem, result.checkpoint.path)
    summ = summary_mod.summarize(meta, opts.to_dict(), time.time() - t0)
    summ["checkpoint"], summ["run"] = result.checkpoint.path, record
    summ["model"], export_error = None, None
    if opts.export and exportable(opts):
        chosen, why = best_checkpoint.choose(result.best_checkpoints, result.checkpoint)
        exported = read_state(chosen.filesystem, chosen.path)["step"]
        summ["exported"] = {"step": exported, "checkpoint": chosen.path, **why}
        print(f"[train] export: the checkpoint of step {exported} ({why['chosen']})", flush=True)
        try:
            summ["model"] = export_final(opts, chosen.path)
        except OptionError as exc:  # the checkpoint stays; the summary says why there is no model
            export_error = exc
            summ["export_error"] = str(exc)
    elif opts.export:
        print(
            "[train] no export: the byte-level tokenizer of --shape tiny is no Hugging Face tokenizer",
            flush=True,
        )
    for written in summary_mod.write(summ, opts.output_dir, opts.storage_path):
        print(f"[train] wrote {written}", flush=True)
    if export_error is not None:
        raise export_error
    return summ

"""Whether a run starts, continues or is refused: decided by the driver before any worker starts.

A run name is one run. `python -m training` starts a new one; a run name that already has a
checkpoint is refused, so a rerun never "finishes" at once on a checkpoint at or past --steps, nor
records new options for a model trained with the old ones. It continues only
- with --resume: the options that decide what is learned must be the run's (the step count and
  how the run executes may change: HOW_IT_RUNS) and --steps must lie beyond the checkpoint;
- or when the same job is retried: KubeRay's backoffLimit starts the same RayJob again on a new
  cluster with the same entry point, whose --job-id (the RayJob's name) the run recorded.
Ray Train's own restarts (FailureConfig.max_failures) happen inside one fit() and never come here.

The run record, run.json under STORAGE_PATH/RUN_NAME beside Ray Train's files, keeps the options
the run started with and every start (job, the step it started from, its --steps); summary.json
carries it. The step a run continues from is the one Ray Train restores: the latest checkpoint of
its checkpoint_manager_snapshot.json there (Ray 2.58 and 2.60: ray/train/v2/_internal/execution/
checkpoint/checkpoint_manager.py, CheckpointManager's snapshot, read back by a fit() of the same
name and storage).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from training.common.errors import CheckpointError
from training.data import shards
from training.options.train import OptionError, TrainOptions

RUN_FILE = "run.json"
SNAPSHOT = "checkpoint_manager_snapshot.json"

# How a run executes, where it logs and how fast, not what it learns: a resume may change these.
HOW_IT_RUNS = frozenset(
    {
        "steps", "epochs", "resume", "job_id", "output_dir", "storage_path", "address", "num_workers",
        "max_failures", "max_preemptions", "checkpoint_every", "async_checkpoint", "keep_checkpoints",
        "log_every", "report_every",
        "profile", "peak_tflops", "metrics_cluster", "export", "expect_transport", "emulate_hosts",
        "micro_batch_size", "sharding", "compile", "activation_checkpointing", "liger",
        "liger_layers", "reshard_after_forward", "loss_chunk_tokens", "skip_guard_eval",
        "float8_all_gather", "prepared_data", "eval_prepared",
    }
)  # fmt: skip


def differing(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The options that decide what is learned and differ between the run's start and now, as
    'name old -> new'. A default --warmup-steps (10 % of --steps), or one from the same --warmup-ratio,
    follows the step count."""
    out = []
    for key in sorted(set(saved) | set(now)):
        if key in HOW_IT_RUNS or saved.get(key) == now.get(key):
            continue
        ratio = saved.get("warmup_ratio")
        same_ratio = ratio is not None and ratio == now.get("warmup_ratio")
        if key == "warmup_steps" and (
            same_ratio or all(d.get("warmup_steps") == int(d.get("steps") or 0) // 10 for d in (saved, now))
        ):
            continue
        out.append(f"{key} {saved.get(key)!r} -> {now.get(key)!r}")
    return out


def decide(
    options: dict[str, Any], record: dict[str, Any] | None, latest_step: int | None, where: str
) -> dict[str, Any]:
    """The run record after this start (`options` as TrainOptions.to_dict); raises OptionError when
    the run must not start. `latest_step`: the step Ray Train would restore (None: no checkpoint)."""
    start = {
        "job_id": options.get("job_id"),
        "from_step": latest_step or 0,
        "steps": options["steps"],
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if latest_step is None:  # nothing to continue: a new run (a stale record is replaced)
        return {"run_name": options["run_name"], "options": options, "starts": [start]}
    name = options["run_name"]
    starts = (record or {}).get("starts") or [{}]
    retried = options.get("job_id") is not None and starts[-1].get("job_id") == options["job_id"]
    if not (options.get("resume") or retried):
        raise OptionError(
            f"--run-name: {name!r} already has a checkpoint at step {latest_step} ({where}): pass "
            "--resume to continue it with a larger --steps, or choose a new --run-name"
        )
    if record is None or not isinstance(record.get("options"), dict):
        raise OptionError(
            f"--resume: {where} has a checkpoint but no usable {RUN_FILE} (a run of an older version): "
            "the options it was trained with are unknown; start a new --run-name"
        )
    diff = differing(record["options"], options)
    if diff:
        raise OptionError(
            f"--resume: run {name!r} was trained with other options ({'; '.join(diff)}): resume it "
            "with its own, or start a new --run-name"
        )
    if options["steps"] <= latest_step and not retried:
        raise OptionError(
            f"--steps: {options['steps']} is not beyond step {latest_step} of run {name!r}'s "
            "checkpoint: nothing to train; give a larger --steps to continue it"
        )
    return {**record, "starts": [*record.get("starts", []), start]}


def _read_json(fs: Any, path: str) -> Any:
    import pyarrow.fs as pafs

    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return json.loads(f.read())


def latest_step(fs: Any, run_dir: str) -> int | None:
    """The step of the checkpoint Ray Train would restore for this run; None without one."""
    where = f"{run_dir}/{SNAPSHOT}"
    try:
        snapshot = _read_json(fs, where)
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"{where}: unreadable ({exc}): Ray Train cannot restore this run; start a new --run-name"
        ) from None
    latest = (snapshot or {}).get("latest_checkpoint_result") if isinstance(snapshot, dict) else None
    if not latest:
        return None
    step = (latest.get("metrics") or {}).get("step")
    if not isinstance(step, int):
        raise CheckpointError(
            f"{where}: its latest checkpoint reports no step (not a run of python -m training); "
            "start a new --run-name"
        )
    return step


def begin(opts: TrainOptions) -> dict[str, Any]:
    """Check this start against the run's storage; returns the run record to `record` once every
    other input check has passed too (a refused start writes nothing)."""
    location = shards.join(opts.storage_path, opts.run_name)
    fs, run_dir = shards.filesystem(location)
    step = latest_step(fs, run_dir)
    try:
        record = _read_json(fs, f"{run_dir}/{RUN_FILE}")
    except (OSError, ValueError):
        record = None  # unusable: decide() refuses a resume without it
    return decide(opts.to_dict(), record if isinstance(record, dict) else None, step, location)


def record(opts: TrainOptions, run: dict[str, Any]) -> None:
    """Write the run record, whole or not at all (serialized first, then shards.write_atomic): a
    run.json is never left half-written, even by a failed write."""
    data = json.dumps(run, indent=2, default=str).encode()
    location = shards.join(opts.storage_path, opts.run_name)
    fs, run_dir = shards.filesystem(location)
    fs.create_dir(run_dir, recursive=True)
    shards.write_atomic(shards.join(location, RUN_FILE), data)


def end(opts: TrainOptions, outcome: str, step: int | None) -> dict[str, Any]:
    """Mark this start's end in the run record (`outcome`: "preempted"); returns the record."""
    location = shards.join(opts.storage_path, opts.run_name)
    fs, run_dir = shards.filesystem(location)
    try:
        record = _read_json(fs, f"{run_dir}/{RUN_FILE}")
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict) or not record.get("starts"):
        return {}
    record["starts"][-1].update(
        {"ended": outcome, "at_step": step, "ended_at": datetime.now(UTC).isoformat(timespec="seconds")}
    )
    shards.write_atomic(shards.join(location, RUN_FILE), json.dumps(record, indent=2, default=str).encode())
    return dict(record)


def latest_of(opts: TrainOptions) -> int | None:
    """The step of the run's newest complete checkpoint (the one a rerun resumes from)."""
    fs, run_dir = shards.filesystem(shards.join(opts.storage_path, opts.run_name))
    return latest_step(fs, run_dir)

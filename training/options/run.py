"""The run group of `python -m training`: the run's name and whether it starts or continues (rules:
training/checkpoint/run_state.py), where its checkpoints and outputs go, the Ray cluster and workers,
failures,
checkpoints and reporting."""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from training.options.types import OptionError, location_option, non_negative_int, positive

# A RayJob name (DNS-1035 label) or any id of letters, digits, '.', '_', '-'.
_JOB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,99}")


def _job_id(text: str) -> str:
    if not _JOB_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return text


_job_id.__name__ = "job id"


def add_arguments(g: Any) -> None:
    """The "run" group's flags, in their --help order."""
    pos_int = positive(int)
    g.add_argument(
        "--run-name",
        default="train",
        help="Ray Train run name under --storage-path: one run, started once (see --resume)",
    )
    g.add_argument(
        "--resume",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="continue the checkpoints of --run-name (with a larger --steps; every option that "
        "decides what is learned must be as before). Without it a run name that has a checkpoint "
        "is refused, unless the checkpoint is this same job's (--job-id: a retried job resumes)",
    )
    g.add_argument(
        "--job-id",
        type=_job_id,
        metavar="ID",
        help="the job this run belongs to (the RayJob's name on the cluster): a retry of the same "
        "job finds its own checkpoints and resumes them without --resume",
    )
    g.add_argument(
        "--storage-path",
        help="checkpoint storage: local dir or s3://bucket/prefix (default: OUTPUT_DIR/checkpoints)",
    )
    g.add_argument("--output-dir", help="where summary.json and the plot go (default: runs/RUN_NAME)")
    g.add_argument(
        "--num-workers",
        type=pos_int,
        help="training workers (default: the cluster's GPUs, or 2 CPU workers without GPUs)",
    )
    g.add_argument("--address", help="Ray cluster address ('auto' on the cluster); none = local Ray")
    g.add_argument(
        "--max-failures",
        type=non_negative_int,
        default=3,
        help="worker-group restarts from the last checkpoint before giving up",
    )
    g.add_argument(
        "--max-preemptions",
        type=int,
        default=-1,
        metavar="N",
        help="worker-group restarts after a stop notice (Spot reclaim, node drain, preemption), "
        "counted apart from --max-failures; -1: no limit; 0: the run ends as preempted at the first "
        "(exit 75) and a rerun of the same job, or --resume, continues it",
    )
    g.add_argument("--checkpoint-every", type=pos_int, default=50, metavar="STEPS")
    g.add_argument(
        "--async-checkpoint",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write the periodic checkpoints beside training: the step waits only for the copy off "
        "the GPU; a checkpoint counts (resume, best) once written and uploaded; one at a time. The "
        "final checkpoint and one on notice are written whole before the run goes on",
    )
    g.add_argument("--keep-checkpoints", type=int, default=2, help="checkpoints kept (>= 2)")
    g.add_argument("--log-every", type=pos_int, default=1, metavar="STEPS",
                   help="progress line on rank 0 every STEPS steps")  # fmt: skip
    g.add_argument(
        "--report-every",
        type=pos_int,
        default=10,
        metavar="STEPS",
        help="ray.train.report every STEPS steps (and at each checkpoint); every step "
        "is in summary.json. Each report waits for the Train controller's poll",
    )


def check(d: dict[str, Any]) -> None:
    """Names and paths; fills in the defaults that depend on other options."""
    if not d["run_name"] or not re.fullmatch(r"[A-Za-z0-9][\w.-]*", d["run_name"]):
        raise OptionError(f"--run-name: use letters, digits, '-', '_', '.'; got {d['run_name']!r}")
    if d["max_preemptions"] < -1:
        raise OptionError(f"--max-preemptions: -1 (no limit) or a count >= 0, got {d['max_preemptions']}")
    if d["keep_checkpoints"] < 2:
        raise OptionError(f"--keep-checkpoints: must be >= 2, got {d['keep_checkpoints']}")
    if d["output_dir"] is None:
        d["output_dir"] = os.path.join("runs", d["run_name"])
    if "://" in d["output_dir"]:
        raise OptionError(f"--output-dir: a local folder, got {d['output_dir']!r}")
    d["output_dir"] = location_option("--output-dir", d["output_dir"], output=True)
    if d["storage_path"] is None:
        d["storage_path"] = os.path.join(d["output_dir"], "checkpoints")
    # Ray Train's storage: S3 or a local folder (file:// would be a second spelling of the latter).
    d["storage_path"] = location_option("--storage-path", d["storage_path"], output=True, s3_only=True)

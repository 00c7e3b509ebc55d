"""The flags that decide whether a run starts or continues (rules: training/run_state.py)."""

from __future__ import annotations

import argparse
import re
from typing import Any

# A RayJob name (DNS-1035 label) or any id of letters, digits, '.', '_', '-'.
_JOB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,99}")


def _job_id(text: str) -> str:
    if not _JOB_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return text


_job_id.__name__ = "job id"


def add_run_arguments(g: Any) -> None:
    """--run-name, --resume and --job-id, into the parser's "run" group."""
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

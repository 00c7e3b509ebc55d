"""The run group of `python -m training`: where the run's checkpoints and outputs go, the Ray
cluster and workers, failures, checkpoints and reporting (the start/resume flags: run_flags.py)."""

from __future__ import annotations

import os
import re
from typing import Any

from training.option_types import OptionError, location_option, non_negative_int, positive
from training.run_flags import add_run_arguments


def add_arguments(g: Any) -> None:
    """The "run" group's flags, in their --help order."""
    pos_int = positive(int)
    add_run_arguments(g)  # --run-name, --resume, --job-id
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
    g.add_argument("--checkpoint-every", type=pos_int, default=50, metavar="STEPS")
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

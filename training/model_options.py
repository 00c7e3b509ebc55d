"""`python -m training`'s flags for the model it plans for, checked without torch: the shape
`--init random` builds and the dimensions synthesis planned the job for (config/models.py), which
the driver checks against the model it loads (training/driver.py)."""

from __future__ import annotations

import re
from typing import Any

_SIGNATURE = re.compile(r"^[a-z_]+=\d+(,[a-z_]+=\d+)*$")


class ModelOptionError(ValueError):
    """A bad model flag: the message names it."""


def add_arguments(g: Any, shapes: tuple[str, ...]) -> None:
    g.add_argument(
        "--shape",
        choices=shapes,
        default="qwen2.5-1.5b",
        help="architecture for --init random (training/model_configs/, or tiny/small)",
    )
    g.add_argument(
        "--planned-dims",
        default=None,
        metavar="SIGNATURE",
        help="the dimensions the job was planned for (training.dims.Dims.signature, set by the chart): "
        "the job stops, naming the difference, when --model has others",
    )


def check(d: dict[str, Any]) -> None:
    if d["planned_dims"] is not None and not _SIGNATURE.match(d["planned_dims"]):
        raise ModelOptionError(
            f"--planned-dims: {d['planned_dims']!r} is not a signature like layers=28,hidden=3584,..."
        )

"""The "metrics and network" flags of `python -m training`: the transport the job requires, emulated
hosts, the profiler's steps, the MFU's peak and the CloudWatch metrics' cluster."""

from __future__ import annotations

import argparse
import re
from typing import Any

from training.options.types import OptionError, positive

TRANSPORTS = ("auto", "efa", "socket", "ib", "any")


def add_arguments(g: Any) -> None:
    """The "metrics and network" group's flags, in their --help order."""
    pos_int, pos_float = positive(int), positive(float)
    g.add_argument(
        "--expect-transport",
        choices=TRANSPORTS,
        default="auto",
        help="inter-node NCCL transport the job requires before training (auto: "
        "'any' on CPU or one node, else $RAYTRAIN_EXPECT_TRANSPORT or 'any')",
    )
    g.add_argument(
        "--emulate-hosts",
        type=pos_int,
        metavar="N",
        help="testing on one machine: split the workers into N hosts as NCCL sees them (one "
        "NCCL_HOSTID each), so NCCL uses its network transport between them and --sharding auto "
        "sees N nodes",
    )
    g.add_argument(
        "--profile",
        metavar="FIRST:LAST",
        help="record steps FIRST..LAST (1-based) with torch.profiler; rank 0 writes a Chrome trace "
        "and a per-kernel table to OUTPUT_DIR/profile",
    )
    g.add_argument(
        "--peak-tflops",
        type=pos_float,
        help="peak bf16 TFLOP/s per GPU for MFU when the GPU is not in the table",
    )
    g.add_argument(
        "--metrics-cluster",
        type=_cluster_name,
        metavar="NAME",
        help="on EKS: rank 0 writes each step's tokens/s, MFU, loss and step time (and the held-out "
        "loss, perplexity and accuracy on the steps that evaluate) as CloudWatch "
        "embedded-metric-format lines to its container's stdout, with dimension ClusterName=NAME",
    )


def _cluster_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]{0,99}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an EKS cluster name")
    return text


def check_profile(text: str, steps: int) -> str:
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    first, last = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if not m or not 1 <= first <= last <= steps:
        raise OptionError(
            f"--profile: FIRST:LAST with 1 <= FIRST <= LAST <= --steps ({steps}), e.g. 4:6; got {text!r}"
        )
    return f"{first}:{last}"


def profile_range(text: str | None) -> tuple[int, int] | None:
    """The (first, last) steps of a checked --profile value."""
    if not text:
        return None
    first, last = text.split(":")
    return int(first), int(last)

"""How long a checkpoint takes, and what follows from it: the pod's grace period for a checkpoint on
notice, and a Spot job's checkpoint interval.

A checkpoint holds what trains: fp32 master weights and AdamW's two fp32 moments, 12 bytes per trained
parameter (a LoRA run: its adapters; the frozen base is the --model it started from:
training/checkpoint/dcp.py), sharded evenly over the ranks. A rank's save is its share copied off the
GPU and written (DCP, one file per rank), then Ray Train uploads the node's files to S3.

Rates (bytes per second) are planning figures until bench/checkpoint_stall.py has measured them on
the GPU machine (its command is in docs/jobs.md, "What an interruption costs"; no device time was
left for it when this landed): a local NVMe write of ~1 GB/s per rank for DCP's synchronous save, and
for the upload S3's guidance of up to ~100 Gb/s per instance across parallel connections
("Performance design patterns for Amazon S3", horizontal scaling), of which a quarter is taken.

The interval: with a checkpoint every T seconds costing C seconds, and interruptions at a rate of
lambda per hour, the expected loss per hour is C/T (checkpointing) + lambda*T/2 (half an interval of work
lost per interruption); it is least at T* = sqrt(2 C / lambda) (J. W. Young, "A first order approximation
to the optimum checkpoint interval", CACM 17(9), 1974, doi:10.1145/361147.361115: Tc = sqrt(2 Ts Tf) for a
save of Ts and a mean time between failures Tf = 1/lambda). With a checkpoint on notice most interruptions
lose nothing; the interval guards the ones that come without notice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BYTES_PER_TRAINED_PARAM = 12  # fp32 master + AdamW exp_avg + exp_avg_sq
# DCP's synchronous save per rank, GPU -> host -> local file: a planning figure (see above).
SAVE_BYTES_PER_S = 1.0e9
# What an asynchronous save costs the step, as a share of the synchronous save's: the goal
# (< 10 %), a planning figure until bench/checkpoint_stall.py measures it.
ASYNC_STALL_OF_SYNC = 0.1
UPLOAD_BYTES_PER_S = 3.0e9  # per node to S3: see above
NOTICE_POLL_S = 1  # Ray Train's preemption watcher's poll (RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S on the pods)
GRACE_MARGIN_S = 15  # the drain call, Ray's barrier, and the preStop's own margin
MIN_GRACE_S = 30  # Kubernetes' default terminationGracePeriodSeconds
# "A warning that is issued two minutes before Amazon EC2 stops or terminates your Spot Instance"
# (EC2 User Guide, Spot Instance interruption notices:
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
SPOT_NOTICE_S = 120


@dataclass(frozen=True)
class CheckpointTime:
    """One checkpoint of a job: its bytes and seconds."""

    trained_params: int
    ranks: int
    ranks_per_node: int

    @property
    def total_bytes(self) -> int:
        return BYTES_PER_TRAINED_PARAM * self.trained_params

    @property
    def rank_bytes(self) -> int:
        return math.ceil(self.total_bytes / self.ranks)

    @property
    def save_s(self) -> float:
        """Every rank writes its share at once: the step waits this long for a synchronous save."""
        return self.rank_bytes / SAVE_BYTES_PER_S

    @property
    def upload_s(self) -> float:
        return self.rank_bytes * self.ranks_per_node / UPLOAD_BYTES_PER_S

    @property
    def complete_s(self) -> float:
        """From the save's start to a checkpoint in S3 that a resume can use."""
        return self.save_s + self.upload_s

    def grace_s(self, step_s: float) -> int:
        """terminationGracePeriodSeconds for a checkpoint on notice: the notice reaching the ranks,
        the step in flight finishing, the checkpoint written and uploaded, and a margin."""
        need = NOTICE_POLL_S + step_s + self.complete_s + GRACE_MARGIN_S
        return max(MIN_GRACE_S, math.ceil(need))


def interval_steps(cost_s: float, step_s: float, interruptions_per_hour: float, steps: int) -> int:
    """Young's optimum interval in steps (at least 1, at most `steps`) for a checkpoint costing
    `cost_s` of the step's time."""
    if interruptions_per_hour <= 0 or step_s <= 0:
        return steps
    best_s = math.sqrt(2 * max(cost_s, 1e-3) * 3600 / interruptions_per_hour)
    return max(1, min(steps, round(best_s / step_s)))


def expected_hours(
    train_h: float, *, cost_s: float, interval_s: float, interruptions_per_hour: float, lost_s: float
) -> float:
    """Hours of GPU time a job of `train_h` hours of steps takes with checkpoints of `cost_s` every
    `interval_s` seconds and interruptions at `interruptions_per_hour`, each costing `lost_s` seconds
    (the work since the last checkpoint, restart and resume)."""
    with_checkpoints = train_h * (1 + cost_s / interval_s) if interval_s > 0 else train_h
    return with_checkpoints * (1 + interruptions_per_hour * lost_s / 3600)


# Planning figures for interruptions (not measured here):
# - a Spot GPU node's interruptions per hour: the Spot Instance Advisor gives bands of "frequency of
#   interruption" per month (<5 % ... >20 %) and shows the large GPU types in the top band; one in
#   twenty hours is taken for them, well above that band's floor (>20 % a month is > 0.0003 per hour);
# - what an interruption costs besides lost steps: a new node started, the image pulled, the group
#   restarted and the checkpoint read (docs/jobs.md, "What an interruption costs").
SPOT_INTERRUPTIONS_PER_HOUR = 0.05
RESTART_S = 600.0

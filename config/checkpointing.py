"""A job's checkpoint in time (training/sizing/checkpoint_time.py) and what the cluster must allow for
it: the GPU worker pods' grace period, in which a checkpoint on notice is written
(training/checkpoint/notice.py); and how often the job checkpoints, the one place that decides it (the
chart's RayJob arguments, `raytrain plan` and `raytrain cost` read it from here)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from config.settings.infrastructure import CapacityType
from config.settings.job_rules import ON_DEMAND_CHECKPOINT_EVERY
from config.step_prediction import predict
from training.sizing.checkpoint_time import (
    ASYNC_STALL_OF_SYNC,
    SPOT_INTERRUPTIONS_PER_HOUR,
    CheckpointTime,
    interval_steps,
)

if TYPE_CHECKING:
    from config.settings import Settings

# A step in flight when the notice comes: the grace period allows this much for it to finish. `raytrain
# plan` compares the step-time model's prediction with it and warns when a step is longer.
STEP_ALLOWANCE_S = 10.0


def trained_params(settings: Settings) -> int:
    """The parameters a checkpoint holds: all of them, or a LoRA run's adapters."""
    job = settings.job
    dims = job.model_plan.dims
    spec = job.lora_spec
    if spec is None:
        return dims.params
    return dims.layers * spec.params_per_layer(dims.linear_shapes())


def checkpoint_time(settings: Settings) -> CheckpointTime:
    gpu = settings.gpu_nodes.instance
    return CheckpointTime(trained_params(settings), settings.num_workers, gpu.gpus)


def stop_grace_seconds(settings: Settings) -> int:
    """terminationGracePeriodSeconds of the GPU worker pods: a step, the checkpoint written and
    uploaded, and the margins."""
    return checkpoint_time(settings).grace_s(STEP_ALLOWANCE_S)


def periodic_stall_s(settings: Settings) -> float:
    """What one periodic checkpoint costs the step: asynchronous (the loop's default), the step
    waits for the copy off the GPU only."""
    return checkpoint_time(settings).save_s * ASYNC_STALL_OF_SYNC


def spot_interval_steps(settings: Settings, step_s: float) -> int:
    """Young's interval (training/sizing/checkpoint_time.py) in steps of `step_s` for this job's
    checkpoint at Spot's interruption rate. With job.epochs the step count is not known before the
    data is prepared: the interval is then not bounded by job.steps."""
    job = settings.job
    bound = job.steps if job.epochs is None else 2**31 - 1
    young = interval_steps(periodic_stall_s(settings), step_s, SPOT_INTERRUPTIONS_PER_HOUR, bound)
    # At most one asynchronous save is in flight: one due while the previous is still being written
    # and uploaded would wait for it, in the step. So no sooner than a save takes to complete.
    in_flight = math.ceil(checkpoint_time(settings).complete_s / step_s) if step_s > 0 else 1
    return max(young, min(in_flight, bound))


@dataclass(frozen=True)
class CheckpointInterval:
    """Steps between the job's periodic checkpoints, and why that many."""

    steps: int
    set_by: str  # "job.checkpoint_every", "on-demand default" or "spot default"
    why: str


def checkpoint_interval(settings: Settings) -> CheckpointInterval:
    """job.checkpoint_every as set; unset, ON_DEMAND_CHECKPOINT_EVERY, or on a Spot group the interval
    that loses least to checkpoints and interruptions, at the step the step-time model predicts for the
    job (Settings refuses an unset interval on Spot for a GPU the model does not know)."""
    job, gpu = settings.job, settings.gpu_nodes
    if job.checkpoint_every is not None:
        return CheckpointInterval(job.checkpoint_every, "job.checkpoint_every", "set in the settings")
    if gpu.capacity_type is not CapacityType.SPOT:
        return CheckpointInterval(
            ON_DEMAND_CHECKPOINT_EVERY,
            "on-demand default",
            f"job.checkpoint_every unset: the default for {gpu.capacity_type.value} nodes",
        )
    step_s = predict(settings).step_s
    steps = spot_interval_steps(settings, step_s)
    return CheckpointInterval(
        steps,
        "spot default",
        f"job.checkpoint_every unset on Spot: sized from a {periodic_stall_s(settings):.2f} s checkpoint "
        f"stall, a predicted {step_s:.2f} s step and {SPOT_INTERRUPTIONS_PER_HOUR:g} interruptions/h "
        f"(every ~{steps * step_s / 60:.0f} min)",
    )

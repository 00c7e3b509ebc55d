"""The job's length and learning-rate schedule settings, checked by the training command's own rules
(training/options/schedule.py): steps or epochs, warmup_steps or warmup_ratio, one schedule name."""

from __future__ import annotations

from typing import Any

from config.settings.base import FieldError
from training.options.schedule import SCHEDULES


def check_lr_schedule(value: str | None) -> str | None:
    """A field validator of job.lr_schedule: the training command's schedule names."""
    if value is not None and value not in SCHEDULES:
        raise ValueError(f"{value!r} is not a schedule; use one of {', '.join(SCHEDULES)}")
    return value


def check_length_and_warmup(job: Any) -> None:
    """One of steps and epochs, one of warmup_steps and warmup_ratio (JobSettings, which imports
    this module); FieldError naming the field otherwise."""
    if job.epochs is not None and "steps" in job.model_fields_set:
        raise FieldError(("epochs",), "set steps or epochs, not both: epochs replace steps; remove steps")
    if job.epochs is not None and job.data == "random":
        raise FieldError(("epochs",), "needs real data (random token ids have no epochs); set steps")
    if job.warmup_steps is not None and job.warmup_ratio is not None:
        raise FieldError(("warmup_ratio",), "set warmup_steps or warmup_ratio, not both")
    if job.epochs is None and job.warmup_steps is not None and job.warmup_steps >= job.steps > 1:
        raise FieldError(
            ("warmup_steps",),
            f"{job.warmup_steps} is not fewer than steps ({job.steps}): the learning rate would "
            "never reach lr; lower it or use warmup_ratio",
        )

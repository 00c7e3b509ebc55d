"""Rules of the job settings kept out of workload.py: the length and learning-rate schedule, checked by
the training command's own rules (training/options/schedule.py: steps or epochs, warmup_steps or
warmup_ratio, one schedule name), the checkpoint interval, and where the job's data may lie."""

from __future__ import annotations

from typing import Any

from config.settings.base import FieldError
from training.common.hub_token import SECRET_ARN_RE
from training.options.schedule import SCHEDULES

# job.checkpoint_every when unset on On-Demand or Capacity Block nodes (on Spot: sized from the save's
# time and the interruption rate, config/checkpointing.py).
ON_DEMAND_CHECKPOINT_EVERY = 50


def check_token_secret(value: str | None) -> str | None:
    """A field validator of job.hf_token_secret: a Secrets Manager secret's or an SSM parameter's ARN."""
    if value is not None and not SECRET_ARN_RE.match(value):
        raise ValueError(
            f"{value!r} is not a secret's ARN: the full ARN of a Secrets Manager secret "
            "(arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-AbCdEf, `aws secretsmanager "
            "describe-secret --secret-id NAME` prints it) or of an SSM SecureString parameter "
            "(arn:aws:ssm:REGION:ACCOUNT:parameter/NAME)"
        )
    return value


def check_lr_schedule(value: str | None) -> str | None:
    """A field validator of job.lr_schedule: the training command's schedule names."""
    if value is not None and value not in SCHEDULES:
        raise ValueError(f"{value!r} is not a schedule; use one of {', '.join(SCHEDULES)}")
    return value


def check(job: Any) -> None:
    """Every rule of this module on a JobSettings (which imports it); FieldError naming the field."""
    check_length_and_warmup(job)
    check_checkpoint_every(job.checkpoint_every, job, default=False)
    check_data_reach(job)
    check_token_use(job)


def check_token_use(job: Any) -> None:
    """A token only for a model the job fetches from the hub."""
    if job.hf_token_secret and not job.model_from_hub:
        raise FieldError(
            ("hf_token_secret",),
            f"is set but job.model ({job.model}) is not a Hugging Face id: nothing would use the "
            "token; drop it",
        )


def check_data_reach(job: Any) -> None:
    """Data at a path inside the container is on each pod's own disk. A job of several GPU nodes
    prepares and reads its data on all of them (the preparation's Ray Data tasks run on any worker,
    training/run/prepare.py refuses a local path on a cluster of several nodes), so that path would
    have to be in the image on every node: refused, naming S3 as the way."""
    if job.nodes < 2:
        return
    for field in ("data", "eval_data"):
        value = getattr(job, field)
        if value and value.startswith("/"):
            raise FieldError(
                (field,),
                f"{value!r} is a path inside the container, on each of the job's {job.nodes} nodes' own "
                "disk, which the preparation and the workers do not share: upload it "
                "(`aws s3 cp --recursive DIR s3://BUCKET/PREFIX/`) and set an s3:// URI",
            )


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


def check_checkpoint_every(every: int | None, job: Any, *, default: bool) -> None:
    """A periodic checkpoint within the run's steps: job.checkpoint_every as set (`default`: the
    On-Demand default, which Settings checks, knowing the capacity type)."""
    if every is None or job.epochs is not None or every <= job.steps:
        return
    what = f"left unset, the On-Demand default {every} is" if default else f"{every} is"
    raise FieldError(
        ("checkpoint_every",),
        f"{what} more than steps ({job.steps}): the run would never checkpoint; set it to at most "
        f"{job.steps}",
    )

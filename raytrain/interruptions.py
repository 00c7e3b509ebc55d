"""What `raytrain plan` says of a job's checkpoints and interruptions: the checkpoint's size and time
(training/sizing/checkpoint_time.py), whether a checkpoint on notice fits the worker pods' grace period
(and, on Spot, EC2's two-minute notice), and a Spot job's expected time and cost with interruptions beside
On-Demand."""

from __future__ import annotations

from typing import Any

from config.checkpointing import checkpoint_time, stop_grace_seconds
from config.settings import Settings
from config.settings.infrastructure import CapacityType
from training.sizing.checkpoint_time import (
    ASYNC_STALL_OF_SYNC,
    GRACE_MARGIN_S,
    NOTICE_POLL_S,
    RESTART_S,
    SPOT_INTERRUPTIONS_PER_HOUR,
    SPOT_NOTICE_S,
    expected_hours,
    interval_steps,
)


def interruptions(settings: Settings, step_s: float, per_hour_usd: float | None) -> dict[str, Any]:
    job = settings.job
    ct = checkpoint_time(settings)
    grace = stop_grace_seconds(settings)
    need = NOTICE_POLL_S + step_s + ct.complete_s + GRACE_MARGIN_S
    spot = settings.gpu_nodes.capacity_type is CapacityType.SPOT
    warnings = []
    if need > grace:
        warnings.append(
            f"a checkpoint on notice needs ~{need:.0f} s (a {step_s:.1f} s step, {ct.complete_s:.0f} s "
            f"to write and upload {ct.total_bytes / 1e9:.1f} GB) but the worker pods' grace period is "
            f"{grace} s: a stop would lose the steps since the last checkpoint"
        )
    if spot and need > SPOT_NOTICE_S:
        warnings.append(
            f"on Spot, EC2 reclaims the instance {SPOT_NOTICE_S} s after its interruption notice: a "
            f"checkpoint on notice (~{need:.0f} s) cannot be written in time; lower checkpoint_every or use "
            "On-Demand"
        )
    train_h = job.steps * step_s / 3600
    # The periodic checkpoints are asynchronous (the loop's default): the step waits for the copy off
    # the GPU only.
    stall_s = ct.save_s * ASYNC_STALL_OF_SYNC
    interval = job.checkpoint_every * step_s
    # With a checkpoint on notice an interruption loses the restart only; without one (the notice
    # too short) half an interval of steps on average too.
    lost_s = RESTART_S + (0 if need <= min(grace, SPOT_NOTICE_S) else interval / 2)
    rate = SPOT_INTERRUPTIONS_PER_HOUR
    spot_h = expected_hours(
        train_h, cost_s=stall_s, interval_s=interval, interruptions_per_hour=rate, lost_s=lost_s
    )
    od_h = expected_hours(train_h, cost_s=stall_s, interval_s=interval, interruptions_per_hour=0, lost_s=0)
    return {
        "checkpoint_gb": ct.total_bytes / 1e9,
        "save_s": ct.save_s,
        "upload_s": ct.upload_s,
        "grace_s": grace,
        "notice_needs_s": need,
        "warnings": warnings,
        "interval_s": interval,
        "stall_s": stall_s,
        "spot": {
            "interruptions_per_hour": rate,
            "lost_s_each": lost_s,
            "expected_hours": spot_h,
            "on_demand_hours": od_h,
            # No price where the region has none (raytrain plan still shows the hours).
            "expected_cost_usd": None if per_hour_usd is None else spot_h * per_hour_usd,
            "on_demand_cost_usd": None if per_hour_usd is None else od_h * per_hour_usd,
            "checkpoint_every_for_spot": interval_steps(stall_s, step_s, rate, job.steps),
        },
    }


def _usd(value: float | None) -> str:
    return "no price here" if value is None else f"${value:.2f}"


def lines(result: dict[str, Any], spot: bool) -> list[str]:
    s = result["spot"]
    out = [
        f"checkpoint: {result['checkpoint_gb']:.1f} GB, written in ~{result['save_s']:.0f} s and uploaded in "
        f"~{result['upload_s']:.0f} s; worker pods' grace period {result['grace_s']} s "
        f"(a checkpoint on notice needs ~{result['notice_needs_s']:.0f} s)",
        f"{'Spot' if spot else 'on Spot'}: ~{s['expected_hours']:.2f} h, {_usd(s['expected_cost_usd'])} at "
        f"{s['interruptions_per_hour']} interruptions/h (each ~{s['lost_s_each'] / 60:.0f} min lost) "
        f"against ~{s['on_demand_hours']:.2f} h, {_usd(s['on_demand_cost_usd'])} uninterrupted at the "
        f"same rate; checkpoint interval for that rate: {s['checkpoint_every_for_spot']} steps",
    ]
    return out + [f"[warning] {w}" for w in result["warnings"]]

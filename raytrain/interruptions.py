"""What `raytrain plan` says of a job's checkpoints and interruptions: the checkpoint's size and time
(training/sizing/checkpoint_time.py), whether a checkpoint on notice fits the worker pods' grace period
(and, on Spot, EC2's two-minute notice), and a Spot job's expected time and cost with interruptions beside
On-Demand."""

from __future__ import annotations

from typing import Any

from config.checkpointing import (
    checkpoint_interval,
    checkpoint_time,
    periodic_stall_s,
    spot_interval_steps,
    stop_grace_seconds,
)
from config.settings import Settings
from config.settings.infrastructure import CapacityType
from training.sizing.checkpoint_time import (
    GRACE_MARGIN_S,
    NOTICE_POLL_S,
    RESTART_S,
    SPOT_INTERRUPTIONS_PER_HOUR,
    SPOT_NOTICE_S,
    expected_hours,
)


def interruptions(
    settings: Settings,
    step_s: float,
    per_hour_usd: float | None,
    on_demand_per_hour_usd: float | None = None,
) -> dict[str, Any]:
    """The figures `raytrain plan` and `raytrain cost` both print. `per_hour_usd`: the job's running
    cost as priced (Spot at its measured price or its ceiling); `on_demand_per_hour_usd`: the same
    nodes On-Demand (default: the same rate)."""
    od_rate = per_hour_usd if on_demand_per_hour_usd is None else on_demand_per_hour_usd
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
    stall_s = periodic_stall_s(settings)
    every = checkpoint_interval(settings)
    interval = every.steps * step_s
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
        # Which interval the job runs with, and why (config/checkpointing.py, as the RayJob gets it).
        "checkpoint_every": {"steps": every.steps, "set_by": every.set_by, "why": every.why},
        "spot": {
            "interruptions_per_hour": rate,
            "lost_s_each": lost_s,
            "expected_hours": spot_h,
            "on_demand_hours": od_h,
            # No price where the region has none (raytrain plan still shows the hours).
            "expected_cost_usd": None if per_hour_usd is None else spot_h * per_hour_usd,
            "on_demand_cost_usd": None if od_rate is None else od_h * od_rate,
            "checkpoint_every_for_spot": spot_interval_steps(settings, step_s),
        },
    }


def _usd(value: float | None) -> str:
    return "no price here" if value is None else f"${value:.2f}"


def lines(result: dict[str, Any], spot: bool) -> list[str]:
    s, every = result["spot"], result["checkpoint_every"]
    out = [
        f"checkpoint: {result['checkpoint_gb']:.1f} GB, written in ~{result['save_s']:.0f} s and uploaded in "
        f"~{result['upload_s']:.0f} s; worker pods' grace period {result['grace_s']} s "
        f"(a checkpoint on notice needs ~{result['notice_needs_s']:.0f} s)",
        f"{'Spot' if spot else 'on Spot'}: ~{s['expected_hours']:.2f} h, {_usd(s['expected_cost_usd'])} at "
        f"{s['interruptions_per_hour']} interruptions/h (each ~{s['lost_s_each'] / 60:.0f} min lost) "
        f"against ~{s['on_demand_hours']:.2f} h, {_usd(s['on_demand_cost_usd'])} On-Demand, uninterrupted; "
        f"checkpoint interval for that rate: {s['checkpoint_every_for_spot']} steps",
        f"checkpoint every {every['steps']} steps ({every['set_by']}: {every['why']})",
    ]
    return out + [f"[warning] {w}" for w in result["warnings"]]

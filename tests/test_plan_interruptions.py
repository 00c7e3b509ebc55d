"""`raytrain plan`'s checkpoint and interruption figures (raytrain/interruptions.py): the grace period
against a checkpoint on notice, Spot's two-minute notice, and the expected cost with interruptions."""

from __future__ import annotations

from config.settings.infrastructure import CapacityType
from raytrain.interruptions import interruptions, lines
from tests.chart_render import ALL, settings_of
from training.sizing.checkpoint_time import SPOT_NOTICE_S


def _spot(settings):  # type: ignore[no-untyped-def]
    gpu = settings.gpu_nodes.model_copy(update={"capacity_type": CapacityType.SPOT})
    return settings.model_copy(update={"gpu_nodes": gpu})


def test_a_short_step_fits_the_grace_period_without_warnings() -> None:
    for name in ALL:
        got = interruptions(settings_of(name), step_s=1.0, per_hour_usd=10.0)
        assert got["warnings"] == [], (name, got["warnings"])
        assert got["notice_needs_s"] <= got["grace_s"]
        spot = got["spot"]
        assert spot["expected_hours"] > spot["on_demand_hours"] > 0
        assert spot["expected_cost_usd"] == spot["expected_hours"] * 10.0


def test_a_step_longer_than_the_grace_period_and_spots_notice_is_warned() -> None:
    settings = _spot(settings_of(ALL[0]))
    got = interruptions(settings, step_s=float(SPOT_NOTICE_S), per_hour_usd=10.0)
    text = " ".join(lines(got, spot=True))
    assert "grace period is" in text and "two-minute" not in text  # the words are the module's
    assert f"{SPOT_NOTICE_S} s after its interruption notice" in text
    # Without a checkpoint on notice an interruption also loses half an interval of steps.
    short = interruptions(settings, step_s=1.0, per_hour_usd=10.0)
    assert got["spot"]["lost_s_each"] > short["spot"]["lost_s_each"]
    on_demand = interruptions(settings_of(ALL[0]), step_s=float(SPOT_NOTICE_S), per_hour_usd=10.0)
    assert not any("interruption notice" in w for w in on_demand["warnings"])

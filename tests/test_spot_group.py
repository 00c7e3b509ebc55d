"""A Spot GPU group of several types, end to end: the synthesized node group and launch template, the
RayJob's checkpoint interval when job.checkpoint_every is unset, and `raytrain cost` beside `raytrain
plan`. The fixture is an environment unlike the shipped ones: H200 nodes (p5e and p5en, 32 and 16 EFA
cards), Spot, in us-east-2, with a LoRA-free 7B job and no checkpoint_every."""

from __future__ import annotations

import json
import math
import shlex
from functools import cache
from pathlib import Path

import pytest

from config.catalogue import CATALOGUE
from config.checkpointing import checkpoint_interval, checkpoint_time, periodic_stall_s
from config.costs import estimate
from config.loader import parse_settings
from config.prices import PRICES, RegionPrices
from config.settings import Settings
from config.settings.job_rules import ON_DEMAND_CHECKPOINT_EVERY
from config.step_prediction import predict
from tests.chart_render import render
from tests.test_settings import dev_data
from training.sizing.checkpoint_time import SPOT_INTERRUPTIONS_PER_HOUR

TYPES = ["p5en.48xlarge", "p5e.48xlarge"]
SOURCE = "config/environments/h200-spot.yaml"


def h200_spot_data(**job: object) -> dict:
    data = dev_data()
    data["region"] = "us-east-2"
    data["vpc"]["availability_zones"] = ["us-east-2a", "us-east-2b", "us-east-2c"]
    gpu = {k: v for k, v in data["gpu_nodes"].items() if k != "instance_type"}
    data["gpu_nodes"] = {**gpu, "availability_zone": "us-east-2c", "capacity_type": "SPOT",
                         "instance_types": TYPES, "placement_group": False, "max_size": 3}  # fmt: skip
    # Three concurrent jobs' heads and submitters, one pair per m7i.xlarge (the system headroom rule).
    data["system_nodes"] = {**data["system_nodes"], "max_size": 3}
    data["job"] = {k: v for k, v in data["job"].items() if k != "checkpoint_every"}
    data["job"].update({"model": "Qwen/Qwen2.5-7B", "steps": 3000, "seq_len": 4096, "global_batch_size": 64})
    data["job"].update(job)
    return data


def settings_of(**job: object) -> Settings:
    return parse_settings(json.dumps(h200_spot_data(**job)), name="h200-spot", source=SOURCE)


def rayjob_flag(settings: Settings, flag: str) -> str:
    (job,) = [o for o in render(settings) if o["kind"] == "RayJob"]
    words = shlex.split(job["spec"]["entrypoint"])
    return words[words.index(flag) + 1]


# --- the checkpoint interval -----------------------------------------------------------------------


def test_a_spot_job_without_checkpoint_every_gets_youngs_interval_in_its_rayjob() -> None:
    settings = settings_of()
    step_s = predict(settings).step_s
    # Young's T* = sqrt(2 C / lambda) for the asynchronous save's stall, in steps, computed here
    # from its parts; no sooner than a save takes to complete (one in flight at a time).
    young = round(math.sqrt(2 * periodic_stall_s(settings) * 3600 / SPOT_INTERRUPTIONS_PER_HOUR) / step_s)
    floor = math.ceil(checkpoint_time(settings).complete_s / step_s)
    want = min(settings.job.steps, max(1, young, floor))
    every = checkpoint_interval(settings)
    assert (every.steps, every.set_by) == (want, "spot default")
    assert want != ON_DEMAND_CHECKPOINT_EVERY, "the fixture must tell the two defaults apart"
    assert rayjob_flag(settings, "--checkpoint-every") == str(want)
    assert f"{SPOT_INTERRUPTIONS_PER_HOUR:g} interruptions/h" in every.why


def test_an_explicit_interval_wins_and_on_demand_keeps_its_default() -> None:
    assert rayjob_flag(settings_of(checkpoint_every=7), "--checkpoint-every") == "7"
    data = h200_spot_data()
    data["gpu_nodes"] = {**data["gpu_nodes"], "capacity_type": "ON_DEMAND", "instance_types": TYPES[:1]}
    on_demand = parse_settings(json.dumps(data), name="h200-od", source=SOURCE)
    assert checkpoint_interval(on_demand).set_by == "on-demand default"
    assert rayjob_flag(on_demand, "--checkpoint-every") == str(ON_DEMAND_CHECKPOINT_EVERY)


def test_unset_intervals_that_cannot_be_decided_are_refused_by_name() -> None:
    from config.loader import SettingsError

    data = h200_spot_data(steps=20)
    data["gpu_nodes"] = {**data["gpu_nodes"], "capacity_type": "ON_DEMAND", "instance_types": TYPES[:1]}
    with pytest.raises(SettingsError, match=r"job\.checkpoint_every: left unset, the On-Demand default 50 is "
                       r"more than steps \(20\)"):  # fmt: skip
        parse_settings(json.dumps(data), name="h200-od", source=SOURCE)
    # On Spot the interval is bounded by the steps instead.
    assert checkpoint_interval(settings_of(steps=20)).steps <= 20
    # A GPU the step-time model has no figures for: no interval to size, so it must be set.
    data = h200_spot_data()
    data["gpu_nodes"] = {**data["gpu_nodes"], "instance_types": ["p6-b200.48xlarge"]}
    with pytest.raises(
        SettingsError, match=r"job\.checkpoint_every: left unset on Spot.*no figures for B200"
    ):
        parse_settings(json.dumps(data), name="b200", source=SOURCE)


# --- the synthesized node group ---------------------------------------------------------------------


@cache
def cluster_template(out: Path) -> dict:
    from stacks.synth_all import synthesize

    settings = settings_of()
    synthesize(settings, out)
    return json.loads((out / settings.name / f"{settings.stack_prefix}-Cluster.template.json").read_text())


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return cluster_template(tmp_path_factory.mktemp("spot-cdk"))


def test_the_node_group_lists_every_type_and_the_launch_template_none(template: dict) -> None:
    groups = [r for r in template["Resources"].values() if r["Type"] == "AWS::EKS::Nodegroup"]
    (gpu,) = [g for g in groups if g["Properties"]["Labels"].get("role") == "gpu-worker"]
    props = gpu["Properties"]
    assert props["CapacityType"] == "SPOT"
    assert props["InstanceTypes"] == TYPES
    data = template["Resources"][props["LaunchTemplate"]["Id"]["Ref"]]["Properties"]["LaunchTemplateData"]
    # EKS: a type in the launch template and types through the API cannot both be given.
    assert "InstanceType" not in data
    # EKS chooses the Spot allocation strategy (price-capacity-optimized): nothing here may set a
    # market, a price or a strategy of its own.
    assert "InstanceMarketOptions" not in data
    text = json.dumps(template)
    for key in ("AllocationStrategy", "SpotAllocationStrategy", "SpotMaxPrice", "MixedInstancesPolicy"):
        assert key not in text
    # The EFA interfaces both types have: p5en's 16 cards, which p5e (32) has too.
    layout = [
        (i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in data["NetworkInterfaces"]
    ]
    assert layout == CATALOGUE["p5en.48xlarge"].efa_interface_layout()
    assert layout == CATALOGUE["p5e.48xlarge"].efa_interface_layout()[:16]
    # The autoscaler's node template advertises the EFA devices a node of the group has.
    tags = props["Tags"]
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa"] == "16"


# --- cost beside plan ---------------------------------------------------------------------------------


def priced(settings: Settings) -> RegionPrices:
    # p5e has no pinned rate (config/prices.py UNPRICED): a --live answer stands in, p5e the dearer.
    base = PRICES[settings.region]
    return RegionPrices(region=base.region, ec2_per_hour={**base.ec2_per_hour, "p5e.48xlarge": 70.0})


def test_a_group_is_priced_at_its_dearest_type() -> None:
    settings = settings_of()
    est = estimate(settings, priced(settings))
    gpu_line = next(line for line in est.job if line.item.startswith("GPU nodes of the job"))
    assert "p5en.48xlarge or p5e.48xlarge, priced at the dearest" in gpu_line.item
    assert gpu_line.quantity.endswith("× $70.0000")
    # Spot measured at $30/h: Spot's cost beside the dearest type's On-Demand rate.
    spot = estimate(settings, priced(settings), spot_per_hour=30.0)
    assert spot.running_on_demand_with(2) - spot.running_with(2) == pytest.approx(2 * (70.0 - 30.0))


def test_cost_prints_the_interruption_figures_plan_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from raytrain import cost, plan

    settings = settings_of()
    (tmp_path / "h200-spot.yaml").write_text(json.dumps(h200_spot_data()), encoding="utf-8")
    monkeypatch.setitem(PRICES, settings.region, priced(settings))

    def run(module, as_json: bool) -> str:  # type: ignore[no-untyped-def]
        args = argparse.Namespace(env="h200-spot", config_dir=tmp_path, summary=None, json=as_json,
                                  live=False, profile=None, compare=None)  # fmt: skip
        assert module.run(args) == 0
        return capsys.readouterr().out

    from_cost = json.loads(run(cost, True))["interruptions"]
    from_plan = json.loads(run(plan, True))["interruptions"]
    assert from_cost == from_plan
    figures = from_cost["spot"]
    assert figures["expected_hours"] > figures["on_demand_hours"] > 0
    # Spot priced at its ceiling (no --live), the dearest type's On-Demand rate, on both sides.
    assert figures["on_demand_cost_usd"] / figures["on_demand_hours"] == pytest.approx(
        figures["expected_cost_usd"] / figures["expected_hours"]
    )
    every = checkpoint_interval(settings)
    assert from_cost["checkpoint_every"] == {"steps": every.steps, "set_by": "spot default", "why": every.why}
    text = run(cost, False)
    assert f"checkpoint every {every.steps} steps (spot default:" in text
    assert "On-Demand, uninterrupted" in text and "Spot: ~" in text


@pytest.mark.parametrize(
    ("spot", "want"),
    [
        ({"p5en.48xlarge": 31.0, "p5e.48xlarge": 36.5}, 36.5),
        ({"p5en.48xlarge": 31.0, "p5e.48xlarge": None}, None),
    ],
)
def test_live_prices_ask_for_every_type_and_take_the_dearest_spot_price(
    monkeypatch: pytest.MonkeyPatch, spot: dict[str, float | None], want: float | None
) -> None:
    from raytrain import cost
    from tests.test_pricing import _pricing_stub

    settings = settings_of()
    client, stub = _pricing_stub(settings.region, {"p5e.48xlarge": "70.0", "p5en.48xlarge": "63.296",
                                                   "m7i.xlarge": "0.2016"})  # fmt: skip
    monkeypatch.setattr(cost, "live_clients", lambda profile, region: (client, object()))
    asked: list[str] = []
    monkeypatch.setattr(
        "raytrain.pricing.spot_rate", lambda ec2, itype, zone, now: asked.append(itype) or spot[itype]
    )
    with stub:
        prices, rate = cost.region_prices(settings, live=True, profile=None)
    assert sorted(asked) == sorted(TYPES) and rate == want
    assert prices is not None
    est = estimate(settings, prices, spot_per_hour=rate)
    # No Spot price for one type: the group at its ceiling, the dearest On-Demand rate.
    assert est.gpu_pricing == ("spot" if want else "spot-ceiling")
    assert est.gpu_node_per_hour - est.gpu_node_on_demand_per_hour == pytest.approx((want or 70.0) - 70.0)

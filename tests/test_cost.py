"""Cost per hour and per billion tokens, against figures worked out by hand."""

from __future__ import annotations

import json

import pytest

from config.catalogue import CATALOGUE
from config.loader import environment_names, load_settings
from config.prices import PRICES, PRICES_AS_OF, UNPRICED, PriceError, prices_for
from raytrain import cost
from raytrain.cli import main


def with_(settings, **sections):
    """A copy of settings with some fields of some sections replaced."""
    update = {name: getattr(settings, name).model_copy(update=fields) for name, fields in sections.items()}
    return settings.model_copy(update=update)


# dev by hand (us-west-2, table of 2026-07-20):
#   control plane                         0.10
#   1 × m7i.xlarge                        0.2016
#   1 × 100 GiB gp3 at 250 MiB/s: (100 × 0.08 + (250 − 125) × 0.04) / 730 = 13 / 730 = 0.0178082
#   1 NAT gateway                         0.045
#   3 interface endpoints × 2 AZs × 0.01  0.06
#   GPU group at 0 nodes                  0
#   idle                                  0.4244082
#   job: 2 × g6.12xlarge 4.6016 = 9.2032; 2 × (200 × 0.08 + 5) / 730 = 42 / 730 = 0.0575342
#   running                               9.6851425
DEV_IDLE = 0.10 + 0.2016 + 13 / 730 + 0.045 + 0.06
DEV_RUNNING = DEV_IDLE + 9.2032 + 42 / 730


def test_dev_idle_and_running_by_hand():
    settings = load_settings("dev")
    est = cost.estimate(settings)
    assert est.idle_per_hour == pytest.approx(0.4244082, abs=1e-6)
    assert est.idle_per_hour == pytest.approx(DEV_IDLE)
    assert est.running_per_hour == pytest.approx(9.6851425, abs=1e-6)
    assert est.job_nodes == 2


def test_after_a_job_only_the_autoscalers_scale_down_is_billed_by_hand():
    """dev: 2 added g6.12xlarge with their roots, 9.2032 + 42/730 $/h, for at most 5 min unneeded
    + 5 min drain and shutdown = 10 min: 1.6142 $ per job. The head's inspection time (600 s in
    dev) runs on the system node and adds nothing; a GPU group kept at 2 nodes adds nothing either."""
    dev = load_settings("dev")
    est = cost.estimate(dev)
    assert est.after_job_minutes == 10
    assert est.after_job == pytest.approx((9.2032 + 42 / 730) * 10 / 60)
    assert est.after_job == pytest.approx(1.5435, abs=1e-4)
    # Independent of how long the head stays for inspection.
    longer = cost.estimate(with_(dev, job={"ttl_seconds_after_finished": 86_400}))
    assert longer.after_job == est.after_job and longer.idle_per_hour == est.idle_per_hour
    assert cost.estimate(with_(dev, gpu_nodes={"min_size": 2})).after_job == 0


def test_dev_idle_meets_the_goal():
    assert cost.estimate(load_settings("dev")).idle_per_hour <= 0.45


def test_prod_by_hand():
    # 3 AZs, 3 NAT gateways, 2 system nodes; GPU group min 0, 2 job nodes of 300 GiB.
    settings = with_(load_settings("prod"), gpu_nodes={"min_size": 0})
    est = cost.estimate(settings)
    idle = 0.10 + 2 * 0.2016 + 2 * 13 / 730 + 3 * 0.045 + 3 * 3 * 0.01
    assert idle == pytest.approx(0.7638164, abs=1e-6)
    assert est.idle_per_hour == pytest.approx(idle)
    running = idle + 2 * 4.6016 + 2 * (300 * 0.08 + 5) / 730
    assert est.running_per_hour == pytest.approx(running)


def test_gpu_nodes_kept_at_idle_count_once():
    """A minimum of 1 GPU node is idle cost; a 2-node job adds only the second."""
    base = load_settings("dev")
    settings = with_(base, gpu_nodes={"min_size": 1})
    est = cost.estimate(settings)
    node = 4.6016 + 21 / 730
    assert est.idle_per_hour == pytest.approx(DEV_IDLE + node)
    assert est.running_per_hour == pytest.approx(DEV_RUNNING)
    assert est.running_with(3) == pytest.approx(DEV_IDLE + 3 * node)


def test_p5_node_price():
    settings = with_(
        load_settings("dev"),
        gpu_nodes={"instance_type": "p5.48xlarge", "placement_group": True},
    )
    est = cost.estimate(settings)
    assert est.running_per_hour - est.idle_per_hour == pytest.approx(2 * (55.04 + 21 / 730))


def test_per_billion_tokens_by_hand():
    settings = load_settings("dev")
    summary = {
        "tokens_per_s": 20_000.0,
        "nodes": 2,
        "steps": 50,
        "global_batch_size": 16,
        "wall_time_s": 900.0,
        "options": {"seq_len": 2048},
    }
    result = cost.token_cost(settings, summary)
    # 9.6851425 $/h / (20,000 tok/s × 3600 s/h) × 1e9 = 134.5159 $ per billion tokens.
    assert result.per_billion_tokens == pytest.approx(134.5159, abs=1e-3)
    # End to end: 50 × 16 × 2048 = 1,638,400 tokens in 900 s at 9.6851425 $/h = 2.4212856 $,
    # = 1477.835 $ per billion tokens.
    assert result.end_to_end_per_billion_tokens == pytest.approx(1477.835, abs=0.01)


def test_per_billion_tokens_uses_the_runs_node_count():
    settings = load_settings("dev")
    one = cost.token_cost(settings, {"tokens_per_s": 10_000.0, "nodes": 1})
    per_hour = DEV_IDLE + 4.6016 + 21 / 730
    assert one.per_hour == pytest.approx(per_hour)
    assert one.per_billion_tokens == pytest.approx(per_hour / 36_000_000 * 1e9)
    assert one.end_to_end_per_billion_tokens is None


@pytest.mark.parametrize(
    ("summary", "message"),
    [
        ({"nodes": 2}, "tokens_per_s is None"),
        ({"tokens_per_s": 0, "nodes": 2}, "tokens_per_s is 0"),
        ({"tokens_per_s": "fast"}, "tokens_per_s is 'fast'"),
        ({"tokens_per_s": 10.0, "nodes": -1}, "nodes is -1"),
        # make train-local's summary: not a measurement of the GPU nodes the environment prices.
        ({"tokens_per_s": 900.0, "nodes": 1, "device": "cpu"}, r"a CPU run \(device 'cpu'.*g6\.12xlarge"),
    ],
)
def test_bad_summary_is_named(summary, message):
    with pytest.raises(cost.SummaryError, match=message):
        cost.token_cost(load_settings("dev"), summary, source="run/summary.json")


def test_every_catalogue_type_is_priced_in_every_region():
    """Every type has a pinned rate or a stated reason for having none (UNPRICED), not both."""
    for region, prices in PRICES.items():
        assert set(prices.ec2_per_hour) | set(UNPRICED) == set(CATALOGUE), region
        assert not set(prices.ec2_per_hour) & set(UNPRICED), region


def test_an_unpriced_type_says_why_and_what_prices_it():
    settings = load_settings("dev")
    gpu = settings.gpu_nodes.model_copy(
        update={"instance_type": "p5e.48xlarge", "placement_group": False, "max_size": 2}
    )
    with pytest.raises(PriceError, match=r"p5e\.48xlarge in us-west-2.*Capacity Blocks.*--live"):
        cost.estimate(settings.model_copy(update={"gpu_nodes": gpu}))


def test_unknown_region_says_what_is_covered():
    with pytest.raises(PriceError, match=r"eu-west-1.*us-east-1, us-east-2, us-west-2.*2026-07-20"):
        prices_for("eu-west-1")


@pytest.mark.parametrize("env", environment_names())
def test_every_environment_is_priced(env):
    """Priced where the pinned table has the region and the types; elsewhere a PriceError says
    what the table covers (raytrain cost --live asks AWS then)."""
    settings = load_settings(env)
    types = {settings.system_nodes.instance_type, settings.gpu_nodes.instance_type}
    if settings.region not in PRICES or types & set(UNPRICED):
        with pytest.raises(PriceError, match=r"no pinned (On-Demand )?prices? for"):
            cost.estimate(settings)
        return
    est = cost.estimate(settings)
    assert 0 < est.idle_per_hour <= est.running_per_hour


def test_endpoint_count_matches_the_synthesized_network(synthesized):
    t = synthesized["dev"].template("Network")
    interface = [
        r
        for r in t["Resources"].values()
        if r["Type"] == "AWS::EC2::VPCEndpoint" and r["Properties"].get("VpcEndpointType") == "Interface"
    ]
    line = next(
        line for line in cost.estimate(synthesized["dev"].settings).idle if line.item == "interface endpoints"
    )
    azs = len(synthesized["dev"].settings.vpc.availability_zones)
    assert line.per_hour == pytest.approx(len(interface) * azs * 0.01)


# ---------------------------------------------------------------- the command


def test_command_prints_table(capsys):
    assert main(["cost", "--env", "dev"]) == 0
    out = capsys.readouterr().out
    assert "idle total" in out and "0.4244" in out
    assert "running total (2 GPU nodes)" in out and "9.6851" in out
    flat = " ".join(out.split())  # the console wraps long lines
    assert "after each job" in flat and "$1.54 per job" in flat
    # dev's two example teams: the deployed job lands in the first one's queue.
    assert (
        "queue: the job lands in team research's queue (quota 1 of 2 GPU nodes, may borrow any idle node)"
        in flat
    )
    assert PRICES_AS_OF in out


def test_command_json_with_summary(tmp_path, capsys):
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"tokens_per_s": 20_000.0, "nodes": 2}))
    assert main(["cost", "--env", "dev", "--summary", str(summary), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["idle_per_hour"] == pytest.approx(DEV_IDLE)
    assert data["running_per_hour"] == pytest.approx(DEV_RUNNING)
    assert data["after_job"] == pytest.approx((DEV_RUNNING - DEV_IDLE) / 6)
    assert data["tokens"]["per_billion_tokens"] == pytest.approx(134.5159, abs=1e-3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "nope"], "nope"),
        (["--env", "dev", "--summary", "missing.json"], "missing.json: no such file"),
    ],
)
def test_command_errors_exit_2_with_one_message(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["cost", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_command_rejects_non_json_summary(tmp_path, capsys):
    bad = tmp_path / "summary.json"
    bad.write_text("{not json")
    assert main(["cost", "--env", "dev", "--summary", str(bad)]) == 2
    assert "not a readable JSON summary" in capsys.readouterr().err


def test_cost_page_states_what_a_job_leaves_billed():
    """docs/cost.md's figures for after a prod job are the estimate's."""
    from pathlib import Path

    section = (Path(__file__).resolve().parents[1] / "docs" / "cost.md").read_text()
    section = " ".join(section.split())
    prod = load_settings("prod")
    est = cost.estimate(prod)
    assert f"at most {est.after_job_minutes} minutes" in section
    assert f"about ${est.after_job:.2f}" in section
    # What the same job left billed before: both GPU nodes for the head's whole inspection time.
    held = est.job_nodes * est.gpu_node_per_hour * prod.job.ttl_seconds_after_finished / 3600
    assert f"about ${held:.2f}" in section


def test_synthesis_takes_the_estimate_from_config_not_from_the_cli():
    """The estimate lives beside the prices (config/costs.py) and the CLI prints that one. That
    synthesis imports no raytrain command is the layer rule tests/test_import_layers.py checks on
    every import (deferred ones included), without starting a second interpreter here."""
    import config.costs

    assert cost.estimate is config.costs.estimate

"""What `raytrain cost` says for Spot and Capacity Block GPU groups, and prices from AWS itself (the
Price List API and the Spot price history, stubbed with botocore's Stubber, which checks every
request and response against the API model) for `--live` and regions the pinned table lacks."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from config.costs import estimate
from config.loader import load_settings
from config.prices import PRICES, PriceError
from config.settings import CapacityType
from raytrain import cost, pricing
from raytrain.cli import main

DEV = load_settings("dev")
G6 = PRICES["us-west-2"].ec2_per_hour["g6.12xlarge"]


def with_gpu(settings: Any, **fields: Any) -> Any:
    return settings.model_copy(update={"gpu_nodes": settings.gpu_nodes.model_copy(update=fields)})


def _job_gpu_line(est: Any) -> Any:
    return next(line for line in est.job if line.item.startswith("GPU nodes of the job"))


def test_spot_is_bounded_by_the_on_demand_rate_and_says_so() -> None:
    est = estimate(with_gpu(DEV, capacity_type=CapacityType.SPOT))
    assert est.gpu_pricing == "spot-ceiling"
    assert _job_gpu_line(est).per_hour == pytest.approx(2 * G6)
    assert any("priced here at the On-Demand rate" in n and "--live" in n for n in est.notes)


def test_spot_at_a_measured_price() -> None:
    est = estimate(with_gpu(DEV, capacity_type=CapacityType.SPOT), spot_per_hour=1.5)
    assert est.gpu_pricing == "spot"
    assert _job_gpu_line(est).per_hour == pytest.approx(3.0)


def test_capacity_block_instance_hours_are_left_out_and_said() -> None:
    block = with_gpu(
        DEV,
        capacity_type=CapacityType.CAPACITY_BLOCK,
        capacity_reservation_id="cr-0123456789abcdef0",
        placement_group=False,
    )
    est = estimate(block)
    assert est.gpu_pricing == "capacity-block"
    assert _job_gpu_line(est).per_hour == 0.0
    # The root volumes are still billed per hour.
    assert est.running_per_hour == pytest.approx(estimate(DEV).running_per_hour - 2 * G6)
    assert any("paid upfront" in n and "cr-0123456789abcdef0" in n for n in est.notes)


def test_a_targeted_on_demand_reservation_is_noted() -> None:
    est = estimate(with_gpu(DEV, capacity_reservation_id="cr-0123456789abcdef0", placement_group=False))
    assert est.gpu_pricing == "on-demand"
    assert any("billed at" in n and "running or not" in n for n in est.notes)


# --- prices from AWS ----------------------------------------------------------------------------


def _product(instance_type: str, usd: str) -> str:
    return json.dumps(
        {
            "product": {"attributes": {"instanceType": instance_type}},
            "terms": {
                "OnDemand": {
                    "SKU.JRTCKXETXF": {
                        "priceDimensions": {
                            "SKU.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": usd}}
                        }
                    }
                }
            },
        }
    )


def _pricing_stub(region: str, rates: dict[str, str]) -> tuple[Any, Stubber]:
    client = boto3.client(
        "pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    stub = Stubber(client)
    for itype in sorted(rates):
        stub.add_response(
            "get_products",
            {"FormatVersion": "aws_v1", "PriceList": [_product(itype, rates[itype])]},
            {
                "ServiceCode": "AmazonEC2",
                "FormatVersion": "aws_v1",
                "Filters": [
                    {"Type": "TERM_MATCH", "Field": "instanceType", "Value": itype},
                    {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
                    {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
                    {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
                    {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
                    {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"},
                ],
            },
        )
    return client, stub


def test_live_prices_for_a_region_the_table_lacks() -> None:
    client, stub = _pricing_stub("eu-west-1", {"g6.12xlarge": "5.1200000000", "m7i.xlarge": "0.2226000000"})
    with stub:
        prices = pricing.live_prices(client, "eu-west-1", ["g6.12xlarge", "m7i.xlarge"], dt.date(2026, 12, 3))
    assert prices.ec2_per_hour == {"g6.12xlarge": 5.12, "m7i.xlarge": 0.2226}
    assert prices.as_of == "2026-12-03 (Price List API)"
    assert "which eu-west-1 may not share" in prices.notes[0]


def test_two_prices_for_one_type_are_refused() -> None:
    client = boto3.client(
        "pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    with Stubber(client) as stub:
        stub.add_response(
            "get_products", {"PriceList": [_product("g6.12xlarge", "5.12"), _product("g6.12xlarge", "6.0")]}
        )
        with pytest.raises(PriceError, match="several prices"):
            pricing.on_demand_rate(client, "g6.12xlarge", "eu-west-1")


def test_spot_rate_is_the_newest_entry() -> None:
    ec2 = boto3.client("ec2", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="x")
    now = dt.datetime(2026, 12, 3, 12, tzinfo=dt.UTC)
    with Stubber(ec2) as stub:
        stub.add_response(
            "describe_spot_price_history",
            {
                "SpotPriceHistory": [
                    {
                        "InstanceType": "g6.12xlarge",
                        "SpotPrice": "1.90",
                        "Timestamp": now - dt.timedelta(hours=3),
                    },
                    {
                        "InstanceType": "g6.12xlarge",
                        "SpotPrice": "1.75",
                        "Timestamp": now - dt.timedelta(hours=1),
                    },
                ]
            },
            {
                "InstanceTypes": ["g6.12xlarge"],
                "ProductDescriptions": ["Linux/UNIX"],
                "AvailabilityZone": "us-west-2b",
                "StartTime": now,
                "MaxResults": 10,
            },
        )
        assert pricing.spot_rate(ec2, "g6.12xlarge", "us-west-2b", now) == 1.75


def _eu_dev(monkeypatch: pytest.MonkeyPatch) -> None:
    import config.loader

    data = DEV.model_dump(mode="json")
    data["region"] = "eu-west-1"
    data["vpc"]["availability_zones"] = ["eu-west-1a", "eu-west-1b"]
    data["gpu_nodes"]["availability_zone"] = "eu-west-1b"
    eu = type(DEV).model_validate(data)
    monkeypatch.setattr(config.loader, "load_settings", lambda name, *a, **k: eu)


def test_command_prices_an_unpinned_region_from_aws(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    _eu_dev(monkeypatch)
    client, stub = _pricing_stub("eu-west-1", {"g6.12xlarge": "5.12", "m7i.xlarge": "0.2226"})
    monkeypatch.setattr(cost, "live_clients", lambda profile, region: (client, object()))
    with stub:
        assert main(["cost", "--env", "dev", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["region"] == "eu-west-1" and "Price List API" in data["prices_as_of"]
    assert data["job"][0]["per_hour"] == pytest.approx(2 * 5.12)
    assert any("may not share" in n for n in data["notes"])


def test_command_without_credentials_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: Any
) -> None:
    _eu_dev(monkeypatch)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    assert main(["cost", "--env", "dev"]) == 2
    err = capsys.readouterr().err
    assert "no pinned prices for region 'eu-west-1'" in err and "raytrain cost --live" in err, err


def test_command_live_spot(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import config.loader

    spot_dev = with_gpu(DEV, capacity_type=CapacityType.SPOT)
    monkeypatch.setattr(config.loader, "load_settings", lambda name, *a, **k: spot_dev)
    client, stub = _pricing_stub("us-west-2", {"g6.12xlarge": "4.6016", "m7i.xlarge": "0.2016"})
    monkeypatch.setattr(cost, "live_clients", lambda profile, region: (client, object()))
    monkeypatch.setattr("raytrain.pricing.spot_rate", lambda ec2, itype, zone, now: 1.25)
    with stub:
        assert main(["cost", "--env", "dev", "--live"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Spot price seen now in us-west-2b ($1.2500/h" in out

"""The pretend AWS account of `raytrain capacity`'s tests: moto for EC2, a stub of our own for Service
Quotas (tests/capacity/).

moto 5.2 implements offerings, zones, instances and instance types, but not capacity reservations
or Spot placement scores (NotImplementedError), and its Service Quotas mock only knows the `vpc`
service. `Ec2` below wraps moto's client and adds those calls; both fakes check every request
against botocore's API model, so a call the real API would reject fails here too.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.validate import validate_parameters
from moto import mock_aws

from config.loader import environments_dir
from raytrain import capacity
from raytrain.aws import CapacityApi
from raytrain.cli import build_parser

ENV_FILE_LINES = environments_dir() / "dev.yaml"


def client_error(code: str, message: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


def validate_call(client: Any, operation: str, params: dict[str, Any]) -> None:
    shape = client.meta.service_model.operation_model(operation).input_shape
    validate_parameters(params, shape)  # raises ParamValidationError like the real client


class QuotasStub:
    """Service Quotas for EC2 codes: applied values, else AWS defaults, else NoSuchResource."""

    def __init__(self, world: World, region: str) -> None:
        self.world = world
        self.region = region
        self._model = boto3.client("service-quotas", region_name=region)

    def get_service_quota(self, **params: Any) -> dict[str, Any]:
        validate_call(self._model, "GetServiceQuota", params)
        if self.world.quota_error:
            raise client_error(self.world.quota_error, "rejected", "GetServiceQuota")
        applied = self.world.applied_quotas.get(self.region, {})
        if params["ServiceCode"] != "ec2" or params["QuotaCode"] not in applied:
            raise client_error("NoSuchResourceException", "not applied", "GetServiceQuota")
        return self._quota(params["QuotaCode"], applied[params["QuotaCode"]])

    def get_aws_default_service_quota(self, **params: Any) -> dict[str, Any]:
        validate_call(self._model, "GetAWSDefaultServiceQuota", params)
        code = params["QuotaCode"]
        if code not in self.world.default_quotas:
            raise client_error("NoSuchResourceException", code, "GetAWSDefaultServiceQuota")
        return self._quota(code, self.world.default_quotas[code])

    @staticmethod
    def _quota(code: str, value: float) -> dict[str, Any]:
        return {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "Value": value}}


class Ec2:
    """moto's EC2 client plus capacity reservations and Spot placement scores."""

    def __init__(self, world: World, region: str) -> None:
        self.world = world
        self.region = region
        self._moto = boto3.client("ec2", region_name=region)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._moto, name)

    def get_spot_placement_scores(self, **params: Any) -> dict[str, Any]:
        validate_call(self._moto, "GetSpotPlacementScores", params)
        assert params["SingleAvailabilityZone"] is True
        zones = self._moto.describe_availability_zones()["AvailabilityZones"]
        by_name = {z["ZoneName"]: z["ZoneId"] for z in zones}
        return {
            "SpotPlacementScores": [
                {"Region": self.region, "AvailabilityZoneId": by_name[name], "Score": score}
                for name, score in self.world.scores.items()
                if name in by_name
            ]
        }

    def create_capacity_reservation(self, **params: Any) -> dict[str, Any]:
        validate_call(self._moto, "CreateCapacityReservation", params)
        self.world.create_calls.append(params)
        code = self.world.create_errors.get(params["AvailabilityZone"])
        if code:
            raise client_error(code, "simulated", "CreateCapacityReservation")
        rid = "cr-" + secrets.token_hex(9)[:17]
        tags = params.get("TagSpecifications", [{}])[0].get("Tags", [])
        self.world.reservations[rid] = {
            "CapacityReservationId": rid,
            "InstanceType": params["InstanceType"],
            "AvailabilityZone": params["AvailabilityZone"],
            "TotalInstanceCount": params["InstanceCount"],
            "AvailableInstanceCount": params["InstanceCount"],
            "InstanceMatchCriteria": params.get("InstanceMatchCriteria", "open"),
            "State": "active",
            "Tags": tags,
            "Region": self.region,
        }
        if self.world.after_create:
            self.world.after_create(rid)
        return {"CapacityReservation": dict(self.world.reservations[rid])}

    def cancel_capacity_reservation(self, **params: Any) -> dict[str, Any]:
        validate_call(self._moto, "CancelCapacityReservation", params)
        if self.world.cancel_error:
            raise client_error(self.world.cancel_error, "simulated", "CancelCapacityReservation")
        self.world.reservations[params["CapacityReservationId"]]["State"] = "cancelled"
        return {"Return": True}

    def describe_capacity_reservations(self, **params: Any) -> dict[str, Any]:
        validate_call(self._moto, "DescribeCapacityReservations", params)
        found = [r for r in self.world.reservations.values() if r["Region"] == self.region]
        if "CapacityReservationIds" in params:
            ids = params["CapacityReservationIds"]
            found = [r for r in found if r["CapacityReservationId"] in ids]
            if not found:
                raise client_error("InvalidCapacityReservationId.NotFound", "no such", "DescribeCR")
        for flt in params.get("Filters", []):
            name, values = flt["Name"], flt["Values"]
            if name == "state":
                found = [r for r in found if r["State"] in values]
            elif name.startswith("tag:"):
                key = name[4:]
                found = [r for r in found if any(t["Key"] == key and t["Value"] in values for t in r["Tags"])]
        return {"CapacityReservations": found}


class World:
    """The pretend AWS account of one test."""

    def __init__(self) -> None:
        self.applied_quotas: dict[str, dict[str, float]] = {}
        self.default_quotas: dict[str, float] = {"L-DB2E81BA": 0.0, "L-417A185B": 0.0}
        self.quota_error: str | None = None
        self.scores: dict[str, int] = {}
        self.create_errors: dict[str, str] = {}
        self.create_calls: list[dict[str, Any]] = []
        self.cancel_error: str | None = None
        self.after_create: Any = None
        self.reservations: dict[str, dict[str, Any]] = {}

    def factory(self, region: str) -> CapacityApi:
        return CapacityApi(region, Ec2(self, region), QuotasStub(self, region))

    def live(self) -> list[str]:
        return [r for r, v in self.reservations.items() if v["State"] != "cancelled"]

    def run_instance(self, region: str, instance_type: str, **extra: Any) -> None:
        # moto accepts any AMI id unless MOTO_ENABLE_AMI_VALIDATION is set; listing its
        # thousands of AMIs would cost seconds.
        boto3.client("ec2", region_name=region).run_instances(
            ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType=instance_type, **extra
        )


def fake_account(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The `world` fixture's body: moto for EC2 and a clean credential environment."""
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("COLUMNS", "250")  # rich reads it: keep table rows on one line
    # moto builds ~2,000 default AMIs per region backend otherwise: seconds per test.
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws():
        yield World()


def copy_environments(tmp_path: Path) -> Path:
    """A copy of the real environment files: --write must never touch the repository's."""
    target = tmp_path / "environments"
    shutil.copytree(environments_dir(), target)
    return target


def run(world: World, envdir: Path, *argv: str) -> int:
    args = build_parser().parse_args(["capacity", "--config-dir", str(envdir), *argv])
    return capacity.run(args, api_factory=world.factory)


def rows(out: str) -> list[str]:
    """Table rows of the plan, in rank order."""
    return [line for line in out.splitlines() if line.startswith("│ ") and "│ region" not in line]

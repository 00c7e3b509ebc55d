"""`raytrain preflight`'s capacity checks for a Spot group of several types (gpu_nodes.instance_types):
each type's offering in the pinned zone, and the Spot vCPU quota of their class."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

from raytrain.aws import CapacityApi
from raytrain.preflight import capacity
from raytrain.preflight.report import Check
from tests.test_spot_group import SOURCE, TYPES, h200_spot_data

REGION = "us-east-2"
ZONE = "us-east-2c"


def checks(offered: dict[str, list[str]], spot_vcpus: float) -> dict[str, list[Check]]:
    from config.loader import parse_settings

    settings = parse_settings(json.dumps(h200_spot_data()), name="h200-spot", source=SOURCE)
    keys = {"region_name": REGION, "aws_access_key_id": "x", "aws_secret_access_key": "x"}
    ec2, quotas = boto3.client("ec2", **keys), boto3.client("service-quotas", **keys)
    with Stubber(ec2) as stub, Stubber(quotas) as quota_stub:
        for itype in TYPES:  # EC2 answers per type and zone (DescribeInstanceTypeOfferings)
            offerings = [
                {"InstanceType": itype, "LocationType": "availability-zone", "Location": z}
                for z in offered.get(itype, [])
            ]
            stub.add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": offerings},
                              {"LocationType": "availability-zone",
                               "Filters": [{"Name": "instance-type", "Values": [itype]}]})  # fmt: skip
        # Both are P types: one Spot quota, "All P Spot Instance Requests".
        quota = {"ServiceCode": "ec2", "QuotaCode": "L-7212CCBC"}
        quota_stub.add_response("get_service_quota", {"Quota": {**quota, "Value": spot_vcpus}}, quota)
        found = list(capacity.capacity_checks(settings, CapacityApi(REGION, ec2, quotas)))
        stub.assert_no_pending_responses()
    by_name: dict[str, list[Check]] = {}
    for check in found:
        by_name.setdefault(check.name, []).append(check)
    return by_name


def test_every_type_offered_and_quota_for_max_size_pass() -> None:
    got = checks({t: [ZONE] for t in TYPES}, spot_vcpus=3 * 192)
    (offering,) = got["gpu offering"]
    assert offering.status.value == "ok" and offering.detail == f"{' and '.join(TYPES)} are offered in {ZONE}"
    (quota,) = got["gpu spot vcpu quota"]
    assert quota.status.value == "ok" and "All P Spot Instance Requests" in quota.detail


def test_a_type_not_offered_in_the_zone_is_a_warning_naming_it() -> None:
    got = checks({TYPES[0]: [ZONE], TYPES[1]: ["us-east-2a"]}, spot_vcpus=3 * 192)
    (offering,) = got["gpu offering"]
    assert offering.status.value == "warn"
    assert offering.detail.startswith(f"{TYPES[1]} not offered in {ZONE}: the group launches only {TYPES[0]}")


@pytest.mark.parametrize("vcpus", [0, 3 * 192 - 1])
def test_none_offered_or_too_little_spot_quota_is_a_problem(vcpus: float) -> None:
    got = checks({}, spot_vcpus=vcpus)
    (offering,) = got["gpu offering"]
    assert offering.status.value == "problem" and "nor" in offering.detail
    (quota,) = got["gpu spot vcpu quota"]
    assert quota.status.value == "problem"
    assert f"max_size 3 x {' or '.join(TYPES)} needs 576" in quota.detail
    assert "--quota-code L-7212CCBC --desired-value 576" in quota.fix

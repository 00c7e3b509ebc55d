"""Settings a user could get wrong without a word: a VPC too small for its subnets, a private subnet
too small for the nodes' addresses, public endpoint CIDRs that open it to everyone or never match,
and names refused with a sentence instead of a pattern."""

from __future__ import annotations

import json

import pytest

from config.catalogue import CATALOGUE
from config.loader import SettingsError, parse_settings
from config.network import INTERFACE_ENDPOINTS_MAX, SubnetsDoNotFit, smallest_prefix, subnet_plan
from tests.test_settings import dev_data, error_of, parse


def _cdk_subnets(cidr: str, zones: int) -> list[str] | None:
    """What CDK's own VPC makes of it (None: it refuses), with the Network stack's subnet layout."""
    import aws_cdk as cdk
    from aws_cdk import aws_ec2 as ec2

    from config.network import PRIVATE_SUBNET_MASK, PUBLIC_SUBNET_MASK

    app = cdk.App()
    stack = cdk.Stack(app, "S", env=cdk.Environment(account="111122223333", region="us-west-2"))
    try:
        vpc = ec2.Vpc(
            stack,
            "V",
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            availability_zones=[f"us-west-2{z}" for z in "abcd"[:zones]],
            subnet_configuration=[
                ec2.SubnetConfiguration(
                    name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=PUBLIC_SUBNET_MASK
                ),
                ec2.SubnetConfiguration(
                    name="Private",
                    subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                    cidr_mask=PRIVATE_SUBNET_MASK,
                ),
            ],
        )
    except Exception as exc:  # jsii raises RuntimeError with CDK's message
        assert "exceeds remaining space" in str(exc), exc
        return None
    return [s.ipv4_cidr_block for s in [*vpc.public_subnets, *vpc.private_subnets]]


@pytest.mark.parametrize(
    ("cidr", "zones"), [("10.0.0.0/16", 3), ("10.0.0.0/17", 3), ("10.0.0.0/18", 2), ("10.8.0.0/17", 4)]
)
def test_subnet_plan_is_cdks(cidr: str, zones: int) -> None:
    try:
        ours = [str(n) for n in subnet_plan(cidr, zones)]
    except SubnetsDoNotFit:
        ours = None
    assert ours == _cdk_subnets(cidr, zones)


def test_a_vpc_too_small_says_how_large_it_must_be() -> None:
    data = dev_data()
    data["vpc"]["cidr"] = "10.0.0.0/18"
    message = error_of(data)
    assert "vpc.cidr: 10.0.0.0/18 cannot hold the subnets of 2 zones" in message
    assert f"use a /{smallest_prefix(2)} or larger" in message and smallest_prefix(2) == 17


def test_every_type_has_its_cni_limits() -> None:
    for itype in CATALOGUE.values():
        assert itype.enis > 0 and itype.ipv4_per_eni > 0, itype.name
        # Kubelet's max pods never exceeds what the CNI can address (misc/eni-max-pods.txt's formula).
        assert itype.max_pods <= itype.enis * (itype.ipv4_per_eni - 1) + 2, itype.name


def test_addresses_per_node() -> None:
    # 234 pods need all 8 ENIs of 30 addresses (8 x 29 + 2 = 234).
    assert CATALOGUE["g6.12xlarge"].subnet_addresses().per_node == 240
    # 58 pods: 4 ENIs (the spare capped at the card's 4) of 15.
    assert CATALOGUE["m7i.xlarge"].subnet_addresses().per_node == 60
    # p4d: 250 pods on 15 ENIs of 50 -> 6 (+1 spare) = 350, plus 3 EFA interfaces with ENA on cards 1-3.
    assert CATALOGUE["p4d.24xlarge"].subnet_addresses().per_node == 7 * 50 + 3


def test_too_many_gpu_nodes_for_the_zones_subnet() -> None:
    data = dev_data()
    data["gpu_nodes"].update(
        {
            "instance_type": "p4d.24xlarge",
            "capacity_reservation_id": "cr-0123456789abcdef0",
            "placement_group": False,
        }
    )
    data["gpu_nodes"]["max_size"] = 30
    # Up to one queued job per GPU node, each with a Ray head on a system node: 4 m7i.4xlarge hold
    # 24 (tests/test_settings_queueing.py); they take their share of the zone's addresses too.
    data["system_nodes"].update({"instance_type": "m7i.4xlarge", "max_size": 4})
    message = error_of(data)
    assert "gpu_nodes.max_size: 30 p4d.24xlarge nodes take 353 addresses each" in message, message
    assert "with up to 4 system nodes" in message and "set max_size to at most 21" in message
    data["gpu_nodes"]["max_size"] = 21
    data["job"] = {**data["job"], "nodes": 2}
    parse(data)


@pytest.mark.parametrize("system_max", [4, 6])
def test_the_advertised_maximum_is_the_boundary(system_max: int) -> None:
    """The largest max_size the refusal names passes, one more is refused, whatever the system
    group's size (its nodes may land in the GPU zone: leaving them out would let one more in)."""
    import re

    data = dev_data()
    data["gpu_nodes"].update({"instance_type": "p4d.24xlarge",
                              "capacity_reservation_id": "cr-0123456789abcdef0",
                              "placement_group": False, "max_size": 40})  # fmt: skip
    # m7i.4xlarge: room for the Ray heads of the 20-odd jobs that many GPU nodes can run at once
    # (tests/test_settings_queueing.py), so the addresses are what binds.
    data["system_nodes"] = {**data["system_nodes"], "instance_type": "m7i.4xlarge", "max_size": system_max}
    data["job"] = {**data["job"], "nodes": 2}
    found = re.search(r"set max_size to at most (\d+)", error_of(data))
    assert found, error_of(data)
    advertised = int(found.group(1))
    data["gpu_nodes"]["max_size"] = advertised
    parse(data)
    data["gpu_nodes"]["max_size"] = advertised + 1
    assert f"gpu_nodes.max_size: {advertised + 1} p4d.24xlarge nodes" in error_of(data)


def test_interface_endpoints_stay_within_the_allowance() -> None:
    from stacks.network_stack import INTERFACE_ENDPOINTS

    assert len(INTERFACE_ENDPOINTS) <= INTERFACE_ENDPOINTS_MAX


@pytest.mark.parametrize(
    ("cidrs", "says"),
    [
        (["0.0.0.0/0"], "opens the cluster's API endpoint to the whole internet"),
        (
            ["203.0.113.0/24", "10.20.0.0/16"],
            "10.20.0.0/16 is a private range, which never reaches the public endpoint",
        ),
        (["192.168.1.0/24"], "is a private range"),
        (["100.64.0.0/10"], "is a private range"),
    ],
)
def test_public_endpoint_cidrs_that_cannot_be_meant(cidrs: list[str], says: str) -> None:
    data = dev_data()
    data["cluster"]["public_access_cidrs"] = cidrs
    message = error_of(data)
    assert "cluster.public_access_cidrs:" in message and says in message, message


def test_the_whole_internet_when_said_so() -> None:
    data = dev_data()
    data["cluster"]["public_access_cidrs"] = ["0.0.0.0/0"]
    data["cluster"]["public_access_from_anywhere"] = True
    assert parse(data).cluster.public_access_cidrs == ["0.0.0.0/0"]


def test_environment_name_is_refused_with_a_sentence() -> None:
    text = json.dumps(dev_data())
    with pytest.raises(SettingsError) as info:
        parse_settings(text, name="Dev_1", source="config/environments/Dev_1.yaml")
    message = str(info.value)
    assert "name: 'Dev_1' cannot name an environment" in message
    assert "rename the file to dev-1.yaml" in message
    assert "pattern" not in message


def test_cluster_name_is_refused_with_a_sentence() -> None:
    data = dev_data()
    data["cluster"]["name"] = "1ray_train"
    message = error_of(data)
    assert "cluster.name: '1ray_train' cannot name the cluster" in message and "e.g. ray-train" in message
    assert "pattern" not in message

"""The hand-written instance catalogue (config/catalogue.py) against EC2's own data for each type:
DescribeInstanceTypes as moto serves it (moto ships AWS's instance-type data,
moto/ec2/resources/instance_types.json.gz, regenerated from the EC2 API by its maintainers).

The catalogue is what Kubernetes requests, Ray's num-gpus, the launch template's EFA interfaces and
the settings' refusals are built from; with this test it is no longer only its own oracle.
"""

from __future__ import annotations

import re

import boto3
import pytest
from moto import mock_aws

from config.catalogue import CATALOGUE, GPU_MEMORY_CUDA_GIB, Instance


@pytest.fixture(scope="module")
def ec2_types() -> dict[str, dict]:
    with mock_aws():
        client = boto3.client("ec2", region_name="us-east-1")
        found = client.describe_instance_types(InstanceTypes=sorted(CATALOGUE))["InstanceTypes"]
    return {t["InstanceType"]: t for t in found}


def gbps(performance: str) -> float:
    """'40 Gigabit', 'Up to 12.5 Gigabit', '4x 100 Gigabit' (EC2's NetworkPerformance) in Gbit/s."""
    m = re.fullmatch(r"(?:Up to )?(?:(\d+)x )?([\d.]+) Gigabit", performance)
    assert m, performance
    return float(m.group(1) or 1) * float(m.group(2))


def max_pods(ec2: dict) -> int:
    """The VPC CNI's pods per node: the default network card's ENIs x (IPv4 per ENI - 1) + 2, capped
    as EKS's max-pods calculator does (110 below 30 vCPU, 250 from 30)."""
    net = ec2["NetworkInfo"]
    card = next(c for c in net["NetworkCards"] if c["NetworkCardIndex"] == net["DefaultNetworkCardIndex"])
    enis = card["MaximumNetworkInterfaces"]
    cap = 110 if ec2["VCpuInfo"]["DefaultVCpus"] < 30 else 250
    return min(cap, enis * (net["Ipv4AddressesPerInterface"] - 1) + 2)


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_catalogue_matches_ec2(ec2_types, name):
    ours: Instance = CATALOGUE[name]
    ec2 = ec2_types[name]
    net = ec2["NetworkInfo"]
    gpus = (ec2.get("GpuInfo") or {}).get("Gpus", [])
    found = {
        "vcpus": ec2["VCpuInfo"]["DefaultVCpus"],
        "memory_mib": ec2["MemoryInfo"]["SizeInMiB"],
        "gpus": sum(g["Count"] for g in gpus),
        "gpu_model": gpus[0]["Name"] if gpus else None,
        "efa_interfaces": net["EfaInfo"]["MaximumEfaInterfaces"] if net.get("EfaSupported") else 0,
        "network_cards": net["MaximumNetworkCards"],
        "network_gbps": gbps(net["NetworkPerformance"]),
        "max_pods": max_pods(ec2),
        "arch": ours.arch if ours.arch in ec2["ProcessorInfo"]["SupportedArchitectures"] else "not offered",
    }
    assert {
        "vcpus": ours.vcpus,
        "memory_mib": ours.memory_gib * 1024,
        "gpus": ours.gpus,
        "gpu_model": ours.gpu_model,
        "efa_interfaces": ours.efa_interfaces,
        "network_cards": ours.network_cards,
        "network_gbps": ours.network_gbps,
        "max_pods": ours.max_pods,
        "arch": ours.arch,
    } == found
    if ours.efa_only:
        # EFA-only interfaces go on the secondary cards (Instance.efa_interface_layout).
        assert all("efa-only" in c["InterfaceTypes"] for c in net["NetworkCards"] if c["NetworkCardIndex"])
    if ours.efa and ours.network_cards == 1:
        # The single-card EFA types here put their one EFA in a cluster placement group.
        assert "cluster" in ec2["PlacementGroupInfo"]["SupportedStrategies"]


@pytest.mark.parametrize("name", sorted(n for n, t in CATALOGUE.items() if t.gpus))
def test_gpu_memory_against_ec2(ec2_types, name):
    """The nominal GPU memory (gpu_memory_gib: the data sheet's 24/48/40/80 GB) is at least what EC2
    reports, and what a CUDA process can use (GPU_MEMORY_CUDA_GIB, the memory plan's budget) is at
    most that: the plan never budgets memory the GPU does not have."""
    ours = CATALOGUE[name]
    reported_gib = ec2_types[name]["GpuInfo"]["Gpus"][0]["MemoryInfo"]["SizeInMiB"] / 1024
    assert reported_gib <= ours.gpu_memory_gib < reported_gib * 1.1
    assert GPU_MEMORY_CUDA_GIB[str(ours.gpu_model)] <= reported_gib

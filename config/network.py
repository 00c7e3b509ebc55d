"""What the VPC must hold: the subnets CDK carves from `vpc.cidr`, and the addresses the nodes and
their pods take from the private subnet of one zone. Standard library only.

Subnets: the Network stack makes, per zone, a public /24 (NAT gateways only) and a private /19
(nodes and pods). CDK's VPC places them in that order, each at the next address aligned to its own
size, and fails synthesis when one does not fit ("1 of /19 exceeds remaining space"; aws-cdk-lib
aws-ec2 lib/network-util.ts, NetworkBuilder); `subnet_plan` does the same so the settings can say so
first, in a sentence.

Addresses: with the VPC CNI's defaults (secondary IPs, WARM_ENI_TARGET=1, no prefix delegation:
amazon-vpc-cni-k8s docs/eni-and-ip-target.md), a node attaches ENIs on its default network card as
pods need them, plus one spare, and each ENI takes all of its IPv4 addresses from the subnet at
once. Pods per node are ENIs x (IPv4 per ENI - 1) + 2 (misc/eni-max-pods.txt), capped by the node's
max pods. The per-type limits are amazon-vpc-cni-k8s pkg/vpc/vpc_ip_resource_limit.go (commit
b52188387f2e, 2026-08-20), in config/catalogue.py. AWS keeps 5 addresses of every subnet (VPC User
Guide, "Subnet CIDR blocks"); EKS wants at least 6, and recommends 16, free in the subnets of its
control plane's network interfaces (EKS User Guide, "VPC and subnet requirements").
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

PUBLIC_SUBNET_MASK = 24
PRIVATE_SUBNET_MASK = 19
AWS_RESERVED_PER_SUBNET = 5
EKS_CONTROL_PLANE_ADDRESSES = 16
# One network interface per interface endpoint in every zone (the Network stack's INTERFACE_ENDPOINTS;
# tests/test_network_plan.py keeps that list within this), and the pipeline's in-VPC build.
INTERFACE_ENDPOINTS_MAX = 8
OTHER_INTERFACES = 2


class SubnetsDoNotFit(ValueError):
    pass


def subnet_plan(cidr: str, zones: int) -> list[ipaddress.IPv4Network]:
    """The public then private subnets CDK carves from `cidr` for `zones` zones, in its order."""
    vpc = ipaddress.IPv4Network(cidr)
    nxt = int(vpc.network_address)
    subnets = []
    for mask in [PUBLIC_SUBNET_MASK] * zones + [PRIVATE_SUBNET_MASK] * zones:
        size = 1 << (32 - mask)
        start = -(-nxt // size) * size  # aligned to its own size
        if start + size > int(vpc.broadcast_address) + 1:
            raise SubnetsDoNotFit(f"1 of /{mask} exceeds remaining space of {cidr}")
        subnets.append(ipaddress.IPv4Network((start, mask)))
        nxt = start + size
    return subnets


def smallest_prefix(zones: int) -> int:
    """The largest prefix length (smallest VPC) that holds the subnets of `zones` zones."""
    prefix = PRIVATE_SUBNET_MASK
    while True:
        try:
            subnet_plan(f"10.0.0.0/{prefix}", zones)
            return prefix
        except SubnetsDoNotFit:
            prefix -= 1


@dataclass(frozen=True)
class NodeAddresses:
    """Addresses one node takes from its subnet (see the module docstring)."""

    enis: int  # ENIs on the default network card
    ipv4_per_eni: int
    max_pods: int
    other_card_interfaces: int  # EFA interfaces with ENA on other network cards: one address each

    @property
    def per_node(self) -> int:
        pod_ips_per_eni = self.ipv4_per_eni - 1  # an ENI's primary address is its own
        needed = -(-max(self.max_pods - 2, 0) // pod_ips_per_eni)  # +2: host-network pods
        attached = min(self.enis, needed + 1)  # WARM_ENI_TARGET=1: one spare ENI
        return attached * self.ipv4_per_eni + self.other_card_interfaces


def private_subnet_capacity() -> int:
    return (1 << (32 - PRIVATE_SUBNET_MASK)) - AWS_RESERVED_PER_SUBNET


def zone_need(nodes: list[tuple[int, NodeAddresses]]) -> int:
    """Addresses one zone's private subnet must hold: every (count, node) that may land there, the
    interface endpoints, other interfaces and EKS's share."""
    return (
        sum(count * node.per_node for count, node in nodes)
        + INTERFACE_ENDPOINTS_MAX
        + OTHER_INTERFACES
        + EKS_CONTROL_PLANE_ADDRESSES
    )

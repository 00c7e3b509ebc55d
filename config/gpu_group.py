"""A GPU node group of several instance types (Spot): which types may share it, and what the group
offers as one type.

Amazon EKS managed node groups take several instance types and, on Spot, spread over their capacity
pools themselves: "the allocation strategy is set to ... price-capacity-optimized (PCO) – When creating
new node groups in a cluster with Kubernetes version 1.28 or higher" (EKS User Guide, "Managed node
group capacity types", https://docs.aws.amazon.com/eks/latest/userguide/managed-node-groups.html#managed-node-group-capacity-types;
every Kubernetes version this app deploys is 1.34 or later). The node group has no allocation-strategy
property (AWS::EKS::Nodegroup), so there is nothing to set: docs/gpu-fleet.md says so.

What every listed type must share, and why:
- the GPU (model, so memory, and count): the node group carries one accelerator label (Kueue's flavor
  selects on it), the RayJob one micro-batch, one float8 choice and one worker count per node, all
  planned for that GPU;
- vCPUs and memory: the same guide, "if you're using the Cluster Autoscaler, we recommend using a
  flexible set of instance types with the same amount of vCPU and memory resources"; the worker pods'
  requests are sized from them too;
- EFA (when gpu_nodes.efa): the one launch template's network interfaces must be valid on every type.
  The group carries the EFA interfaces all its types have (the fewest of them, on the same network
  cards and device indices), so a type with more cards uses only that many (and its bandwidth in
  proportion: the step-time model's figure).
"""

from __future__ import annotations

import dataclasses

from config.catalogue import CATALOGUE, Instance
from config.network import NodeAddresses


def _gpu(t: Instance) -> str:
    return f"{t.gpus} x {t.gpu_model} {t.gpu_memory_gib} GB"


def _shape(t: Instance) -> str:
    return f"{_gpu(t)}, {t.vcpus} vCPU, {t.memory_gib} GiB"


def common_efa(instances: list[Instance]) -> int:
    """EFA interfaces the group's launch template carries: as many as its poorest type has."""
    return min(t.efa_interfaces for t in instances)


def _efa_prefix_problem(first: Instance, other: Instance) -> str | None:
    n = min(first.efa_interfaces, other.efa_interfaces)
    if first.efa_interface_layout()[:n] != other.efa_interface_layout()[:n]:
        return (
            f"{other.name}'s EFA interfaces {other.efa_interface_layout()[:n]} (network card, device "
            f"index, type) differ from {first.name}'s {first.efa_interface_layout()[:n]}: one launch "
            "template cannot carry both"
        )
    return None


def member_problem(first: Instance, other: Instance, *, efa: bool) -> str | None:
    """Why `other` cannot share a node group with `first` (None: it can)."""
    if (other.gpus, other.gpu_model, other.gpu_memory_gib, other.vcpus, other.memory_gib, other.arch) != (
        first.gpus,
        first.gpu_model,
        first.gpu_memory_gib,
        first.vcpus,
        first.memory_gib,
        first.arch,
    ):
        return f"{other.name} has {_shape(other)} where {first.name} has {_shape(first)}"
    if efa and not other.efa:
        return f"{other.name} has no EFA where {first.name} has {first.efa_interfaces} (efa is true)"
    if efa:
        return _efa_prefix_problem(first, other)
    return None


def partners(first: Instance, *, efa: bool) -> list[str]:
    """The catalogue's types that may share a node group with `first`."""
    return sorted(
        t.name
        for t in CATALOGUE.values()
        if t.name != first.name and member_problem(first, t, efa=efa) is None
    )


def valid_partners(first: Instance, *, efa: bool) -> str:
    names = partners(first, efa=efa)
    if names:
        return ", ".join(names)
    return (
        f"no other type in config/catalogue.py has {_shape(first)}"
        + (" and EFA" if efa else "")
        + " (add one there with its EC2 facts, or list one type)"
    )


def group_instance(instances: list[Instance], *, efa: bool) -> Instance:
    """The group as one type, named by the first: what every node of it is sure to offer.

    Shared by construction (member_problem): GPUs, vCPUs, memory. The least of the rest: EFA
    interfaces (the launch template's), the inter-node bandwidth those interfaces give, and the
    allocatable memory (kubelet reserves memory per pod: the type with the most pods leaves the least).
    """
    first = instances[0]
    if len(instances) == 1:
        return first
    efa_n = common_efa(instances) if efa else 0

    def gbps(t: Instance) -> float:
        # A type with more EFA cards than the group carries uses that share of its bandwidth.
        return t.network_gbps * efa_n / t.efa_interfaces if efa_n else t.network_gbps

    layout_owner = min(instances, key=lambda t: t.efa_interfaces)
    return dataclasses.replace(
        first,
        efa_interfaces=common_efa(instances),
        network_cards=min(t.network_cards for t in instances),
        efa_only=layout_owner.efa_only if efa else first.efa_only,
        network_gbps=min(gbps(t) for t in instances),
        gpu_link_gbytes=min(t.gpu_link_gbytes for t in instances),
        max_pods=max(t.max_pods for t in instances),
    )


def subnet_addresses(instances: list[Instance], *, efa: bool) -> NodeAddresses:
    """What the hungriest node of the group takes from its subnet: each type's own ENIs and pods, with
    the group's EFA interfaces."""
    group = group_instance(instances, efa=efa)
    each = [
        dataclasses.replace(
            t, efa_interfaces=group.efa_interfaces, efa_only=group.efa_only
        ).subnet_addresses()
        for t in instances
    ]
    return max(each, key=lambda a: a.per_node)

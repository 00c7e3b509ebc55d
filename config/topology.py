"""Which instance types have EC2 instance-topology data, and the node labels EKS gives them.

EC2 describes where an instance sits in the AWS network as a set of network nodes, one per layer,
for some instance types only: "Prerequisites for Amazon EC2 topology", Instance types (Amazon EC2
User Guide, docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-topology-prerequisites.html,
read 2026-12-04): 3 network nodes for the types of THREE_LAYERS, 4 for FOUR_LAYERS. g6 is not
listed: a g6 group has no topology data, so Kueue's topology-aware scheduling cannot be offered on it.

Amazon EKS labels each node with its position ("Place distributed AI/ML workloads with network
topology labels", EKS User Guide, docs.aws.amazon.com/eks/latest/userguide/ml-workload-topology.html):
`topology.k8s.aws/network-node-layer-1` (the top, least selective) to `-3` (the bottom for most
types, the most selective), and `-4` "present only on instance types whose topology has four
layers". Kueue's Topology lists them top-down, then `kubernetes.io/hostname` (k8s/kueue.py).
"""

from __future__ import annotations

LAYER_LABEL_PREFIX = "topology.k8s.aws/network-node-layer-"
HOSTNAME_LABEL = "kubernetes.io/hostname"

THREE_LAYERS = frozenset(
    {
        *(f"g6e.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge")),
        "g6e.24xlarge", "g6e.48xlarge",
        *(f"g7e.{s}" for s in ("2xlarge", "4xlarge", "8xlarge", "12xlarge", "24xlarge", "48xlarge")),
        "hpc6a.48xlarge", "hpc6id.32xlarge", "hpc7g.4xlarge", "hpc7g.8xlarge", "hpc7g.16xlarge",
        "hpc7a.12xlarge", "hpc7a.24xlarge", "hpc7a.48xlarge", "hpc7a.96xlarge", "hpc8a.96xlarge",
        "p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge",
        "p5en.48xlarge", "p6e-gb200.36xlarge",
        "trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge", "trn2u.48xlarge",
    }
)  # fmt: skip
FOUR_LAYERS = frozenset({"p6-b200.48xlarge", "p6-b300.48xlarge"})


def network_layers(instance_type: str) -> int:
    """How many network layers EC2 describes for the type (0: it has no topology data)."""
    if instance_type in FOUR_LAYERS:
        return 4
    return 3 if instance_type in THREE_LAYERS else 0


def layer_label(layer: int) -> str:
    return f"{LAYER_LABEL_PREFIX}{layer}"


def topology_types() -> list[str]:
    """Every type with topology data, sorted (for messages)."""
    return sorted(THREE_LAYERS | FOUR_LAYERS)

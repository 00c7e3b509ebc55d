"""Numbers the infrastructure code provisions with that the cost estimate (config/costs.py) also
counts: written here, the lowest layer both read, so they are never typed twice and config/ never
imports the constructs or stacks (layer order: docs/layout.md).

- the root volume's provisioned throughput and IOPS (cdk_constructs/node_groups.py's launch templates);
- the interface VPC endpoints, one ENI per AZ each (stacks/network_stack.py), named by the
  `aws_ec2.InterfaceVpcEndpointAwsService` member each is, so this module needs no aws_cdk;
- the Cluster Autoscaler's scale-down timing (cdk_constructs/cluster_autoscaler.py), which bounds how
  long an empty GPU node stays billed.
"""

from __future__ import annotations

# gp3 baseline is 3000 IOPS / 125 MiB/s; image layers of the DLC (~20 GB) unpack faster with more
# throughput, which shortens node start. (Billed above 125 MiB/s: config/costs.py.)
ROOT_IOPS = 3000
ROOT_THROUGHPUT_MIBPS = 250

# Interface endpoints (construct id: InterfaceVpcEndpointAwsService member), one ENI in each AZ's
# private subnet and billed per AZ-hour. Image pulls and Pod Identity credentials stay off the NAT.
INTERFACE_ENDPOINTS: dict[str, str] = {
    "EcrApi": "ECR",
    "EcrDocker": "ECR_DOCKER",
    "Sts": "STS",
}

# Scale-down timing. A GPU node without GPU pods is "unneeded"; it is removed after
# scale-down-unneeded-time (default 10m), but no sooner than scale-down-delay-after-add (default
# 10m) after the last scale-up. 5m each keeps the removal well inside 15 minutes of the job's Ray
# cluster going away (5m + drain + EC2 shutdown), and a short job does not hold its nodes for 10m.
SCALE_DOWN_UNNEEDED = "5m"
SCALE_DOWN_DELAY_AFTER_ADD = "5m"
# Allowance for the drain and the EC2 shutdown once a node is found unneeded (an estimate, not a
# setting): with it, how long a GPU node stays after its worker pod went (raytrain cost).
DRAIN_AND_SHUTDOWN_MINUTES = 5


def empty_gpu_node_minutes() -> int:
    """At most how long a GPU node is billed after its last GPU pod is deleted."""
    if not SCALE_DOWN_UNNEEDED.endswith("m"):
        raise ValueError(f"SCALE_DOWN_UNNEEDED {SCALE_DOWN_UNNEEDED!r}: expected whole minutes, e.g. '5m'")
    return int(SCALE_DOWN_UNNEEDED[:-1]) + DRAIN_AND_SHUTDOWN_MINUTES

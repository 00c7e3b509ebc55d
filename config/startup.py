"""How long a queued job's pods may take to be ready after Kueue admits it, written once.

Kueue's `waitForPodsReady.timeout` (cdk_constructs/kueue.py) is the sum of the parts below: an
admitted RayJob whose Ray cluster is not ready by then is evicted, its cluster deleted, its quota
released, and it is requeued with backoff. Each part is a cited figure or a named allowance, for a
cold GPU node (the group scales from zero) and the ~20 GB Ray image:

- the clock: Kueue counts from the Workload's `Admitted` transition (kueue v0.19.2
  pkg/controller/core/workload_controller.go admittedNotReadyWorkload), and a RayJob's pods are
  ready when its RayCluster's state is `ready` (pkg/controller/jobs/rayjob/rayjob_controller.go
  PodsReady). With the provisioning check (k8s/kueue.py) admission comes once the Cluster
  Autoscaler has asked EC2 for the nodes; the nodes still have to boot.
- NODE_PROVISION_MINUTES: EC2 launch, boot of the EKS AL2023 NVIDIA AMI (driver, and on p5 the
  fabric manager, are in the AMI: nothing installs at boot) and the join. The Cluster Autoscaler
  "expects requested nodes to appear within 15 minutes (configured by --max-node-provision-time)"
  and gives up on them after that (cluster-autoscaler FAQ.md, tag cluster-autoscaler-1.35.2). The
  same figure is set on the autoscaler (cdk_constructs/cluster_autoscaler.py), so Kueue never
  evicts a job whose nodes the autoscaler is still waiting for, and never waits on nodes it gave up.
- DEVICE_PLUGIN_MINUTES: the NVIDIA and EFA device plugin DaemonSet pods start once the node is
  Ready (the NVIDIA image from nvcr.io through the NAT gateway, config/registries.py) and only then
  advertise `nvidia.com/gpu` and `vpc.amazonaws.com/efa`. An allowance, not a measurement: two
  small images and a device scan.
- IMAGE_PULL_MINUTES: "Standard Docker image pulls of 15–20 GB can take 4–6 minutes per instance"
  (AWS Machine Learning Blog, "Reducing container cold start times using SOCI index on DLAMI and
  DLC", 2026); the Ray Train DLC is ~20 GB, so the upper end, pulled through the account's ECR
  pull-through cache (in-region, over the VPC endpoints). The head's pull on a system node runs in
  parallel with the GPU node's boot and is not added.
- RAY_READY_MINUTES: the worker waits for the head's GCS, starts its raylet, and KubeRay's readiness
  probe passes (initial delay 10 s, period 5 s: ray-operator v1.7.0 controllers/ray/utils/
  constant.go DefaultReadinessProbe*). An allowance.

Not measured here (no AWS account): `raytrain job status` shows when a job's pods became ready;
change the part that was wrong and the timeout follows.

The job's own start budget (`job.start_timeout_seconds`, KubeRay's preRunningDeadlineSeconds) counts
from KubeRay's `StartTime`, which KubeRay sets again each time Kueue unsuspends the RayJob
(ray-operator v1.7.0 rayjob_controller.go initRayJobStatusIfNeed, reached from `New` after
`Suspended`), so both clocks start at admission. It must be longer than Kueue's timeout: past
Kueue's, the job is requeued (no failure counted); past KubeRay's, the RayJob fails for good. The
margin covers Kueue's eviction reaching KubeRay (a suspend, which KubeRay checks before its
deadline in the same reconcile).
"""

from __future__ import annotations

NODE_PROVISION_MINUTES = 15
DEVICE_PLUGIN_MINUTES = 2
IMAGE_PULL_MINUTES = 6
RAY_READY_MINUTES = 1

# The parts, named, in the order they happen (docs and `raytrain` print them).
START_PARTS: dict[str, int] = {
    "GPU node launch, boot and join (autoscaler max-node-provision-time)": NODE_PROVISION_MINUTES,
    "NVIDIA and EFA device plugins advertise the node's devices": DEVICE_PLUGIN_MINUTES,
    "Ray image pull (~20 GB)": IMAGE_PULL_MINUTES,
    "Ray worker joins the head, readiness probe passes": RAY_READY_MINUTES,
}

# Kueue's waitForPodsReady timeout, and its recoveryTimeout (a running job that lost a node waits
# as long for the replacement).
PODS_READY_TIMEOUT_SECONDS = 60 * sum(START_PARTS.values())
# How much longer than Kueue's timeout a queued job's own start budget must be.
EVICTION_MARGIN_SECONDS = 60


def min_start_timeout_seconds() -> int:
    """The shortest `job.start_timeout_seconds` under which Kueue's eviction comes first."""
    return PODS_READY_TIMEOUT_SECONDS + EVICTION_MARGIN_SECONDS


def max_node_provision_time() -> str:
    """The Cluster Autoscaler's --max-node-provision-time, as its flag takes it."""
    return f"{NODE_PROVISION_MINUTES}m"

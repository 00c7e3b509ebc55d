"""Kueue: the queues in front of RayJobs (docs/teams.md), a pinned Helm add-on on the system nodes.

Chart: kubernetes-sigs/kueue, published as oci://registry.k8s.io/kueue/charts/kueue (the kubectl
handler pulls oci:// charts itself: aws-eks-v2 kubectl-handler/helm, get_chart_from_oci). Version
pinned in settings (addons.kueue); its values.yaml is in chart_values/ (tests check our keys against
it) and its templates in tests/fixtures/charts (rendered by the real `helm template`).

Installed before anything submits: `--wait` holds the deploy until the controller Deployment is
available, and Kueue reports ready only once its webhook server listens with its certificates
(cmd/kueue/main.go setupProbeEndpoints, v0.19.2: "Wait for the webhook server to be listening
before advertising the Kueue replica as ready"), so no RayJob reaches an API server whose Kueue
webhook is not answering. The queues (k8s/kueue.py) and the Workload stack come after it.

Only RayJobs are managed (integrations.frameworks: ray.io/rayjob): device plugins, add-ons, and
anything else in the cluster are not queued. In the team namespaces every RayJob is (manager_config).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from config import startup
from config.names import QUEUED_NAMESPACE_LABEL, SYSTEM_NODE_LABELS
from config.registries import ImageSource

REPOSITORY = "oci://registry.k8s.io/kueue/charts/kueue"
CHART = "kueue"
RELEASE = "kueue"
NAMESPACE = "kueue-system"
# The controller image the released chart points at (hack/helm-chart-package.sh at v0.19.2 rewrites
# the git values' staging image to registry.k8s.io/kueue/kueue:v<version>); set here so it comes
# through the pull-through cache.
IMAGE = "registry.k8s.io/kueue/kueue"

# The ProvisioningRequest CRD of the Cluster Autoscaler (its chart installs none): kubernetes/
# autoscaler at tag cluster-autoscaler-1.35.2 (commit 2d42588803c7), cluster-autoscaler/apis/config/
# crd/autoscaling.x-k8s.io_provisioningrequests.yaml. Kueue sets up its provisioning admission check
# only when the API serves it at start (cmd/kueue/main.go: "Skipping admission check controller
# setup: Provisioning Requests not supported"), so it is applied before Kueue.
PROVISIONING_REQUEST_CRD = (
    Path(__file__).resolve().parent / "crds" / "autoscaling.x-k8s.io_provisioningrequests.yaml"
)

# waitForPodsReady: an admitted job whose pods are not all ready within this is evicted (its
# cluster deleted) and requeued with backoff, so a half-started job does not hold GPUs forever.
# The timeout is the sum of a cold GPU node's start-up parts, each cited in config/startup.py
# (node launch within the autoscaler's max-node-provision-time, device plugins, the ~20 GB image
# pull, Ray's readiness): 24 minutes. Kueue's own default is 30 (apis/config/v1beta2/defaults.go
# DefaultWaitForPodsReadyTimeout, v0.19.2). The jobs' start budget (job.start_timeout_seconds) is
# checked to be longer (config/settings/queueing.py), so Kueue requeues before KubeRay fails.
PODS_READY_TIMEOUT_SECONDS = startup.PODS_READY_TIMEOUT_SECONDS
# Requeue backoff after such an eviction: base * 2^(n-1) (+jitter) up to the max, no limit on count
# (kueue apis/config/v1beta2 RequeuingStrategy, v0.19.2: defaults base 60 s, max 3600 s, count
# unlimited; site docs "Setup All-or-nothing with ready Pods"). 30 minutes at most between tries
# (a node start's worth), not Kueue's hour.
REQUEUE_BACKOFF_BASE_SECONDS = 60
REQUEUE_BACKOFF_MAX_SECONDS = 1800


def manager_config() -> dict[str, Any]:
    """controller_manager_config.yaml: the chart's default, with waitForPodsReady, only the RayJob
    integration, and nothing else changed (chart values managerConfig.controllerManagerConfigYaml)."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "controller": {
            "groupKindConcurrency": {
                "Workload.kueue.x-k8s.io": 10,
                "LocalQueue.kueue.x-k8s.io": 5,
                "ClusterQueue.kueue.x-k8s.io": 5,
                "ResourceFlavor.kueue.x-k8s.io": 1,
            }
        },
        "clientConnection": {"qps": 300, "burst": 500},
        "waitForPodsReady": {
            "timeout": f"{PODS_READY_TIMEOUT_SECONDS}s",
            # Other jobs are admitted meanwhile: the provisioning check already keeps two jobs
            # from taking parts of the same nodes.
            "blockAdmission": False,
            # A running job that loses a pod (a node gone) gets as long to get it back.
            "recoveryTimeout": f"{PODS_READY_TIMEOUT_SECONDS}s",
            "requeuingStrategy": {
                "timestamp": "Eviction",
                "backoffBaseSeconds": REQUEUE_BACKOFF_BASE_SECONDS,
                "backoffMaxSeconds": REQUEUE_BACKOFF_MAX_SECONDS,
            },
        },
        "integrations": {"frameworks": ["ray.io/rayjob"]},
        # A RayJob created by hand without the queue label, in a team namespace, is suspended and
        # never started unless it is given a queue ("those jobs will be suspended and never
        # started unless they are assigned a queue", apis/config/v1beta2 ManageJobsWithoutQueueName):
        # nobody bypasses the quotas. Only the labelled namespaces (own-cluster jobs: a standing
        # cluster's RayJob selects an existing cluster, which Kueue refuses to manage).
        "manageJobsWithoutQueueName": True,
        "managedJobsNamespaceSelector": {"matchLabels": {QUEUED_NAMESPACE_LABEL: "true"}},
    }


def kueue_values(version: str, images: ImageSource | None = None) -> dict[str, Any]:
    """Values of the kueue chart; every key exists in its values.yaml (tests)."""
    repository = IMAGE if images is None or images.upstream_of(IMAGE) is None else images.resolve(IMAGE)
    return {
        "controllerManager": {
            "manager": {
                "image": {"repository": repository, "tag": f"v{version}", "pullPolicy": "IfNotPresent"},
            },
            # Two replicas (one leader): the webhook answers RayJob creations while one restarts.
            "replicas": 2,
            "podDisruptionBudget": {"enabled": True, "minAvailable": 1},
            "nodeSelector": dict(SYSTEM_NODE_LABELS),
        },
        # JSON is YAML: the chart writes the text into the manager's ConfigMap as it is.
        "managerConfig": {"controllerManagerConfigYaml": json.dumps(manager_config(), indent=2)},
    }


class Kueue(Construct):
    """The ProvisioningRequest CRD, then Kueue's chart in kueue-system (waits for its webhook)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        version: str,
        images: ImageSource | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        from ruamel.yaml import YAML

        crd = YAML(typ="safe", pure=True).load(PROVISIONING_REQUEST_CRD)
        self.provisioning_crd = eks.KubernetesManifest(
            self, "ProvisioningRequestCrd", cluster=cluster, manifest=[crd], overwrite=True
        )
        self.values = kueue_values(version, images)
        self.chart = eks.HelmChart(
            self,
            "Chart",
            cluster=cluster,
            repository=REPOSITORY,
            chart=CHART,
            release=RELEASE,
            version=version,
            namespace=NAMESPACE,
            create_namespace=True,
            values=self.values,
            # `--wait`: ready means the webhook listens (module docstring). No `--atomic`
            # (deprecated in the layer's Helm 4; cdk_constructs/addons.py).
            wait=True,
            timeout=Duration.minutes(10),
        )
        self.chart.node.add_dependency(self.provisioning_crd)

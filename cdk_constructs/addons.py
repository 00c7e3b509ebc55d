"""Helm add-ons: NVIDIA and EFA device plugins on GPU nodes, the KubeRay operator on system nodes.

Every values key set here must exist in the chart's own values file for the pinned version
(copies in `chart_values/`; a documented, commented-out key counts). tests/test_addons.py checks it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from config.names import (
    DEVICE_PLUGIN_NAMESPACE,
    EFA_DEVICE_PLUGIN_CHART,
    GPU_NODE_LABELS,
    GPU_PRESENT_LABEL,
    GPU_TAINT_KEY,
    KUBERAY_CHART,
    KUBERAY_NAMESPACE,
    KUBERAY_RELEASE,
    NODE_ROLE_LABEL,
    NVIDIA_DEVICE_PLUGIN_CHART,
    PART_OF,
    PART_OF_LABEL,
    QUEUED_NAMESPACE_LABEL,
    SYSTEM_NODE_LABELS,
)
from config.registries import ImageSource

CHART_VALUES_DIR = Path(__file__).resolve().parent / "chart_values"

NVIDIA_REPOSITORY = "https://nvidia.github.io/k8s-device-plugin"
EFA_REPOSITORY = "https://aws.github.io/eks-charts"
KUBERAY_REPOSITORY = "https://ray-project.github.io/kuberay-helm/"

# What a pod needs to land on a GPU node (the GPU group's taint, cdk_constructs/node_groups.py).
GPU_TOLERATION = {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


def values_file(chart: str, version: str) -> Path:
    """The chart's own values.yaml for this version, as copied into the repository."""
    return CHART_VALUES_DIR / f"{chart}-{version}.yaml"


def chart_image_repository(chart: str, version: str) -> str:
    """`image.repository` of the chart's own values for this version: the upstream image."""
    from ruamel.yaml import YAML

    repository: str = YAML(typ="safe", pure=True).load(values_file(chart, version))["image"]["repository"]
    return repository


def chart_image_tag(chart: str, version: str) -> str | None:
    """`image.tag` of the chart's own values for this version (None: the chart's appVersion,
    which the copied values file does not carry)."""
    from ruamel.yaml import YAML

    tag = YAML(typ="safe", pure=True).load(values_file(chart, version))["image"].get("tag")
    return str(tag) if tag else None


# The EFA plugin chart's default image lives in the EKS registry of us-west-2
# (602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/aws-efa-k8s-device-plugin, chart values): from
# any other region a cross-region pull, outside the VPC endpoints, through the NAT. AWS publishes the
# same repository on ECR Public under the `eks` alias, which the pull-through cache serves from the
# environment's own registry. The chart's tag is kept.
EFA_PUBLIC_REPOSITORY = "public.ecr.aws/eks/aws-efa-k8s-device-plugin"


def _image(images: ImageSource | None, upstream: str) -> dict[str, Any]:
    """The `image.repository` value through the cache, or nothing (the chart's default)."""
    if images is None or images.upstream_of(upstream) is None:
        return {}
    return {"image": {"repository": images.resolve(upstream)}}


def nvidia_device_plugin_values() -> dict[str, Any]:
    return {
        # Only GPU nodes: the chart's default affinity also matches this label; the selector
        # keeps it off any node that merely has NFD's PCI label.
        "nodeSelector": {GPU_PRESENT_LABEL: GPU_NODE_LABELS[GPU_PRESENT_LABEL]},
        "tolerations": [GPU_TOLERATION],
        # 0.19.0-0.19.2 turned MOFED on and grabbed the EFA devices; keep it off explicitly.
        "mofedEnabled": False,
        "gfd": {"enabled": False},
    }


def efa_device_plugin_values(images: ImageSource | None = None) -> dict[str, Any]:
    return {
        **_image(images, EFA_PUBLIC_REPOSITORY),
        "nodeSelector": {NODE_ROLE_LABEL: GPU_NODE_LABELS[NODE_ROLE_LABEL]},
        # The chart tolerates nothing by default, and GPU nodes carry the GPU taint.
        "tolerations": [GPU_TOLERATION],
    }


# Operator feature gates the workload relies on, pinned rather than left to a default:
# RayJobDeletionPolicy lets a RayJob carry deletionStrategy (k8s/job.py: its GPU workers go when the
# job ends, the head later); without it KubeRay rejects the RayJob ("RayJobDeletionPolicy feature
# gate must be enabled to use DeletionStrategy", utils/validation.go, v1.7.0).
KUBERAY_FEATURE_GATES = {"RayJobDeletionPolicy": True}


def kuberay_operator_values(
    ray_namespaces: str | list[str], images: ImageSource | None = None, version: str | None = None
) -> dict[str, Any]:
    """`ray_namespaces`: the Ray namespace, or every team's (config/settings/teams.py)."""
    watched = [ray_namespaces] if isinstance(ray_namespaces, str) else list(ray_namespaces)
    image = {} if version is None else _image(images, chart_image_repository(KUBERAY_CHART, version))
    return {
        **image,
        "nodeSelector": dict(SYSTEM_NODE_LABELS),
        # Namespaced RBAC and a watch on the Ray namespaces only (one per team): the operator cannot
        # touch pods elsewhere in the cluster. With singleNamespaceInstall the chart makes a Role
        # and RoleBinding in each watched namespace (templates/multiple_namespaces_role*.yaml).
        "singleNamespaceInstall": True,
        "watchNamespace": watched,
        # The chart turns this list into `--feature-gates=NAME=BOOL,...` (templates/_helpers.tpl,
        # "kuberay.featureGates"). Helm replaces a list value whole, so the gates not named here
        # take the operator's built-in defaults, which in 1.7.0 are the chart's own list
        # (ray-operator/pkg/features/features.go).
        "featureGates": [{"name": name, "enabled": on} for name, on in KUBERAY_FEATURE_GATES.items()],
    }


class GpuDevicePlugins(Construct):
    """NVIDIA device plugin (nvidia.com/gpu) and AWS EFA device plugin (vpc.amazonaws.com/efa)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        nvidia_version: str,
        efa_version: str | None,
        images: ImageSource | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.nvidia = _device_plugin(
            self,
            "NvidiaDevicePlugin",
            cluster=cluster,
            repository=NVIDIA_REPOSITORY,
            chart=NVIDIA_DEVICE_PLUGIN_CHART,
            version=nvidia_version,
            values=nvidia_device_plugin_values(),
        )
        self.efa: eks.HelmChart | None = None
        if efa_version is not None:
            self.efa = _device_plugin(
                self,
                "EfaDevicePlugin",
                cluster=cluster,
                repository=EFA_REPOSITORY,
                chart=EFA_DEVICE_PLUGIN_CHART,
                version=efa_version,
                values=efa_device_plugin_values(images),
            )


def _device_plugin(
    scope: Construct,
    construct_id: str,
    *,
    cluster: eks.ICluster,
    repository: str,
    chart: str,
    version: str,
    values: dict[str, Any],
) -> eks.HelmChart:
    """A device-plugin DaemonSet chart in kube-system, released under its chart's name.

    No wait and no rollback: its pods start only once GPU nodes exist, which may be never (min size
    0). The handler passes neither --wait nor --atomic, so the layer's Helm 4 waits only for hooks
    (`--wait` omitted means 'hookOnly', `helm upgrade --help`); `--atomic` is deprecated there and
    would turn waiting on, as `--rollback-on-failure` does. CloudFormation's rollback undoes a
    failed release. tests/test_helm_flags.py checks the command the handler runs.
    """
    return eks.HelmChart(
        scope,
        construct_id,
        cluster=cluster,
        repository=repository,
        chart=chart,
        release=chart,
        version=version,
        namespace=DEVICE_PLUGIN_NAMESPACE,
        values=values,
        wait=False,
        timeout=Duration.minutes(10),
    )


class KubeRayOperator(Construct):
    """KubeRay operator on the system nodes, watching only the Ray namespaces, one per team
    (created here first: the chart binds its namespaced Roles there)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        version: str,
        ray_namespaces: list[str],
        images: ImageSource | None = None,
        queued: bool = True,
    ) -> None:
        """`queued`: the namespaces' RayJobs go through Kueue (own-cluster jobs; cdk_constructs/kueue.py)."""
        super().__init__(scope, construct_id)
        self.namespace = eks.KubernetesManifest(
            self,
            "RayNamespace",
            cluster=cluster,
            manifest=[
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {
                        "name": ray_namespace,
                        "labels": {
                            PART_OF_LABEL: PART_OF,
                            # Ray pods need IPC_LOCK and run as root in the DLC image.
                            "pod-security.kubernetes.io/enforce": "privileged",
                            "pod-security.kubernetes.io/warn": "baseline",
                            **({QUEUED_NAMESPACE_LABEL: "true"} if queued else {}),
                        },
                    },
                }
                for ray_namespace in ray_namespaces
            ],
            overwrite=True,
        )
        self.chart = eks.HelmChart(
            self,
            "Chart",
            cluster=cluster,
            repository=KUBERAY_REPOSITORY,
            chart=KUBERAY_CHART,
            release=KUBERAY_RELEASE,
            version=version,
            namespace=KUBERAY_NAMESPACE,
            create_namespace=True,
            values=kuberay_operator_values(ray_namespaces, images, version),
            # `--wait` (Helm 4: the 'watcher' strategy): the deploy stops here until the operator
            # is ready, so the Workload stack's RayJob finds its CRDs and controller. No rollback
            # flag (`--atomic` is deprecated in Helm 4): when the release fails, CloudFormation's
            # own rollback undoes it (uninstall after a failed create, the old values after a
            # failed update).
            wait=True,
            timeout=Duration.minutes(10),
        )
        self.chart.node.add_dependency(self.namespace)

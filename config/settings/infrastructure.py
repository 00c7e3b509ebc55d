"""Infrastructure settings: the VPC, the EKS cluster, the node groups, the Helm add-ons, storage."""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from config.catalogue import CATALOGUE, Instance
from config.gpu_group import group_instance, member_problem, valid_partners
from config.registries import cache_prefix_problem
from config.settings.base import AZ_RE, SEMVER_RE, FieldError, SettingsModel, cluster_name_problem

# Kubernetes versions this app can deploy: EKS standard support (late 2026), the aws_eks_v2
# KubernetesVersion enum, and a published kubectl Lambda layer package must all exist for it.
# Each maps to the PyPI package / module that carries the matching kubectl + helm layer.
KUBECTL_LAYERS: dict[str, str] = {
    "1.34": "aws_cdk.lambda_layer_kubectl_v34.KubectlV34Layer",
    "1.35": "aws_cdk.lambda_layer_kubectl_v35.KubectlV35Layer",
    "1.36": "aws_cdk.lambda_layer_kubectl_v36.KubectlV36Layer",
}

IAM_PRINCIPAL_RE = re.compile(r"^arn:aws(-cn|-us-gov)?:iam::\d{12}:(role|user)/[\w+=,.@/-]{1,512}$")
# An EC2 capacity reservation id; `raytrain capacity --write` checks its own against it too.
CAPACITY_RESERVATION_RE = re.compile(r"^cr-[0-9a-f]{17}$")


def _cidr(value: str) -> str:
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a CIDR block like 10.0.0.0/16 ({exc})") from None
    if net.version != 4:
        raise ValueError(f"{value!r}: only IPv4 CIDR blocks are supported")
    return str(net)


Cidr = Annotated[str, AfterValidator(_cidr)]


def _instance_type(value: str) -> str:
    if value not in CATALOGUE:
        raise ValueError(
            f"{value!r} is not in the instance catalogue (config/catalogue.py); "
            f"known types: {', '.join(sorted(CATALOGUE))}"
        )
    return value


InstanceTypeName = Annotated[str, AfterValidator(_instance_type)]


def _chart_version(value: str) -> str:
    if not SEMVER_RE.match(value):
        raise ValueError(f"{value!r} is not a pinned chart version like 1.2.3")
    return value


ChartVersion = Annotated[str, AfterValidator(_chart_version)]

# An EKS add-on version as `aws eks describe-addon-versions` lists it: v1.7.0-eksbuild.1.
EKS_ADDON_VERSION_RE = re.compile(r"^v(?P<chart>\d+\.\d+\.\d+)-eksbuild\.\d+$")


def _eks_addon_version(value: str) -> str:
    if not EKS_ADDON_VERSION_RE.match(value):
        raise ValueError(f"{value!r} is not a pinned EKS add-on version like v1.7.0-eksbuild.1")
    return value


EksAddonVersion = Annotated[str, AfterValidator(_eks_addon_version)]


# Addresses that never reach the public endpoint as a source: the endpoint sees the public address a
# request leaves its network with (EKS User Guide, "Cluster API server endpoint": requests from inside
# the VPC use the private endpoint). RFC 1918, shared address space (RFC 6598), loopback, link-local.
_NOT_PUBLIC = [
    ipaddress.IPv4Network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
    )
]


def _public_cidr_problem(cidr: str, anywhere: bool) -> str | None:
    net = ipaddress.IPv4Network(cidr)  # Cidr: IPv4 only
    if net.prefixlen == 0:
        if anywhere:
            return None
        return (
            f"{cidr} opens the cluster's API endpoint to the whole internet: list your operators' "
            "public CIDRs instead, use endpoint_access: private, or set "
            "public_access_from_anywhere: true if that is meant"
        )
    if any(net.subnet_of(private) for private in _NOT_PUBLIC):
        return (
            f"{cidr} is a private range, which never reaches the public endpoint (it sees the public "
            "address your network's traffic leaves with; from inside the VPC the private endpoint "
            "answers): list the public CIDR of your office or VPN instead"
        )
    return None


class EndpointAccess(StrEnum):
    # Both keep the private endpoint on: requests from inside the VPC (nodes, the pipeline's
    # in-VPC verification build) use it (EKS API reference, VpcConfigRequest endpointPrivateAccess).
    # No public-only mode: the pipeline's build would then leave through the NAT and need the NAT's
    # addresses in public_access_cidrs.
    PRIVATE = "private"
    PUBLIC_AND_PRIVATE = "public_and_private"


class CapacityType(StrEnum):
    ON_DEMAND = "ON_DEMAND"
    SPOT = "SPOT"
    CAPACITY_BLOCK = "CAPACITY_BLOCK"


class RemovalPolicy(StrEnum):
    DESTROY = "destroy"
    RETAIN = "retain"


class VpcSettings(SettingsModel):
    cidr: Cidr = "10.0.0.0/16"
    availability_zones: list[str] = Field(min_length=2, max_length=6)
    nat_gateways: int = Field(default=1, ge=1, le=6)
    flow_log_retention_days: Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365] = 30

    @field_validator("availability_zones")
    @classmethod
    def _azs(cls, azs: list[str]) -> list[str]:
        for az in azs:
            if not AZ_RE.match(az):
                raise ValueError(f"{az!r} is not an availability zone name like us-west-2a")
        if len(set(azs)) != len(azs):
            raise ValueError(f"availability zones repeat: {azs}")
        return azs


class ClusterSettings(SettingsModel):
    name: str
    kubernetes_version: str
    endpoint_access: EndpointAccess = EndpointAccess.PUBLIC_AND_PRIVATE
    # CIDRs allowed to reach the public endpoint: your operators' public addresses.
    public_access_cidrs: list[Cidr] = Field(default_factory=list)
    # 0.0.0.0/0 in public_access_cidrs opens the API endpoint to the internet (token auth still
    # applies); refused unless this says it is meant.
    public_access_from_anywhere: bool = False
    admin_principal_arns: list[str] = Field(min_length=1)
    # IAM roles/users that run `raytrain job` without being cluster admins: a STANDARD access entry
    # each, in the Kubernetes group a Role in the Ray namespace is bound to (k8s/rbac.py).
    job_submitter_principals: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        problem = cluster_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, value: str) -> str:
        if value not in KUBECTL_LAYERS:
            raise ValueError(f"Kubernetes {value!r} is not supported; valid: {', '.join(KUBECTL_LAYERS)}")
        return value

    @field_validator("admin_principal_arns", "job_submitter_principals")
    @classmethod
    def _arns(cls, arns: list[str]) -> list[str]:
        for arn in arns:
            if not IAM_PRINCIPAL_RE.match(arn):
                raise ValueError(
                    f"{arn!r} is not an IAM role or user ARN like arn:aws:iam::111122223333:role/Admin"
                )
        if len(set(arns)) != len(arns):
            raise ValueError(f"principals repeat: {arns}")
        return arns

    @model_validator(mode="after")
    def _endpoint(self) -> ClusterSettings:
        # EKS takes one access entry per principal (CreateAccessEntry: ResourceInUseException).
        both = sorted(set(self.admin_principal_arns) & set(self.job_submitter_principals))
        if both:
            raise ValueError(
                f"{', '.join(both)} is in admin_principal_arns and job_submitter_principals: an IAM "
                "principal has one access entry; admins can already submit jobs, list it once"
            )
        if self.endpoint_access is EndpointAccess.PRIVATE and self.public_access_cidrs:
            raise ValueError("public_access_cidrs must be empty when endpoint_access is 'private'")
        for cidr in self.public_access_cidrs:
            problem = _public_cidr_problem(cidr, self.public_access_from_anywhere)
            if problem:
                raise FieldError(("public_access_cidrs",), problem)
        if self.endpoint_access is EndpointAccess.PUBLIC_AND_PRIVATE and not self.public_access_cidrs:
            raise ValueError(
                "public_access_cidrs is required when endpoint_access is 'public_and_private' "
                "(list your operators' CIDRs; the pipeline verifies from inside the VPC; "
                "use 'private' to close it)"
            )
        return self


class SystemNodeSettings(SettingsModel):
    instance_type: InstanceTypeName = "m7i.xlarge"
    min_size: int = Field(default=1, ge=1)
    desired_size: int = Field(default=2, ge=1)
    max_size: int = Field(default=3, ge=1)
    # The Ray head and the job submitter run the multi-GB DLC image here too (unpacked, plus the
    # layers while pulling, plus logs): 100 GiB at least (the GPU group asks 200 for the same image).
    root_volume_gib: int = Field(default=100, ge=100, le=16384)

    @model_validator(mode="after")
    def _sizes(self) -> SystemNodeSettings:
        _check_sizes(self.min_size, self.desired_size, self.max_size)
        if CATALOGUE[self.instance_type].gpus:
            raise FieldError(
                ("instance_type",), f"{self.instance_type!r} is a GPU type; system nodes are CPU"
            )
        return self


class GpuNodeSettings(SettingsModel):
    instance_type: InstanceTypeName = "g6.12xlarge"
    # Spot only: the group's types, instance_type's place taken by the first (leave instance_type
    # out). EKS spreads the group over their Spot capacity pools (price-capacity-optimized); each
    # must have the first one's GPUs, vCPUs, memory and, with efa, EFA (config/gpu_group.py).
    instance_types: list[InstanceTypeName] | None = Field(default=None, min_length=1, max_length=20)
    # The single AZ every GPU node lives in: EFA traffic does not cross AZs, and a computed AZ
    # would replace the node group on a later deploy. `raytrain capacity --write` sets it.
    availability_zone: str
    # The Cluster Autoscaler sizes the group between these: no desired size (a job's node count is
    # job.nodes). 0 keeps no GPU node between jobs.
    min_size: int = Field(default=0, ge=0)
    max_size: int = Field(default=2, ge=1)
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    capacity_reservation_id: str | None = None
    placement_group: bool = True
    efa: bool = True
    root_volume_gib: int = Field(default=200, ge=200, le=16384)

    @model_validator(mode="before")
    @classmethod
    def _first_type(cls, data: object) -> object:
        # instance_types' first is the group's instance_type: every reader of instance_type (the
        # accelerator label, the memory plan, `raytrain capacity`) sees the first listed type.
        if isinstance(data, dict) and isinstance(data.get("instance_types"), list) and data["instance_types"]:
            first = data["instance_types"][0]
            if "instance_type" in data and data["instance_type"] != first:
                raise FieldError(
                    ("instance_type",),
                    f"{data['instance_type']!r} differs from instance_types[0] ({first!r}): set "
                    "instance_types alone (its first type is the group's instance_type)",
                )
            data = {**data, "instance_type": first}
        return data

    @field_validator("capacity_reservation_id")
    @classmethod
    def _cr(cls, value: str | None) -> str | None:
        if value is not None and not CAPACITY_RESERVATION_RE.match(value):
            raise ValueError(f"{value!r} is not a capacity reservation id like cr-0123456789abcdef0")
        return value

    @model_validator(mode="after")
    def _rules(self) -> GpuNodeSettings:
        if self.min_size > self.max_size:
            raise FieldError(("min_size",), f"{self.min_size} is greater than max_size ({self.max_size})")
        itype = CATALOGUE[self.instance_type]
        if not itype.gpus:
            raise FieldError(("instance_type",), f"{self.instance_type!r} has no GPUs")
        if self.efa and not itype.efa:
            efa_types = sorted(t.name for t in CATALOGUE.values() if t.efa)
            raise FieldError(
                ("instance_type",),
                f"{self.instance_type!r} has no EFA but efa is true; "
                f"EFA GPU types: {', '.join(efa_types)} (or set efa: false)",
            )
        self._check_types()
        if self.capacity_reservation_id and self.placement_group:
            raise FieldError(
                ("placement_group",),
                "must be false when capacity_reservation_id is set: a reservation "
                "made outside the placement group causes capacity errors",
            )
        if self.capacity_type is CapacityType.CAPACITY_BLOCK and not self.capacity_reservation_id:
            raise FieldError(("capacity_reservation_id",), "required when capacity_type is CAPACITY_BLOCK")
        if self.capacity_type is CapacityType.SPOT and self.capacity_reservation_id:
            raise FieldError(("capacity_reservation_id",), "cannot be used with capacity_type SPOT")
        return self

    def _check_types(self) -> None:
        types = self.types
        if len(types) == 1:
            return
        if self.capacity_type is not CapacityType.SPOT:
            # On-Demand, EKS would launch them in the order listed ("prioritized"): a fallback to a
            # type that is not the one planned and priced, where `raytrain capacity` finds a zone
            # with the first; a Capacity Block holds one type.
            raise FieldError(
                ("instance_types",),
                f"lists {len(types)} types but capacity_type is {self.capacity_type.value}: several types "
                "are for SPOT, where EKS spreads the group over their capacity pools; list one type "
                "(or run `raytrain capacity` to find a zone that has it)",
            )
        first = CATALOGUE[types[0]]
        for i, name in enumerate(types[1:], start=1):
            if name in types[:i]:
                raise FieldError(("instance_types", i), f"{name} is listed twice")
            problem = member_problem(first, CATALOGUE[name], efa=self.efa)
            if problem:
                raise FieldError(
                    ("instance_types", i), f"{problem}; valid: {valid_partners(first, efa=self.efa)}"
                )

    @property
    def types(self) -> list[str]:
        """Every instance type of the group, instance_type first."""
        return list(self.instance_types or [self.instance_type])

    @property
    def instances(self) -> list[Instance]:
        return [CATALOGUE[name] for name in self.types]

    @property
    def instance(self) -> Instance:
        """The group as one type (config/gpu_group.py): instance_type's catalogue entry when it is
        the only one, else what every listed type is sure to offer."""
        return group_instance(self.instances, efa=self.efa)


class AddonSettings(SettingsModel):
    """Pinned Helm chart and EKS add-on versions."""

    nvidia_device_plugin: ChartVersion = "0.20.0"
    efa_device_plugin: ChartVersion = "0.5.30"
    kuberay_operator: ChartVersion = "1.7.0"
    # kubernetes.github.io/autoscaler; its image follows the cluster's Kubernetes minor
    # (cdk_constructs/cluster_autoscaler.py).
    cluster_autoscaler: ChartVersion = "9.59.0"
    # oci://registry.k8s.io/kueue/charts/kueue (cdk_constructs/kueue.py): the newest release whose
    # chart and CRDs the tests render here (docs/teams.md: the releases after it, the bump steps).
    kueue: ChartVersion = "0.19.2"
    # The EKS add-on eks-node-monitoring-agent (observability.node_monitoring). Pinned, so what
    # runs is the chart the tests render: add-on vX.Y.Z-eksbuild.N installs the chart of tag vX.Y.Z
    # of aws/eks-node-monitoring-agent, whose values.yaml sets the agent image to that add-on version
    # (nodeAgent.image.tag: v1.7.0-eksbuild.1 at tag v1.7.0). Unpinned, EKS picks its default
    # version at create time and keeps it, whatever the tests saw.
    node_monitoring_agent: EksAddonVersion = "v1.7.0-eksbuild.1"
    # The EKS add-on amazon-cloudwatch-observability (observability.metrics), pinned likewise:
    # vX.Y.Z-eksbuild.N is the chart aws-observability/helm-charts tags
    # amazon-cloudwatch-observability-X.Y.Z (its RELEASE_NOTES are the add-on's; helm-charts#153).
    cloudwatch_observability: EksAddonVersion = "v6.4.0-eksbuild.1"

    @property
    def node_monitoring_agent_chart(self) -> str:
        """The chart version the node monitoring add-on version installs."""
        return eks_addon_chart_version(self.node_monitoring_agent)

    @property
    def cloudwatch_observability_chart(self) -> str:
        """The chart version the CloudWatch observability add-on version installs."""
        return eks_addon_chart_version(self.cloudwatch_observability)


def eks_addon_chart_version(addon_version: str) -> str:
    """X.Y.Z of an add-on version vX.Y.Z-eksbuild.N: the chart it installs, for the two add-ons
    whose charts are public (see AddonSettings)."""
    match = EKS_ADDON_VERSION_RE.match(addon_version)
    assert match is not None, addon_version  # validated by EksAddonVersion
    return match["chart"]


class RegistrySettings(SettingsModel):
    """Where nodes pull public images from (config/registries.py, docs/images.md)."""

    # ECR pull-through cache rules in this account for ECR Public, Quay and registry.k8s.io: the Ray
    # image, the EFA device plugin, the KubeRay operator and the Cluster Autoscaler come from the
    # environment's own registry through the VPC endpoints, not anonymously through the NAT.
    pull_through_cache: bool = True
    # The cache's repository prefix (its rules are <prefix>/ecr-public, /quay, /k8s). Rules are per
    # account and region: environments sharing both need different prefixes. Unset: the
    # environment's name.
    cache_prefix: str | None = None

    @field_validator("cache_prefix")
    @classmethod
    def _prefix(cls, value: str | None) -> str | None:
        problem = None if value is None else cache_prefix_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class StorageSettings(SettingsModel):
    # What happens to stateful resources (checkpoint bucket, KMS keys, log groups) on destroy.
    removal_policy: RemovalPolicy = RemovalPolicy.DESTROY


def _check_sizes(min_size: int, desired: int, max_size: int) -> None:
    if min_size > max_size:
        raise ValueError(f"min_size ({min_size}) is greater than max_size ({max_size})")
    if not min_size <= desired <= max_size:
        raise ValueError(
            f"desired_size ({desired}) must lie between min_size ({min_size}) and max_size ({max_size})"
        )

"""Typed settings: one validated object per environment.

Everything the stacks, the cdk8s chart and the RayJob need comes from here. An environment file
(`config/environments/<name>.yaml`) is parsed into `Settings`; unknown keys and bad values stop
synthesis with one message naming the file, the field and what would be valid (see `loader.py`).
"""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from config.catalogue import CATALOGUE, Instance
from config.names import KUBERAY_NAMESPACE, RAY_NAMESPACE

# Kubernetes versions this app can deploy: EKS standard support (late 2026), the aws_eks_v2
# KubernetesVersion enum, and a published kubectl Lambda layer package must all exist for it.
# Each maps to the PyPI package / module that carries the matching kubectl + helm layer.
KUBECTL_LAYERS: dict[str, str] = {
    "1.34": "aws_cdk.lambda_layer_kubectl_v34.KubectlV34Layer",
    "1.35": "aws_cdk.lambda_layer_kubectl_v35.KubectlV35Layer",
    "1.36": "aws_cdk.lambda_layer_kubectl_v36.KubectlV36Layer",
}

_ACCOUNT_RE = re.compile(r"^\d{12}$")
_REGION_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
_AZ_RE = re.compile(r"^(?P<region>[a-z]{2}(-gov)?-[a-z]+-\d)(?P<zone>[a-z])$")
_IAM_PRINCIPAL_RE = re.compile(r"^arn:aws(-cn|-us-gov)?:iam::\d{12}:(role|user)/[\w+=,.@/-]{1,512}$")
_CAPACITY_RESERVATION_RE = re.compile(r"^cr-[0-9a-f]{17}$")
_SEMVER_RE = re.compile(r"^\d+\.\d+\.\d+$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_IMAGE_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_TAG_KEY_RE = re.compile(r"^[\w.:/=+\-@ ]{1,128}$")


class _FieldError(ValueError):
    """A cross-field error that belongs to one field: the loader reports it under that path."""

    def __init__(self, loc: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


class _Model(BaseModel):
    # Unknown fields are errors: a typo must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


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
    if not _SEMVER_RE.match(value):
        raise ValueError(f"{value!r} is not a pinned chart version like 1.2.3")
    return value


ChartVersion = Annotated[str, AfterValidator(_chart_version)]


class EndpointAccess(StrEnum):
    PRIVATE = "private"
    PUBLIC_AND_PRIVATE = "public_and_private"


class CapacityType(StrEnum):
    ON_DEMAND = "ON_DEMAND"
    SPOT = "SPOT"
    CAPACITY_BLOCK = "CAPACITY_BLOCK"


class RemovalPolicy(StrEnum):
    DESTROY = "destroy"
    RETAIN = "retain"


class VpcSettings(_Model):
    cidr: Cidr = "10.0.0.0/16"
    availability_zones: list[str] = Field(min_length=2, max_length=6)
    nat_gateways: int = Field(default=1, ge=1, le=6)
    flow_log_retention_days: Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365] = 30

    @field_validator("availability_zones")
    @classmethod
    def _azs(cls, azs: list[str]) -> list[str]:
        for az in azs:
            if not _AZ_RE.match(az):
                raise ValueError(f"{az!r} is not an availability zone name like us-west-2a")
        if len(set(azs)) != len(azs):
            raise ValueError(f"availability zones repeat: {azs}")
        return azs


class ClusterSettings(_Model):
    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9-]{0,99}$")
    kubernetes_version: str
    endpoint_access: EndpointAccess = EndpointAccess.PUBLIC_AND_PRIVATE
    # CIDRs allowed to reach the public endpoint; 0.0.0.0/0 only when written here on purpose.
    public_access_cidrs: list[Cidr] = Field(default_factory=list)
    admin_principal_arns: list[str] = Field(min_length=1)

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, value: str) -> str:
        if value not in KUBECTL_LAYERS:
            raise ValueError(f"Kubernetes {value!r} is not supported; valid: {', '.join(KUBECTL_LAYERS)}")
        return value

    @field_validator("admin_principal_arns")
    @classmethod
    def _arns(cls, arns: list[str]) -> list[str]:
        for arn in arns:
            if not _IAM_PRINCIPAL_RE.match(arn):
                raise ValueError(
                    f"{arn!r} is not an IAM role or user ARN like arn:aws:iam::111122223333:role/Admin"
                )
        return arns

    @model_validator(mode="after")
    def _endpoint(self) -> ClusterSettings:
        if self.endpoint_access is EndpointAccess.PRIVATE and self.public_access_cidrs:
            raise ValueError("public_access_cidrs must be empty when endpoint_access is 'private'")
        if self.endpoint_access is EndpointAccess.PUBLIC_AND_PRIVATE and not self.public_access_cidrs:
            raise ValueError(
                "public_access_cidrs is required when endpoint_access is 'public_and_private' "
                "(list the CIDRs of your operators or pipeline; use 'private' to close it)"
            )
        return self


class SystemNodeSettings(_Model):
    instance_type: InstanceTypeName = "m7i.xlarge"
    min_size: int = Field(default=1, ge=1)
    desired_size: int = Field(default=2, ge=1)
    max_size: int = Field(default=3, ge=1)
    root_volume_gib: int = Field(default=50, ge=20, le=16384)

    @model_validator(mode="after")
    def _sizes(self) -> SystemNodeSettings:
        _check_sizes(self.min_size, self.desired_size, self.max_size)
        if CATALOGUE[self.instance_type].gpus:
            raise _FieldError(
                ("instance_type",), f"{self.instance_type!r} is a GPU type; system nodes are CPU"
            )
        return self


class GpuNodeSettings(_Model):
    instance_type: InstanceTypeName = "g6.12xlarge"
    # The single AZ every GPU node lives in: EFA traffic does not cross AZs, and a computed AZ
    # would replace the node group on a later deploy. `raytrain capacity --write` sets it.
    availability_zone: str
    min_size: int = Field(default=0, ge=0)
    desired_size: int = Field(default=2, ge=0)
    max_size: int = Field(default=2, ge=1)
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    capacity_reservation_id: str | None = None
    placement_group: bool = True
    efa: bool = True
    root_volume_gib: int = Field(default=200, ge=200, le=16384)

    @field_validator("capacity_reservation_id")
    @classmethod
    def _cr(cls, value: str | None) -> str | None:
        if value is not None and not _CAPACITY_RESERVATION_RE.match(value):
            raise ValueError(f"{value!r} is not a capacity reservation id like cr-0123456789abcdef0")
        return value

    @model_validator(mode="after")
    def _rules(self) -> GpuNodeSettings:
        _check_sizes(self.min_size, self.desired_size, self.max_size)
        itype = CATALOGUE[self.instance_type]
        if not itype.gpus:
            raise _FieldError(("instance_type",), f"{self.instance_type!r} has no GPUs")
        if self.efa and not itype.efa:
            efa_types = sorted(t.name for t in CATALOGUE.values() if t.efa)
            raise _FieldError(
                ("instance_type",),
                f"{self.instance_type!r} has no EFA but efa is true; "
                f"EFA GPU types: {', '.join(efa_types)} (or set efa: false)",
            )
        if self.capacity_reservation_id and self.placement_group:
            raise _FieldError(
                ("placement_group",),
                "must be false when capacity_reservation_id is set: a reservation "
                "made outside the placement group causes capacity errors",
            )
        if self.capacity_type is CapacityType.CAPACITY_BLOCK and not self.capacity_reservation_id:
            raise _FieldError(("capacity_reservation_id",), "required when capacity_type is CAPACITY_BLOCK")
        if self.capacity_type is CapacityType.SPOT and self.capacity_reservation_id:
            raise _FieldError(("capacity_reservation_id",), "cannot be used with capacity_type SPOT")
        return self

    @property
    def instance(self) -> Instance:
        return CATALOGUE[self.instance_type]


class AddonSettings(_Model):
    """Pinned Helm chart versions."""

    nvidia_device_plugin: ChartVersion = "0.20.0"
    efa_device_plugin: ChartVersion = "0.5.30"
    kuberay_operator: ChartVersion = "1.7.0"


# Workload/job patterns (chart and RayJob).
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RUN_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,39}$")
_HF_MODEL_RE = re.compile(r"^([A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")
_S3_URI_RE = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/\S*)?$")
_ABS_PATH_RE = re.compile(r"^/\S*$")
_RESERVED_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease", KUBERAY_NAMESPACE}
# Worker variables the chart owns; a worker_env entry for them would be silently ignored.
_MANAGED_ENV = {
    "RAYTRAIN_EXPECT_TRANSPORT": "from job.expect_transport",
    "NVIDIA_VISIBLE_DEVICES": "by the NVIDIA device plugin",
}


class WorkloadSettings(_Model):
    """What the Ray pods run on; the cdk8s chart and the RayJob read these."""

    namespace: str = RAY_NAMESPACE
    image: str = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
    # Pin the exact image for reproducible deploys: sha256:<64 hex>.
    image_digest: str | None = None
    # Must match the Ray inside the image (the DLC v1.1 ships Ray 2.58).
    ray_version: str = "2.58.0"
    # The Ray head runs on a system node and schedules no tasks (num-cpus 0): it only needs room
    # for GCS, the dashboard/job server and the job driver. Requests == limits (Guaranteed QoS).
    head_cpu_millis: int = Field(default=2000, ge=500)
    head_memory_mib: int = Field(default=8192, ge=2048)
    # /dev/shm of each GPU worker (memory-backed emptyDir). The pod default of 64 MiB breaks
    # NCCL and starves Ray's object store; the size counts against the worker's memory limit.
    shm_size_gib: int = Field(default=32, ge=1)
    # Kept free on every GPU node for DaemonSets (aws-node, kube-proxy, device plugins, Pod
    # Identity agent, log/metric agents) after kubelet's own reservation; the worker pod gets
    # the node's allocatable minus this, so it stays schedulable as add-ons come and go.
    gpu_node_daemon_cpu_millis: int = Field(default=1000, ge=0)
    gpu_node_daemon_memory_mib: int = Field(default=4096, ge=0)
    # Added to, or replacing, the GPU workers' NCCL/libfabric environment (e.g. NCCL_DEBUG: WARN
    # once a deployment is proven). RAYTRAIN_EXPECT_TRANSPORT comes from job.expect_transport.
    worker_env: dict[str, str] = Field(default_factory=dict)

    @field_validator("namespace")
    @classmethod
    def _ns(cls, value: str) -> str:
        if not _DNS_LABEL_RE.match(value):
            raise ValueError(f"{value!r} is not a Kubernetes namespace name (DNS-1123 label)")
        if value in _RESERVED_NAMESPACES:
            raise ValueError(f"{value!r} is reserved for the cluster's own components")
        return value

    @field_validator("image_digest")
    @classmethod
    def _digest(cls, value: str | None) -> str | None:
        if value is not None and not _IMAGE_DIGEST_RE.match(value):
            raise ValueError(f"{value!r} is not an image digest like sha256:<64 hex digits>")
        return value

    @field_validator("ray_version")
    @classmethod
    def _ray(cls, value: str) -> str:
        if not _SEMVER_RE.match(value):
            raise ValueError(f"{value!r} is not a Ray version like 2.58.0")
        return value

    @field_validator("worker_env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for key in env:
            if not _ENV_NAME_RE.match(key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if key in _MANAGED_ENV:
                raise ValueError(f"{key} is set by the chart ({_MANAGED_ENV[key]}); remove it here")
        return env

    @property
    def image_ref(self) -> str:
        return f"{self.image}@{self.image_digest}" if self.image_digest else self.image

    def worker_cpu_millis(self, instance: Instance) -> int:
        """CPU of one GPU worker pod: what the node can allocate, less the DaemonSet headroom."""
        return instance.allocatable_cpu_millis() - self.gpu_node_daemon_cpu_millis

    def worker_memory_mib(self, instance: Instance) -> int:
        """Memory of one GPU worker pod (including /dev/shm, which counts against it)."""
        return instance.allocatable_memory_mib() - self.gpu_node_daemon_memory_mib


class ClusterMode(StrEnum):
    # The RayJob carries its own copy of the RayCluster spec (KubeRay creates the cluster for
    # the job and deletes it when the job finishes): GPUs are held only while a job runs, every
    # job starts on a fresh cluster built from exactly the spec its name hashes, and deleting
    # an old RayJob (CloudFormation does, when the name changes) removes its cluster too.
    OWN = "own"
    # A standing RayCluster (same spec, same builder) that the RayJob targets by clusterSelector:
    # for interactive work (dashboard, `ray job submit`) between jobs; it holds the GPUs always.
    STANDING = "standing"


class ModelInit(StrEnum):
    PRETRAINED = "pretrained"
    RANDOM = "random"


class ModelShape(StrEnum):
    QWEN2_5_1_5B = "qwen2.5-1.5b"
    TINY = "tiny"


class Sharding(StrEnum):
    AUTO = "auto"
    FULL = "full"
    HSDP = "hsdp"


class Transport(StrEnum):
    AUTO = "auto"  # efa when gpu_nodes.efa, else socket (the job accepts any on a single node)
    EFA = "efa"
    SOCKET = "socket"
    IB = "ib"
    ANY = "any"


class JobSettings(_Model):
    """The RayJob: its cluster, lifecycle, and the arguments of `python -m training`."""

    cluster: ClusterMode = ClusterMode.OWN
    # Checkpoints live under <checkpoint prefix>/<run_name>. The name stays the same across
    # RayJob retries and new RayJobs, so a new job with the same run_name resumes from the
    # latest checkpoint: change it to start a fresh run.
    run_name: str = "qwen2.5-1.5b-fsdp2"
    # Hugging Face id, s3:// prefix or absolute path: weights (pretrained) and tokenizer.
    model: str = "Qwen/Qwen2.5-1.5B"
    init: ModelInit = ModelInit.PRETRAINED
    shape: ModelShape = ModelShape.QWEN2_5_1_5B
    # "random" (synthetic token ids), an s3:// URI, or an absolute path inside the container.
    data: str = "random"
    seq_len: int = Field(default=2048, ge=16, le=131072)
    # Sequences per optimizer step across all workers; a multiple of micro_batch_size times
    # the number of workers (GPUs) so every worker accumulates the same number of micro-batches.
    global_batch_size: int = Field(default=16, ge=1)
    micro_batch_size: int = Field(default=1, ge=1)
    steps: int = Field(default=200, ge=1)
    lr: float = Field(default=3e-4, gt=0, lt=1)
    seed: int = Field(default=0, ge=0)
    checkpoint_every: int = Field(default=50, ge=1)
    # At least 2: a preemption while writing the newest checkpoint leaves the previous one.
    keep_checkpoints: int = Field(default=2, ge=2)
    # Ray Train restarts of the worker group inside one RayJob (from the latest checkpoint).
    max_failures: int = Field(default=3, ge=1)
    sharding: Sharding = Sharding.AUTO
    # Per-layer torch.compile and Liger's fused linear cross-entropy: the fastest measured GPU
    # settings (BENCHMARKS.md).
    compile: bool = True
    activation_checkpointing: bool = False
    liger: bool = True
    output_dir: str | None = None
    expect_transport: Transport = Transport.AUTO
    # Lifecycle. TTL: how long a finished job (and, in "own" mode, its cluster's record) stays
    # for inspection; must be 0 in "standing" mode (KubeRay allows it only with
    # shutdownAfterJobFinishes, which a job must not do to a cluster it does not own).
    ttl_seconds_after_finished: int = Field(default=3600, ge=0)
    # Wall-clock limit of one RayJob attempt, cluster start-up included.
    active_deadline_seconds: int = Field(default=6 * 3600, ge=60)
    # Whole-RayJob retries, each on a new cluster (own mode); in-job failures use max_failures.
    backoff_limit: int = Field(default=1, ge=0, le=10)

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, value: str) -> str:
        if not _RUN_NAME_RE.match(value):
            raise ValueError(
                f"{value!r} is not a run name: 1-40 of a-z, 0-9, '.', '-', starting with a letter or digit"
            )
        return value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if _HF_MODEL_RE.match(value) or _S3_URI_RE.match(value) or _ABS_PATH_RE.match(value):
            return value
        raise ValueError(
            f"{value!r} is not a model: use a Hugging Face id like Qwen/Qwen2.5-1.5B, an "
            "s3://bucket/prefix, or an absolute path inside the container"
        )

    @field_validator("data")
    @classmethod
    def _data(cls, value: str) -> str:
        if value == "random" or _S3_URI_RE.match(value) or _ABS_PATH_RE.match(value):
            return value
        raise ValueError(
            f"{value!r} is not a data source: use 'random', an s3://bucket/prefix URI, or an "
            "absolute path inside the container"
        )

    @field_validator("output_dir")
    @classmethod
    def _output_dir(cls, value: str | None) -> str | None:
        if value is not None and not _ABS_PATH_RE.match(value):
            raise ValueError(f"{value!r} is not an absolute path inside the container")
        return value

    @model_validator(mode="after")
    def _rules(self) -> JobSettings:
        if self.init is ModelInit.PRETRAINED and self.shape is ModelShape.TINY:
            raise _FieldError(("init",), "shape 'tiny' has no pretrained weights; use init: random")
        if self.micro_batch_size > self.global_batch_size:
            raise _FieldError(
                ("micro_batch_size",),
                f"{self.micro_batch_size} is larger than global_batch_size ({self.global_batch_size})",
            )
        if self.checkpoint_every > self.steps:
            raise _FieldError(
                ("checkpoint_every",),
                f"{self.checkpoint_every} is more than steps ({self.steps}): the run would never checkpoint",
            )
        if self.cluster is ClusterMode.STANDING and self.ttl_seconds_after_finished:
            raise _FieldError(
                ("ttl_seconds_after_finished",),
                "must be 0 when cluster is 'standing': KubeRay allows a TTL only for jobs that "
                "shut their own cluster down",
            )
        return self

    def transport(self, efa: bool) -> Transport:
        """The transport the training job must see between nodes; `auto` follows the nodes."""
        if self.expect_transport is Transport.AUTO:
            return Transport.EFA if efa else Transport.SOCKET
        return self.expect_transport


class StorageSettings(_Model):
    # What happens to stateful resources (checkpoint bucket, KMS keys, log groups) on destroy.
    removal_policy: RemovalPolicy = RemovalPolicy.DESTROY


_CONNECTION_ARN_RE = re.compile(
    r"^arn:aws(-cn|-us-gov)?:(codestar-connections|codeconnections):[a-z0-9-]+:\d{12}:connection/[0-9a-f-]{36}$"
)
_REPOSITORY_RE = re.compile(r"^[\w.-]+/[\w./-]+$")
_CODECOMMIT_RE = re.compile(r"^[\w.-]{1,100}$")
_ENV_NAME_LIST_RE = re.compile(r"^[a-z][a-z0-9-]{0,19}$")


class PipelineSettings(_Model):
    """CDK Pipelines CodePipeline (stacks/pipeline_stack.py), defined by the one environment whose
    file enables it, in that environment's account and region. It deploys `environments` in order."""

    enabled: bool = False
    # Source: a CodeConnections (CodeStar) connection to GitHub/GitLab/Bitbucket plus owner/repo,
    # or a CodeCommit repository name in the pipeline's account. Exactly one of the two.
    connection_arn: str | None = None
    repository: str | None = None
    codecommit_repository: str | None = None
    branch: str = "main"
    environments: list[str] = Field(min_length=1)
    # Deploys that wait, per stack, for a person to approve the created change set.
    manual_approval: list[str] = Field(default_factory=lambda: ["prod"])
    # After deploy, also wait for the environment's RayJob (the one this deploy applied) to succeed:
    # its in-job transport gate fails it unless inter-node NCCL traffic is on EFA. Meant for an
    # environment whose job is a short infrastructure check (dev's `dev-smoke`); the job must be
    # able to finish within the step's time limit.
    smoke_job: list[str] = Field(default_factory=lambda: ["dev"])

    @field_validator("connection_arn")
    @classmethod
    def _connection(cls, value: str | None) -> str | None:
        if value is not None and not _CONNECTION_ARN_RE.match(value):
            raise ValueError(
                f"{value!r} is not a connection ARN like "
                "arn:aws:codeconnections:us-west-2:111122223333:connection/<uuid>"
            )
        return value

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str | None) -> str | None:
        if value is not None and not _REPOSITORY_RE.match(value):
            raise ValueError(f"{value!r} is not a repository like owner/name")
        return value

    @field_validator("codecommit_repository")
    @classmethod
    def _codecommit(cls, value: str | None) -> str | None:
        if value is not None and not _CODECOMMIT_RE.match(value):
            raise ValueError(f"{value!r} is not a CodeCommit repository name")
        return value

    @field_validator("environments")
    @classmethod
    def _environments(cls, names: list[str]) -> list[str]:
        for name in names:
            if not _ENV_NAME_LIST_RE.match(name):
                raise ValueError(f"{name!r} is not an environment name (a file in config/environments)")
        if len(set(names)) != len(names):
            raise ValueError(f"environments repeat: {names}")
        return names

    @model_validator(mode="after")
    def _rules(self) -> PipelineSettings:
        if (self.connection_arn is None) != (self.repository is None):
            raise _FieldError(
                ("repository",) if self.repository is None else ("connection_arn",),
                "connection_arn and repository go together (owner/name reached through the connection)",
            )
        if (self.connection_arn is None) == (self.codecommit_repository is None):
            raise _FieldError(
                ("codecommit_repository",),
                "give exactly one source: connection_arn + repository, or codecommit_repository",
            )
        for field in ("manual_approval", "smoke_job"):
            extra = [n for n in getattr(self, field) if n not in self.environments]
            if extra:
                raise _FieldError((field,), f"{extra} not in environments ({', '.join(self.environments)})")
        return self


class Settings(_Model):
    """One environment. `name` comes from the file name, not from the file."""

    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,19}$")
    account: str
    region: str
    vpc: VpcSettings
    cluster: ClusterSettings
    system_nodes: SystemNodeSettings = Field(default_factory=SystemNodeSettings)
    gpu_nodes: GpuNodeSettings
    addons: AddonSettings = Field(default_factory=AddonSettings)
    workload: WorkloadSettings = Field(default_factory=WorkloadSettings)
    job: JobSettings = Field(default_factory=JobSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    # Only the environment that hosts the pipeline needs (and enables) this section.
    pipeline: PipelineSettings | None = None
    termination_protection: bool = False
    tags: dict[str, str] = Field(default_factory=dict)

    @field_validator("account")
    @classmethod
    def _account(cls, value: str) -> str:
        if not _ACCOUNT_RE.match(value):
            raise ValueError(f"{value!r} is not a 12-digit AWS account id (quote it in YAML)")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not _REGION_RE.match(value):
            raise ValueError(f"{value!r} is not an AWS region name like us-west-2")
        return value

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: dict[str, str]) -> dict[str, str]:
        for key, value in tags.items():
            if not _TAG_KEY_RE.match(key) or key.lower().startswith("aws:"):
                raise ValueError(f"tag key {key!r} is not a valid AWS tag key")
            if len(value) > 256:
                raise ValueError(f"tag {key!r}: value longer than 256 characters")
        return tags

    @model_validator(mode="after")
    def _cross(self) -> Settings:
        for az in self.vpc.availability_zones:
            region = _AZ_RE.match(az).group("region")  # type: ignore[union-attr]
            if region != self.region:
                raise _FieldError(("vpc", "availability_zones"), f"{az!r} is not in region {self.region!r}")
        gpu_az = self.gpu_nodes.availability_zone
        if gpu_az not in self.vpc.availability_zones:
            raise _FieldError(
                ("gpu_nodes", "availability_zone"),
                f"{gpu_az!r} is not one of the VPC's availability zones "
                f"({', '.join(self.vpc.availability_zones)})",
            )
        if self.vpc.nat_gateways > len(self.vpc.availability_zones):
            raise _FieldError(
                ("vpc", "nat_gateways"),
                f"{self.vpc.nat_gateways} NAT gateways but only "
                f"{len(self.vpc.availability_zones)} availability zones",
            )
        return self

    @model_validator(mode="after")
    def _workload_and_job(self) -> Settings:
        # Cross-checks of the workload and job against the node groups they run on.
        gpu = self.gpu_nodes.instance
        work = self.workload
        worker_cpu, worker_mem = work.worker_cpu_millis(gpu), work.worker_memory_mib(gpu)
        if worker_cpu < 1000:
            raise _FieldError(
                ("workload", "gpu_node_daemon_cpu_millis"),
                f"leaves {worker_cpu}m CPU of {gpu.name}'s {gpu.allocatable_cpu_millis()}m "
                "allocatable for the Ray worker (need at least 1000m)",
            )
        shm_mib = work.shm_size_gib * 1024
        if worker_mem < 2 * shm_mib:
            raise _FieldError(
                ("workload", "shm_size_gib"),
                f"{work.shm_size_gib} GiB is more than half of the Ray worker's memory on "
                f"{gpu.name} ({worker_mem} MiB after gpu_node_daemon_memory_mib); /dev/shm "
                "counts against the pod's memory limit",
            )
        system = CATALOGUE[self.system_nodes.instance_type]
        if work.head_cpu_millis > system.allocatable_cpu_millis():
            raise _FieldError(
                ("workload", "head_cpu_millis"),
                f"{work.head_cpu_millis}m does not fit a {system.name} system node "
                f"({system.allocatable_cpu_millis()}m allocatable)",
            )
        if work.head_memory_mib > system.allocatable_memory_mib():
            raise _FieldError(
                ("workload", "head_memory_mib"),
                f"{work.head_memory_mib} MiB does not fit a {system.name} system node "
                f"({system.allocatable_memory_mib()} MiB allocatable)",
            )
        job = self.job
        if job.expect_transport is Transport.EFA and not self.gpu_nodes.efa:
            raise _FieldError(
                ("job", "expect_transport"),
                "is 'efa' but gpu_nodes.efa is false: the job would fail its transport check",
            )
        if self.gpu_nodes.desired_size < 1:
            raise _FieldError(
                ("gpu_nodes", "desired_size"),
                "is 0: the RayJob needs at least one GPU node to run on",
            )
        workers = self.num_workers
        per_step = job.micro_batch_size * workers
        if job.global_batch_size % per_step:
            raise _FieldError(
                ("job", "global_batch_size"),
                f"{job.global_batch_size} is not a multiple of micro_batch_size "
                f"({job.micro_batch_size}) x workers ({workers} = {self.gpu_nodes.desired_size} "
                f"nodes x {gpu.gpus} GPUs)",
            )
        return self

    @property
    def num_workers(self) -> int:
        """Ray Train workers: one per GPU of every GPU node."""
        return self.gpu_nodes.desired_size * self.gpu_nodes.instance.gpus

    @property
    def stack_prefix(self) -> str:
        return f"RayTrain-{self.name}"


def _check_sizes(min_size: int, desired: int, max_size: int) -> None:
    if min_size > max_size:
        raise ValueError(f"min_size ({min_size}) is greater than max_size ({max_size})")
    if not min_size <= desired <= max_size:
        raise ValueError(
            f"desired_size ({desired}) must lie between min_size ({min_size}) and max_size ({max_size})"
        )

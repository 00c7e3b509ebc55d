"""The root model: one environment, and the checks that span its sections."""

from __future__ import annotations

import re

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from config.catalogue import CATALOGUE
from config.gpu_group import subnet_addresses
from config.memory import fit_problem, valid_micro_batches
from config.names import VerifyBuild, arn_partition
from config.network import (
    PRIVATE_SUBNET_MASK,
    PUBLIC_SUBNET_MASK,
    SubnetsDoNotFit,
    private_subnet_capacity,
    smallest_prefix,
    subnet_plan,
    zone_need,
)
from config.registries import ImageSource, cache_prefix_problem, split_image, split_tag
from config.settings import job_rules
from config.settings.base import AZ_RE, FieldError, SettingsModel, environment_name_problem
from config.settings.infrastructure import (
    AddonSettings,
    CapacityType,
    ClusterSettings,
    GpuNodeSettings,
    RegistrySettings,
    StorageSettings,
    SystemNodeSettings,
    VpcSettings,
)
from config.settings.job_rules import ON_DEMAND_CHECKPOINT_EVERY
from config.settings.observability import ObservabilitySettings
from config.settings.pipeline import PipelineSettings
from config.settings.queueing import TopologySettings, queueing_problem
from config.settings.teams import Team, TeamSettings, team_name_problem, team_problem, teams_of
from config.settings.workload import IMAGE, JobSettings, Transport, WorkloadSettings, check_kms_key_arn
from training.sizing.batch import accumulation_steps
from training.sizing.step_time import modelled_gpu

_ACCOUNT_RE = re.compile(r"^\d{12}$")
_REGION_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
_TAG_KEY_RE = re.compile(r"^[\w.:/=+\-@ ]{1,128}$")


class Settings(SettingsModel):
    """One environment. `name` comes from the file name, not from the file."""

    name: str
    account: str
    region: str
    # The customer-managed KMS key of this account's CDK bootstrap bucket, where the training code
    # asset lives, when the account was bootstrapped with `cdk bootstrap --bootstrap-customer-key`
    # or `--bootstrap-kms-key-id` (its ARN: `aws cloudformation describe-stacks --stack-name
    # CDKToolkit`, or the key behind the bucket's default encryption). The Ray pods' role may then
    # kms:Decrypt with it, only through S3 in this region (kms:ViaService). Unset: the bucket uses
    # S3-managed keys (the bootstrap default) or the AWS managed key aws/s3, which need no grant.
    bootstrap_kms_key: str | None = None
    vpc: VpcSettings
    cluster: ClusterSettings
    system_nodes: SystemNodeSettings = Field(default_factory=SystemNodeSettings)
    gpu_nodes: GpuNodeSettings
    addons: AddonSettings = Field(default_factory=AddonSettings)
    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    workload: WorkloadSettings = Field(default_factory=WorkloadSettings)
    job: JobSettings = Field(default_factory=JobSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    # Teams sharing the cluster through Kueue (config/settings/teams.py); none: one implicit team.
    teams: dict[str, TeamSettings] = Field(default_factory=dict)
    # Kueue topology-aware placement of a job's GPU workers (config/settings/queueing.py).
    topology: TopologySettings = Field(default_factory=TopologySettings)
    # Only the environment that hosts the pipeline needs (and enables) this section.
    pipeline: PipelineSettings | None = None
    termination_protection: bool = False
    tags: dict[str, str] = Field(default_factory=dict)
    # The team a view of these settings is for (`for_team`); None: the deployed job's team.
    _team_name: str | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        problem = environment_name_problem(value)
        if problem:
            raise ValueError(problem)
        return value

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

    @field_validator("bootstrap_kms_key")
    @classmethod
    def _bootstrap_key(cls, value: str | None) -> str | None:
        if value is not None:
            check_kms_key_arn(value)
        return value

    @field_validator("teams")
    @classmethod
    def _team_names(cls, teams: dict[str, TeamSettings]) -> dict[str, TeamSettings]:
        for name in teams:
            problem = team_name_problem(name)
            if problem:
                raise ValueError(problem)
        return teams

    @model_validator(mode="after")
    def _teams(self) -> Settings:
        problem = team_problem(self)
        if problem is not None:
            raise FieldError(*problem)
        return self

    @property
    def team_list(self) -> tuple[Team, ...]:
        """Every team, the implicit one where the file names none; the first takes the deployed job."""
        return teams_of(self)

    def team(self, name: str) -> Team | None:
        return next((t for t in self.team_list if t.name == name), None)

    @property
    def deploy_team(self) -> Team:
        """The team whose queue the Workload stack's own RayJob (job.deploy) lands in: the first."""
        return self.team_list[0]

    @property
    def active_team(self) -> Team:
        """The team this view is for: `for_team`'s, else the deployed job's."""
        team = self.team(self._team_name) if self._team_name else None
        return team or self.deploy_team

    def for_team(self, name: str) -> Settings:
        """These settings as one team sees them: its namespace is workload.namespace, so the chart's
        builders (k8s/) make its objects, its RayJobs and its Roles there. Not validated again: only
        the namespace changes, to one the team checks already cleared."""
        team = self.team(name)
        if team is None:
            raise KeyError(name)
        view = self.model_copy(
            update={"workload": self.workload.model_copy(update={"namespace": team.namespace})}
        )
        view._team_name = name
        return view

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
            region = AZ_RE.match(az).group("region")  # type: ignore[union-attr]
            if region != self.region:
                raise FieldError(("vpc", "availability_zones"), f"{az!r} is not in region {self.region!r}")
        gpu_az = self.gpu_nodes.availability_zone
        if gpu_az not in self.vpc.availability_zones:
            raise FieldError(
                ("gpu_nodes", "availability_zone"),
                f"{gpu_az!r} is not one of the VPC's availability zones "
                f"({', '.join(self.vpc.availability_zones)})",
            )
        for arn in self.job.input_kms_keys:
            if arn.split(":")[1] != arn_partition(self.region):
                raise FieldError(
                    ("job", "input_kms_keys"),
                    f"{arn!r} is in partition {arn.split(':')[1]}, this environment's region "
                    f"{self.region} in {arn_partition(self.region)}",
                )
        key = self.bootstrap_kms_key
        if key is not None and key.split(":")[1:4:2] != [arn_partition(self.region), self.region]:
            # SSE-KMS needs a key in the bucket's region (S3 User Guide, "Specifying server-side
            # encryption with AWS KMS"), and the bootstrap bucket is in this environment's.
            raise FieldError(
                ("bootstrap_kms_key",),
                f"{key!r} is not a key of this environment's region {self.region} "
                f"({arn_partition(self.region)}): the bootstrap bucket of {self.region} is encrypted "
                "with a key of its own region",
            )
        if self.registry.pull_through_cache and self.registry.cache_prefix is None:
            problem = cache_prefix_problem(self.name)
            if problem:
                raise FieldError(
                    ("registry", "cache_prefix"),
                    f"unset, so the environment's name would be the prefix, but {problem}: set it",
                )
        if self.vpc.nat_gateways > len(self.vpc.availability_zones):
            raise FieldError(
                ("vpc", "nat_gateways"),
                f"{self.vpc.nat_gateways} NAT gateways but only "
                f"{len(self.vpc.availability_zones)} availability zones",
            )
        return self

    @model_validator(mode="after")
    def _network_fits(self) -> Settings:
        # CDK would fail synthesis tersely on the first; nothing would say the second until pods
        # stay Pending for want of addresses (config/network.py says where each number comes from).
        zones = len(self.vpc.availability_zones)
        try:
            subnet_plan(self.vpc.cidr, zones)
        except SubnetsDoNotFit:
            prefix = smallest_prefix(zones)
            raise FieldError(
                ("vpc", "cidr"),
                f"{self.vpc.cidr} cannot hold the subnets of {zones} zones (each a public "
                f"/{PUBLIC_SUBNET_MASK} and a private /{PRIVATE_SUBNET_MASK}, which CDK aligns to "
                f"their size): use a /{prefix} or larger, e.g. 10.0.0.0/16",
            ) from None
        gpu, system = self.gpu_nodes, self.system_nodes
        gpu_node = subnet_addresses(gpu.instances, efa=gpu.efa)
        system_node = CATALOGUE[system.instance_type].subnet_addresses()
        # Worst case: every system node in the GPU zone too.
        need = zone_need([(gpu.max_size, gpu_node), (system.max_size, system_node)])
        capacity = private_subnet_capacity()
        if need > capacity:
            room = capacity - zone_need([(system.max_size, system_node)])
            raise FieldError(
                ("gpu_nodes", "max_size"),
                f"{gpu.max_size} {gpu.instance_type} nodes take {gpu_node.per_node} addresses each from "
                f"the private /{PRIVATE_SUBNET_MASK} of {gpu.availability_zone} (the VPC CNI's ENIs and "
                f"their IPs), so with up to {system.max_size} system nodes the zone needs {need} of its "
                f"{capacity}: set max_size to at most {max(room // gpu_node.per_node, 0)}",
            )
        return self

    @model_validator(mode="after")
    def _pinned_image(self) -> Settings:
        # A tag can move: a prod-like environment deploys exactly the image CI tested, by digest.
        work = self.workload
        explicit = work.require_image_digest is not None
        required = work.require_image_digest if explicit else self.termination_protection
        if required and work.effective_image_digest is None:
            why = "sets require_image_digest" if explicit else "has termination_protection"
            raise FieldError(
                ("workload", "image_digest"),
                f"this environment {why} and would deploy {work.image} by tag: set image_digest to "
                f"its digest (sha256:<64 hex>, as `docker buildx imagetools inspect {work.image}` "
                "prints it), record it as `digest` in config/image.toml for every environment, or set "
                "workload.require_image_digest: false",
            )
        digest = work.effective_image_digest
        if (
            digest
            and self.image_source.upstream_of(work.image)
            and split_tag(split_image(work.image)[1])[1] is None
        ):
            raise FieldError(
                ("workload", "image"),
                f"{work.image} is pinned by digest and pulled through the pull-through cache, so it "
                "needs its tag too (image:TAG): an image not yet cached is not found by digest "
                "through the cache (aws/containers-roadmap#2837), so the deploy pulls it by tag first",
            )
        return self

    @model_validator(mode="after")
    def _checkpoint_default(self) -> Settings:
        # job.checkpoint_every left unset: the On-Demand default must fall within the steps; on Spot
        # the interval is sized from the step-time model's step (config/checkpointing.py), which
        # must know the GPU.
        job, gpu = self.job, self.gpu_nodes
        if job.checkpoint_every is not None:
            return self
        if gpu.capacity_type is CapacityType.SPOT:
            model = str(gpu.instance.gpu_model)
            if not modelled_gpu(model):
                raise FieldError(
                    ("job", "checkpoint_every"),
                    f"left unset on Spot, it is sized from the predicted step, but the step-time model "
                    f"has no figures for {model} (training/sizing/step_time.py): set job.checkpoint_every",
                )
            return self
        try:
            job_rules.check_checkpoint_every(ON_DEMAND_CHECKPOINT_EVERY, job, default=True)
        except FieldError as exc:
            raise FieldError(("job", *exc.loc), exc.message) from None
        return self

    @model_validator(mode="after")
    def _workload_and_job(self) -> Settings:
        # Cross-checks of the workload and job against the node groups they run on.
        gpu = self.gpu_nodes.instance
        work = self.workload
        worker_cpu, worker_mem = work.worker_cpu_millis(gpu), work.worker_memory_mib(gpu)
        if worker_cpu < 1000:
            raise FieldError(
                ("workload", "gpu_node_daemon_cpu_millis"),
                f"leaves {worker_cpu}m CPU of {gpu.name}'s {gpu.allocatable_cpu_millis()}m "
                "allocatable for the Ray worker (need at least 1000m)",
            )
        shm_mib = work.shm_size_gib * 1024
        if worker_mem < 2 * shm_mib:
            raise FieldError(
                ("workload", "shm_size_gib"),
                f"{work.shm_size_gib} GiB is more than half of the Ray worker's memory on "
                f"{gpu.name} ({worker_mem} MiB after gpu_node_daemon_memory_mib); /dev/shm "
                "counts against the pod's memory limit",
            )
        system = CATALOGUE[self.system_nodes.instance_type]
        if work.head_cpu_millis > system.allocatable_cpu_millis():
            raise FieldError(
                ("workload", "head_cpu_millis"),
                f"{work.head_cpu_millis}m does not fit a {system.name} system node "
                f"({system.allocatable_cpu_millis()}m allocatable)",
            )
        if work.head_memory_mib > system.allocatable_memory_mib():
            raise FieldError(
                ("workload", "head_memory_mib"),
                f"{work.head_memory_mib} MiB does not fit a {system.name} system node "
                f"({system.allocatable_memory_mib()} MiB allocatable)",
            )
        job = self.job
        if job.float8 and not gpu.fp8:
            raise FieldError(
                ("job", "float8"),
                f"is true but {gpu.name}'s {gpu.gpu_model} GPUs have no FP8 tensor cores; float8 "
                "needs L4, L40S, H100 or H200 (g6, g6e, p5 types): leave job.float8 unset (on "
                "only where the GPU has them) or set it to false",
            )
        if job.float8_on(gpu) and self.workload.image == IMAGE.uri and not IMAGE.has("torchao"):
            raise FieldError(
                ("job", "float8"),
                f"is {'true' if job.float8 else f'unset, so on for {gpu.gpu_model} at this micro-batch'}, "
                f"but {IMAGE.uri} "
                "has no torchao and the code asset does not ship it "
                "(config/image.toml [job_packages]); use an image that has torchao "
                "(workload.image) or set job.float8: false",
            )
        if job.expect_transport is Transport.EFA and not self.gpu_nodes.efa:
            raise FieldError(
                ("job", "expect_transport"),
                "is 'efa' but gpu_nodes.efa is false: the job would fail its transport check",
            )
        if job.nodes > self.gpu_nodes.max_size:
            raise FieldError(
                ("job", "nodes"),
                f"{job.nodes} is more than gpu_nodes.max_size ({self.gpu_nodes.max_size}): the "
                "autoscaler could never start the job's nodes",
            )
        if job.start_timeout_seconds >= job.active_deadline_seconds:
            raise FieldError(
                ("job", "start_timeout_seconds"),
                f"{job.start_timeout_seconds} leaves no time to train within active_deadline_seconds "
                f"({job.active_deadline_seconds})",
            )
        workers = self.num_workers
        micro = 1 if job.micro_batch_size == "auto" else job.micro_batch_size
        if accumulation_steps(job.global_batch_size, micro, workers) is None:
            split = "" if job.micro_batch_size == "auto" else f"micro_batch_size ({micro}) x "
            below = job.global_batch_size // (micro * workers) * micro * workers
            near = [b for b in (below, below + micro * workers) if b]
            valid = valid_micro_batches(job.global_batch_size, workers)
            fixes = f"global_batch_size {' or '.join(map(str, near))}"
            if job.micro_batch_size != "auto" and valid:
                fixes += f", or micro_batch_size {', '.join(map(str, valid))} or auto"
            raise FieldError(
                ("job", "global_batch_size"),
                f"{job.global_batch_size} is not a multiple of {split}workers ({workers} = "
                f"{job.nodes} nodes x {gpu.gpus} GPUs); valid: {fixes}",
            )
        return self

    @model_validator(mode="after")
    def _queueing(self) -> Settings:
        # After _cross: a head that fits no system node at all is reported there, by its field.
        problem = queueing_problem(self)
        if problem is not None:
            raise FieldError(*problem)
        return self

    @model_validator(mode="after")
    def _job_fits_gpu(self, info: ValidationInfo) -> Settings:
        # Will it fit? One rank's peak GPU memory (training/sizing/memory_plan.py) against the GPU's.
        # `raytrain plan` skips this (context skip_memory_check) to show why a job does not fit.
        if (info.context or {}).get("skip_memory_check"):
            return self
        gpu = self.gpu_nodes.instance
        problem = fit_problem(self.job, gpu, self.num_workers // gpu.gpus)
        if problem:
            raise FieldError(("job", "micro_batch_size"), problem)
        return self

    @property
    def image_source(self) -> ImageSource:
        """How this environment's nodes pull public images (config/registries.py)."""
        reg = self.registry
        prefix = (reg.cache_prefix or self.name) if reg.pull_through_cache else None
        return ImageSource(account=self.account, region=self.region, prefix=prefix)

    @property
    def ray_image_ref(self) -> str:
        """The image every Ray pod runs, as the nodes pull it: through the environment's
        pull-through cache where its registry is an upstream, pinned by digest when one is set."""
        image = self.image_source.resolve(self.workload.image)
        digest = self.workload.effective_image_digest
        return f"{image}@{digest}" if digest else image

    @property
    def num_workers(self) -> int:
        """Ray Train workers: one per GPU of every GPU node of the job."""
        return self.job.nodes * self.gpu_nodes.instance.gpus

    @property
    def stack_prefix(self) -> str:
        return f"RayTrain-{self.name}"

    @property
    def verify_build(self) -> VerifyBuild:
        """The pipeline's in-VPC verification of this environment (names both sides use)."""
        return VerifyBuild(account=self.account, region=self.region, stack_prefix=self.stack_prefix)

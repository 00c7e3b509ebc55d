"""Workload and job settings: what the Ray pods run on, and the RayJob with its training arguments."""

from __future__ import annotations

import ipaddress
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from config.catalogue import Instance
from config.image import load as load_image
from config.memory import micro_batch as planned_micro_batch
from config.models import ModelError, ModelPlan, resolve
from config.names import KUBERAY_NAMESPACE, RAY_NAMESPACE
from config.settings import job_rules
from config.settings.base import SEMVER_RE, FieldError, SettingsModel
from config.settings.lora import LoraSettings
from training.common.uri import LocationError
from training.common.uri import parse as parse_location
from training.model.lora_spec import LoraSpec
from training.model.precision import FLOAT8_MIN_TOKENS
from training.network.probe import GATE_LOG_ENV, gate_log_problem

_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_IMAGE_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RUN_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,39}$")
_HF_MODEL_RE = re.compile(r"^([A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")
# A KMS key's ARN: a key id (UUID) or a multi-Region key id (mrk- and 32 hex digits).
_KMS_KEY_ARN_RE = re.compile(
    r"^arn:(aws|aws-cn|aws-us-gov):kms:[a-z]{2}(-[a-z]+)+-\d:\d{12}:key/(mrk-[0-9a-f]{32}|[0-9a-f-]{36})$"
)
_ABS_PATH_RE = re.compile(r"^/\S*$")


def _is_s3_uri(value: str, field: str) -> bool:
    """An s3:// URI by the training CLI's own rule (training.common.uri): what passes here, the job
    accepts. A malformed one is refused with that rule's reason."""
    if not value.lower().startswith("s3:"):
        return False
    try:
        return parse_location(field, value, schemes=("s3",)).scheme == "s3"
    except LocationError as exc:
        raise ValueError(str(exc).split(": ", 1)[1]) from None


_RESERVED_NAMESPACES = {"default", "kube-system", "kube-public", "kube-node-lease", KUBERAY_NAMESPACE}
# Worker variables the chart owns; a worker_env entry for them would be silently ignored.
_MANAGED_ENV = {
    "RAYTRAIN_EXPECT_TRANSPORT": "from job.expect_transport",
    "NVIDIA_VISIBLE_DEVICES": "by the NVIDIA device plugin",
    "AWS_REGION": "from the environment's region",
    "AWS_DEFAULT_REGION": "from the environment's region",
    "HF_TOKEN": "from job.hf_token_secret, read in the pod (a token here would be in the template)",
    "HUGGING_FACE_HUB_TOKEN": "from job.hf_token_secret, read in the pod",
    "RAYTRAIN_HF_TOKEN_SECRET": "from job.hf_token_secret",
}


IMAGE = load_image()


def check_kms_key_arn(arn: str) -> None:
    """A KMS key's ARN, not an alias (IAM authorises kms:Decrypt on keys); ValueError otherwise."""
    if ":alias/" in arn:
        raise ValueError(
            f"{arn!r} is an alias: use the key's ARN (arn:aws:kms:REGION:ACCOUNT:key/KEY-ID, "
            "`aws kms describe-key --key-id ALIAS` prints it); IAM authorises kms:Decrypt "
            "on keys, not on aliases"
        )
    if not _KMS_KEY_ARN_RE.match(arn):
        raise ValueError(
            f"{arn!r} is not a KMS key ARN: arn:aws:kms:REGION:ACCOUNT:key/KEY-ID, "
            "e.g. arn:aws:kms:us-west-2:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
        )


class WorkloadSettings(SettingsModel):
    """What the Ray pods run on; the cdk8s chart and the RayJob read these."""

    namespace: str = RAY_NAMESPACE
    # The image and its Ray come from config/image.toml (the one place for the image's versions).
    image: str = IMAGE.uri
    # Pin the exact image for reproducible deploys: sha256:<64 hex>. Unset for the image of
    # config/image.toml: its recorded digest, if any.
    image_digest: str | None = None
    # Must match the Ray inside the image.
    ray_version: str = IMAGE.ray_version
    # Deploy only an image pinned by digest (workload.image_digest, or the digest config/image.toml
    # records for its image). Unset: required where termination_protection is on (prod-like).
    require_image_digest: bool | None = None
    # The region's S3 addresses: the CIDRs of the com.amazonaws.<region>.s3 prefix list, which the
    # S3 gateway endpoint routes (`aws ec2 get-managed-prefix-list-entries --prefix-list-id <pl-id>`).
    # A NetworkPolicy cannot name a prefix list; with these, and a model that does not come from a
    # model hub (job.model an s3:// URI or a path), the Ray pods' HTTPS egress is limited to S3.
    s3_cidrs: list[str] = Field(default_factory=list)
    # The Ray head runs on a system node and schedules no tasks (num-cpus 0): it only needs room
    # for GCS, the dashboard/job server and the job driver. Requests == limits (Guaranteed QoS).
    head_cpu_millis: int = Field(default=2000, ge=500)
    head_memory_mib: int = Field(default=8192, ge=2048)
    # /dev/shm of the head (memory-backed emptyDir): Ray's object store lives there, and the pod
    # default of 64 MiB makes Ray fall back to slow disk. Counts against head_memory_mib.
    head_shm_size_gib: int = Field(default=2, ge=1)
    # /dev/shm of each GPU worker (memory-backed emptyDir). The pod default of 64 MiB breaks
    # NCCL and starves Ray's object store; the size counts against the worker's memory limit.
    shm_size_gib: int = Field(default=32, ge=1)
    # Kept free on every GPU node for DaemonSets (aws-node, kube-proxy, device plugins, Pod
    # Identity agent, log/metric agents) after kubelet's own reservation; the worker pod gets
    # the node's allocatable minus this, so it stays schedulable as add-ons come and go.
    gpu_node_daemon_cpu_millis: int = Field(default=1000, ge=0)
    gpu_node_daemon_memory_mib: int = Field(default=4096, ge=0)
    # Added to, or replacing, the GPU workers' NCCL/libfabric environment (e.g. FI_EFA_* tuning).
    # RAYTRAIN_EXPECT_TRANSPORT comes from job.expect_transport. NCCL_DEBUG below INFO and an
    # NCCL_DEBUG_SUBSYS without INIT and NET are refused: the transport gate reads those lines.
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

    @field_validator("s3_cidrs")
    @classmethod
    def _s3_cidrs(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                net = ipaddress.IPv4Network(value)
            except ValueError:
                raise ValueError(f"{value!r} is not an IPv4 network address like 52.218.128.0/17") from None
            if net.is_private or net.prefixlen < 8:
                raise ValueError(f"{value!r} is not an S3 address range (private, or wider than /8)")
        return values

    @field_validator("ray_version")
    @classmethod
    def _ray(cls, value: str) -> str:
        if not SEMVER_RE.match(value):
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
        # The in-job transport gate reads NCCL's INFO lines for INIT and NET from NCCL_DEBUG_FILE;
        # NCCL reads these once per process, so a quieter setting here blinds the gate.
        problem = gate_log_problem({**GATE_LOG_ENV, **env})
        if problem:
            raise ValueError(
                f"{problem}. NCCL writes these lines to its debug file, not to the job's log, so "
                "keeping them costs nothing; remove the entry"
            )
        return env

    @model_validator(mode="after")
    def _image_ray(self) -> WorkloadSettings:
        if self.image == IMAGE.uri and self.ray_version != IMAGE.ray_version:
            raise FieldError(
                ("ray_version",),
                f"{self.image} ships Ray {IMAGE.ray_version} (config/image.toml), not {self.ray_version}",
            )
        return self

    @property
    def effective_image_digest(self) -> str | None:
        """The digest the pods pin: this environment's, else the one config/image.toml records for
        its image (None: the tag alone)."""
        return self.image_digest or (IMAGE.digest if self.image == IMAGE.uri else None)

    @model_validator(mode="after")
    def _head_shm(self) -> WorkloadSettings:
        if self.head_shm_size_gib * 1024 > self.head_memory_mib // 2:
            raise FieldError(
                ("head_shm_size_gib",),
                f"{self.head_shm_size_gib} GiB is more than half of head_memory_mib "
                f"({self.head_memory_mib} MiB), which it counts against; raise head_memory_mib or lower it",
            )
        return self

    @property
    def image_ref(self) -> str:
        digest = self.effective_image_digest
        return f"{self.image}@{digest}" if digest else self.image

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
    # an old RayJob removes its cluster too. A new name means a new RayJob, not an update: the
    # Workload stack keeps the RayJobs in a manifest resource whose logical ID carries their
    # names, so CloudFormation creates the new one, then (in its cleanup phase, after the update
    # succeeded) deletes the old one with `kubectl delete`.
    OWN = "own"
    # A standing RayCluster (same spec, same builder) that the RayJob targets by clusterSelector:
    # for interactive work (dashboard, `ray job submit`) between jobs; it holds the GPUs always.
    STANDING = "standing"


class ModelInit(StrEnum):
    PRETRAINED = "pretrained"
    RANDOM = "random"


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


class DataFormat(StrEnum):
    AUTO = "auto"
    TEXT = "text"
    CHAT = "chat"


class TooLong(StrEnum):
    DROP = "drop"
    TRUNCATE = "truncate"


class JobSettings(SettingsModel):
    """The RayJob: its cluster, lifecycle, and the arguments of `python -m training`."""

    cluster: ClusterMode = ClusterMode.OWN
    # Whether `cdk deploy` also starts this job (a RayJob in the Workload stack): on for an
    # environment whose pipeline verifies a smoke run (dev), off where jobs are only submitted with
    # `raytrain job submit` (prod). Off: a deploy starts no GPU node (docs/jobs.md).
    deploy: bool = False
    # GPU nodes of the job's Ray cluster: one worker pod per node, one Ray Train worker per GPU.
    # The Cluster Autoscaler starts them when the pods are pending (at most gpu_nodes.max_size).
    nodes: int = Field(default=2, ge=1)
    # Checkpoints live under <checkpoint prefix>/<run_name>: one run. A job whose run already has a
    # checkpoint is refused (no rerun trains nothing in silence) unless `resume` is set; KubeRay's
    # retries of the same RayJob resume it. A deployed job trains <run_name>-<its RayJob's hash>,
    # so a deploy that changes the job starts a new run (docs/jobs.md).
    run_name: str = "qwen2.5-1.5b-fsdp2"
    # Continue run_name's checkpoints: a larger `steps`, and the options that decide what is learned
    # (model, data, lr, seed, batch, ...) as the run had them; refused otherwise, with the options named.
    resume: bool = False
    # Hugging Face id, s3:// prefix or absolute path: weights (pretrained) and tokenizer. Its
    # architecture sizes the job at synthesis (config/models.py; docs/models.md).
    model: str = "Qwen/Qwen2.5-1.5B"
    # Gated or private hub models: the ARN of a Secrets Manager secret (or SSM SecureString) holding
    # a Hugging Face token. Only the ARN reaches the pods; each process reads the token at start
    # (training/common/hub_token.py), the pods' role may read that ARN only (docs/models.md).
    hf_token_secret: str | None = None
    init: ModelInit = ModelInit.PRETRAINED
    # A name of the model catalogue (training/model/configs/: qwen2.5-7b, llama-3.1-8b, ...) or a
    # test shape (tiny, small): the architecture `init: random` builds, or, for a hub model the
    # catalogue does not know by id, the entry whose architecture it shares (the job checks).
    shape: str | None = None
    # A local copy of the model's config.json, or a folder holding one (relative to the repository
    # root): how synthesis sizes an s3:// or in-container model, or any model the catalogue lacks.
    config_json: str | None = None
    # LoRA instead of a full fine-tune (absent: full; an empty `lora:` in a file is refused, as it
    # reads as null). Needs init: pretrained.
    lora: LoraSettings | None = None
    # With LoRA and export: also write the merged full model (Hugging Face folder) beside the adapter.
    export_merged: bool = False
    # "random" (synthetic token ids), an s3:// URI, or an absolute path inside the container:
    # prepared token shards (a manifest.json there), or jsonl/parquet text, which the training job
    # tokenizes first into <checkpoint prefix>/_prepared/<run_name> (training.run.prepare).
    data: str = "random"
    # The text field of the jsonl/parquet records.
    text_field: str = Field(default="text", min_length=1, max_length=200)
    # Share of the text records that may be skipped, counted, when they have no usable text
    # (missing, null or non-string field, malformed line); 0: the first one fails the job,
    # named (docs/data-errors.md). Passed to the preparation and to training's own preparation.
    max_skipped_fraction: float = Field(default=0.0, ge=0, lt=1)
    # text: text_field of each record; chat: `messages` (role/content turns) or `prompt`/`completion`
    # records, rendered with the model's chat template, the loss on the assistant's tokens only
    # (docs/fine-tuning.md); auto: by the first record's fields, or by the prepared data.
    data_format: DataFormat = DataFormat.AUTO
    # Chat data: a conversation longer than seq_len is dropped or truncated (counted either way).
    too_long: TooLong = TooLong.DROP
    # Chat data: the share of conversations dropped as too long above which preparation stops
    # (unset: the training command's default, 0.1; 1: never). `raytrain data check` shows the share.
    max_dropped_fraction: float | None = Field(default=None, ge=0, le=1)
    # Held-out set like `data` (s3://, or an absolute path; read only, like data), or the last
    # eval_fraction of data's blocks; evaluated every eval_every steps (0: each checkpoint) and at
    # the end: loss, perplexity and token accuracy on the target tokens.
    eval_data: str | None = None
    eval_fraction: float | None = Field(default=None, gt=0, lt=1)
    eval_every: int = Field(default=0, ge=0)
    # Stop (with a checkpoint) after this many evaluations without a lower eval loss; 0 = never.
    early_stop_patience: int = Field(default=0, ge=0)
    # The final checkpoint as a Hugging Face folder under <checkpoint prefix>/<run_name>/model.
    export: bool = True
    # Text data: also a RayJob that prepares it ahead of training (python -m training.prepare), into
    # the location the training job reads. Whichever job comes second finds the manifest's
    # fingerprint matching and does nothing.
    prepare_data: bool = False
    # Customer-managed KMS keys that encrypt the buckets of an s3:// data or model (key ARNs, not
    # aliases): the Ray pods' role may kms:Decrypt with them only through S3 (kms:ViaService). The
    # key policy must also let the role use the key: in the key's account a statement that
    # delegates to IAM (the default key policy has it), from another account one naming the role.
    input_kms_keys: list[str] = Field(default_factory=list, max_length=10)
    seq_len: int = Field(default=2048, ge=16, le=131072)
    # Sequences per optimizer step across all workers; a multiple of micro_batch_size times
    # the number of workers (GPUs), of the workers with `auto`, so every worker accumulates the
    # same number of micro-batches.
    global_batch_size: int = Field(default=16, ge=1)
    # Sequences per GPU per forward/backward pass; `auto`: the largest that splits a GPU's share of
    # the global batch evenly and, by the memory plan, leaves 10 % of the GPU free (config/memory.py
    # micro_batch; the RayJob carries the number chosen).
    micro_batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = "auto"
    steps: int = Field(default=200, ge=1)
    # Instead of steps: passes over the training data (may be fractional); the job turns them into
    # steps once the data is prepared (its training sequences x epochs / global_batch_size).
    epochs: float | None = Field(default=None, gt=0)
    lr: float = Field(default=3e-4, gt=0, lt=1)
    # Linear warm-up from 0 to lr, in steps or as a share of the steps (one of them; unset: 10 % of
    # the steps); then lr_schedule: cosine or linear decay to 0.1 x lr at the last step, or constant.
    # Unset values here are the training command's defaults (`python -m training --help`).
    warmup_steps: int | None = Field(default=None, ge=0)
    warmup_ratio: float | None = Field(default=None, ge=0, lt=1)
    lr_schedule: str | None = None
    # AdamW's decoupled weight decay, and the largest gradient norm (0: no clipping).
    weight_decay: float | None = Field(default=None, ge=0)
    grad_clip: float | None = Field(default=None, ge=0)
    seed: int = Field(default=0, ge=0)
    # Unset: every 50 steps (ON_DEMAND_CHECKPOINT_EVERY), on a Spot group the interval sized from the
    # save's time and the interruption rate (config/checkpointing.py checkpoint_interval).
    checkpoint_every: int | None = Field(default=None, ge=1)
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
    # torchao float8 GEMMs for the large linears: 1.54x the original recipe (63 % MFU) against
    # bf16's 1.31x on an H200 at micro-batch 16 x 2048, and its loss follows bf16's within the
    # spread of data orders over 600 steps (BENCHMARKS.md). Unset: on with compiled layers where
    # the GPU node type has FP8 tensor cores (L4, L40S, H100, H200) and a micro-batch holds at
    # least 16,384 tokens (the smallest measured to pay: training.model.precision.FLOAT8_MIN_TOKENS); off
    # elsewhere, so the L4 environments' micro-batches (dev 2 x 2048, prod 4 x 2048) stay bf16.
    # `true` turns it on wherever the GPU has FP8 tensor cores (refused on others: A10G, A100),
    # `false` off. torchao travels in the code asset (config/image.toml [job_packages]).
    float8: bool | None = None
    output_dir: str | None = None
    expect_transport: Transport = Transport.AUTO
    # No effect since own-cluster jobs are queued: Kueue needs shutdownAfterJobFinishes, so a job's
    # whole cluster goes when it ends (TTL 0, k8s/job.py QUEUED_TTL_SECONDS); the driver log stays
    # in the submitter pod. Kept so older files load. Must be 0 in "standing" mode (the job never
    # deletes that cluster). Was how long the head stayed for inspection (KubeRay deletion rules);
    # at most 2^31 - 1: the rules' ttlSeconds is an int32 in the CRD.
    ttl_seconds_after_finished: int = Field(default=3600, ge=0, le=2**31 - 1)
    # Wall-clock limit of one RayJob attempt, cluster start-up included.
    active_deadline_seconds: int = Field(default=6 * 3600, ge=60)
    # Start-up budget of one attempt: its Ray cluster must be running (GPU nodes started from
    # zero by the autoscaler, joined, device plugins up, the ~20 GB image pulled, every pod ready)
    # and the job submitted within this, or the attempt fails (KubeRay preRunningDeadlineSeconds)
    # instead of waiting for capacity until active_deadline_seconds.
    start_timeout_seconds: int = Field(default=1800, ge=300)
    # Whole-RayJob retries, each on a new cluster (own mode): another scale-from-zero and image pull.
    # KubeRay 1.7 retries any failed attempt whatever its exit code (rayjob_controller.go,
    # checkBackoffLimitAndUpdateStatusIfNeeded: all but DeadlineExceeded), so a retry would repeat an
    # input error (exit 4), a refused option or resume (2), the transport gate (3) and a start
    # timeout. Lost workers are Ray Train's to restart inside the job (max_failures); what only a
    # retry recovers is a lost head pod, and the retry resumes the run (--job-id). Default 0: a
    # failure ends the job; resubmit with job.resume once its cause is fixed (docs/jobs.md).
    backoff_limit: int = Field(default=0, ge=0, le=10)

    _lr_schedule = field_validator("lr_schedule")(job_rules.check_lr_schedule)
    _hf_token_secret = field_validator("hf_token_secret")(job_rules.check_token_secret)

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, value: str) -> str:
        if not _RUN_NAME_RE.match(value):
            raise ValueError(
                f"{value!r} is not a run name: 1-40 of a-z, 0-9, '.', '-', starting with a letter or digit"
            )
        return value

    @property
    def model_from_hub(self) -> bool:
        """The model's config, tokenizer (and weights) come from the Hugging Face hub: `model` is a
        hub id, not an s3:// URI or a path inside the container. Random init still reads the config
        and tokenizer."""
        return not (_is_s3_uri(self.model, "model") or _ABS_PATH_RE.match(self.model))

    @field_validator("lora", mode="before")
    @classmethod
    def _lora_section(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, dict):
            raise ValueError(
                f"{value!r}; a mapping of LoRA's settings ({{}} for its defaults: rank 16, alpha 32, "
                "every linear layer; or rank, alpha, dropout, target_modules), or absent for a full "
                "fine-tune"
            )
        return value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if _HF_MODEL_RE.match(value) or _is_s3_uri(value, "model") or _ABS_PATH_RE.match(value):
            return value
        raise ValueError(
            f"{value!r} is not a model: use a Hugging Face id like Qwen/Qwen2.5-1.5B, an "
            "s3://bucket/prefix, or an absolute path inside the container"
        )

    @field_validator("eval_data")
    @classmethod
    def _eval_data(cls, value: str | None) -> str | None:
        if value is None or _is_s3_uri(value, "eval_data") or _ABS_PATH_RE.match(value):
            return value
        raise ValueError(
            f"{value!r} is not an eval set: use an s3://bucket/prefix URI or an absolute path "
            "inside the container"
        )

    @field_validator("data")
    @classmethod
    def _data(cls, value: str) -> str:
        if value == "random" or _is_s3_uri(value, "data") or _ABS_PATH_RE.match(value):
            return value
        raise ValueError(
            f"{value!r} is not a data source: use 'random', an s3://bucket/prefix URI, or an "
            "absolute path inside the container"
        )

    @field_validator("input_kms_keys")
    @classmethod
    def _input_kms_keys(cls, value: list[str]) -> list[str]:
        for arn in value:
            check_kms_key_arn(arn)
        if len(set(value)) != len(value):
            raise ValueError("lists a key twice")
        return value

    @field_validator("micro_batch_size", mode="before")
    @classmethod
    def _micro_batch_size(cls, value: object) -> object:
        # One message for the two forms (pydantic would report each member of the union).
        if value == "auto" or (type(value) is int and value >= 1):
            return value
        raise ValueError(f"must be a positive integer or 'auto', got {value!r}")

    @field_validator("output_dir")
    @classmethod
    def _output_dir(cls, value: str | None) -> str | None:
        if value is not None and not _ABS_PATH_RE.match(value):
            raise ValueError(f"{value!r} is not an absolute path inside the container")
        return value

    @field_validator("shape")
    @classmethod
    def _shape(cls, value: str | None) -> str | None:
        from training.model.shapes import SHAPES

        if value is not None and value not in SHAPES:
            raise ValueError(f"{value!r} is not a known shape; known: {', '.join(SHAPES)}")
        return value

    @model_validator(mode="after")
    def _model_rules(self) -> JobSettings:
        if self.init is ModelInit.PRETRAINED and self.shape in ("tiny", "small"):
            raise FieldError(("init",), f"shape {self.shape!r} has no pretrained weights; use init: random")
        try:
            plan = self.model_plan
        except ModelError as exc:
            raise FieldError((exc.field,), exc.message) from None
        if self.lora is not None:
            if self.init is ModelInit.RANDOM:
                raise FieldError(
                    ("lora",),
                    "needs init: pretrained: adapters on randomly initialised weights learn nothing "
                    "a full fine-tune would not; drop job.lora or use a pretrained job.model",
                )
            names = {"rank": "rank", "alpha": "alpha", "dropout": "dropout", "targets": "target_modules"}
            problem = self.lora.spec.model_problem(plan.dims.linear_shapes(), plan.dims.model_type, names)
            if problem:
                field, message = problem
                raise FieldError(("lora", names[field]), message.split(": ", 1)[1])
        if self.lora is not None and self.float8:
            raise FieldError(
                ("float8",), "not with job.lora: LoRA's frozen bf16 base is not converted; drop job.float8"
            )
        if self.export_merged and (self.lora is None or not self.export):
            raise FieldError(
                ("export_merged",),
                "merges LoRA's adapters into the exported model: needs job.lora and job.export: true",
            )
        if self.seq_len > plan.dims.max_seq:
            raise FieldError(
                ("seq_len",),
                f"{self.seq_len} is beyond the model's {plan.dims.max_seq} positions ({plan.source})",
            )
        return self

    @property
    def model_plan(self) -> ModelPlan:
        """The architecture the job is planned for (config/models.py)."""
        return resolve(self.model, self.init.value, self.shape, self.config_json)

    @property
    def lora_spec(self) -> LoraSpec | None:
        return None if self.lora is None else self.lora.spec

    @model_validator(mode="after")
    def _rules(self) -> JobSettings:
        if self.micro_batch_size != "auto" and self.micro_batch_size > self.global_batch_size:
            raise FieldError(
                ("micro_batch_size",),
                f"{self.micro_batch_size} is larger than global_batch_size ({self.global_batch_size})",
            )
        job_rules.check(self)
        if self.input_kms_keys and not self.s3_inputs_set:
            raise FieldError(
                ("input_kms_keys",),
                "is set but neither data nor model is an s3:// location: the keys would decrypt nothing",
            )
        if (self.eval_data or self.eval_fraction) and self.data == "random":
            raise FieldError(
                ("eval_data" if self.eval_data else "eval_fraction",), "needs real data: data is 'random'"
            )
        if self.eval_data and self.eval_fraction:
            raise FieldError(("eval_fraction",), "set eval_data or eval_fraction, not both")
        if (self.eval_every or self.early_stop_patience) and not (self.eval_data or self.eval_fraction):
            field = "eval_every" if self.eval_every else "early_stop_patience"
            raise FieldError((field,), "needs an eval set: eval_data or eval_fraction")
        if self.prepare_data and self.data == "random":
            raise FieldError(("prepare_data",), "needs text data: data is 'random'")
        if self.cluster is ClusterMode.STANDING and self.ttl_seconds_after_finished:
            raise FieldError(
                ("ttl_seconds_after_finished",),
                "must be 0 when cluster is 'standing': it is how long a job's own cluster keeps "
                "its head after the job ends, and a job never deletes the standing cluster",
            )
        return self

    @property
    def s3_inputs_set(self) -> bool:
        """Whether data, eval_data or model is read from S3."""
        return any(v and v.startswith("s3://") for v in (self.data, self.eval_data, self.model))

    def micro_batch(self, gpu: Instance) -> int:
        """The micro-batch the job runs on `gpu`'s nodes (`auto` resolved: config/memory.py)."""
        return planned_micro_batch(self, gpu, self.nodes)

    def float8_on(self, gpu: Instance, micro: int | None = None) -> bool:
        """Whether the job trains with float8 linears on `gpu`'s node type at micro-batch `micro`
        (default: the job's); unset: where the GPU has FP8 tensor cores, with compiled layers, at
        micro-batches where it was measured to pay (the training CLI's own rule,
        training.model.precision.float8_by_default)."""
        if self.lora is not None:
            return False  # LoRA's frozen bf16 base is not converted (the training CLI refuses both)
        if self.float8 is not None:
            return self.float8
        tokens = (micro or self.micro_batch(gpu)) * self.seq_len
        return gpu.fp8 and self.compile and tokens >= FLOAT8_MIN_TOKENS

    def transport(self, efa: bool) -> Transport:
        """The transport the training job must see between nodes; `auto` follows the nodes."""
        if self.expect_transport is Transport.AUTO:
            return Transport.EFA if efa else Transport.SOCKET
        return self.expect_transport

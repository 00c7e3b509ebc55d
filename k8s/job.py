"""The RayJob: `python -m training` with the job settings, its runtime_env, the submitter pod, its name.

`code_uri` and `checkpoint_uri` may be unresolved CDK tokens when the chart is synthesized inside
the CDK app: they are only ever embedded in strings, never parsed, and they are kept out of the
RayJob's name hash (token text is not stable); `code_hash` (the asset hash) stands in for the code.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from typing import Any

from config.checkpointing import checkpoint_interval
from config.names import (
    SERVICE_ACCOUNT,
    STANDING_CLUSTER_NAME,
    SUBMITTER_CPU_MILLIS,
    SUBMITTER_MEMORY_MIB,
)
from config.settings import ClusterMode, Settings
from k8s.cluster import RAYJOB_CLUSTER_TYPES, SYSTEM_NODE_SELECTOR, ray_cluster_spec
from k8s.imports.raycluster.io import ray as rc
from k8s.imports.rayjob.io import ray as rj
from k8s.pods import (
    SUBMITTER,
    SpecTypes,
    aws_region_env,
    container_security,
    labels,
    pod_security,
    resources,
)

# The job submitter only runs `ray job submit` and follows the logs (config/names.py).
SUBMITTER_CPU = f"{SUBMITTER_CPU_MILLIS}m"
# Written as before ("1Gi"): the RayJob's name hashes its spec text.
SUBMITTER_MEMORY = (
    f"{SUBMITTER_MEMORY_MIB // 1024}Gi" if SUBMITTER_MEMORY_MIB % 1024 == 0 else f"{SUBMITTER_MEMORY_MIB}Mi"
)
SUBMITTER_TYPES = SpecTypes(rj, "RayJobSpecSubmitterPodTemplate")


# Text data is tokenized into <checkpoint prefix>/_prepared/<run_name>: both the training job and
# the preparation job get it from prepared_data_uri, and the pods' role can already write there.
PREPARED_DIR = "_prepared"


def prepared_data_uri(settings: Settings, *, checkpoint_uri: str) -> str | None:
    """Where text data is prepared into token shards; None for random data or data that names a
    location the training job reads as it is."""
    if settings.job.data == "random":
        return None
    return f"{checkpoint_uri}/{PREPARED_DIR}/{settings.job.run_name}"


def prepare_args(settings: Settings, *, checkpoint_uri: str) -> list[str]:
    """Arguments of `python -m training.prepare`: the same data, tokenizer and seq_len as training."""
    job = settings.job
    out = prepared_data_uri(settings, checkpoint_uri=checkpoint_uri)
    if out is None:
        raise ValueError("job.prepare_data: needs text data: data is 'random'")
    return ["--data", job.data, "--out", out, *_data_flags(job), "--address", "auto"]


def check_args(settings: Settings, *, data: str | None = None) -> list[str]:
    """Arguments of `python -m training.prepare --check` (`raytrain data check`): the job's data (or
    `data`) read, rendered and refused exactly as its preparation would, nothing written."""
    return ["--check", "--data", data or settings.job.data, *_data_flags(settings.job)]


def _data_flags(job: Any) -> list[str]:
    """How the job's data becomes tokens: the preparation's flags beside --data and --out."""
    dropped = (
        [] if job.max_dropped_fraction is None else ["--max-dropped-fraction", repr(job.max_dropped_fraction)]
    )
    return [
        "--model", job.model,
        *(["--shape", job.shape] if job.shape else []),
        "--seq-len", str(job.seq_len),
        "--text-field", job.text_field,
        "--max-skipped-fraction", repr(job.max_skipped_fraction),
        "--data-format", job.data_format.value,
        "--too-long", job.too_long.value,
        *dropped,
    ]  # fmt: skip


def deployed_run_name(settings: Settings, rayjob: str) -> str:
    """The run a deployed RayJob trains: job.run_name and the RayJob's spec hash, unless job.resume.
    A deploy that changes the job makes a new RayJob (rayjob_name), which then starts a new run
    instead of finding the previous job's checkpoint at or past job.steps and training nothing
    (dev's smoke job, deployed again and again); KubeRay's retry of the same RayJob keeps the name
    and resumes (training/checkpoint/run_state.py). With job.resume every deploy continues job.run_name."""
    if settings.job.resume:
        return settings.job.run_name
    return f"{settings.job.run_name}-{rayjob.rsplit('-', 1)[-1]}"


def training_args(
    settings: Settings, *, checkpoint_uri: str, run_name: str | None = None, job_id: str | None = None
) -> list[str]:
    """Arguments of `python -m training`, from the job settings. `run_name` (default job.run_name)
    and `job_id` (the RayJob's name: a retry of it resumes its own run) come from the job's name."""
    job = settings.job
    args = [
        "--run-name", run_name or job.run_name,
        "--storage-path", checkpoint_uri,
        "--num-workers", str(settings.num_workers),
        # The entry point runs on the head: join the cluster it runs in.
        "--address", "auto",
        "--max-failures", str(job.max_failures),
        # As set, or the default for the group's capacity (on Spot sized from the save's time and the
        # interruption rate): config/checkpointing.py, which `raytrain plan` shows too.
        "--checkpoint-every", str(checkpoint_interval(settings).steps),
        "--keep-checkpoints", str(job.keep_checkpoints),
        "--model", job.model,
        "--init", job.init.value,
        *(["--shape", job.shape] if job.shape else []),
        # The worker stops, naming the difference, if the model it loads is not the one planned.
        "--planned-dims", job.model_plan.dims.signature(),
        "--data", job.data,
        "--seq-len", str(job.seq_len),
        "--global-batch-size", str(job.global_batch_size),
        # `auto` as synthesis resolved it for the node group's GPU: the change set shows the number.
        "--micro-batch-size", str(job.micro_batch(settings.gpu_nodes.instance)),
        *(["--steps", str(job.steps)] if job.epochs is None else ["--epochs", repr(job.epochs)]),
        "--lr", repr(job.lr),
        *_schedule_args(job),
        "--seed", str(job.seed),
        "--sharding", job.sharding.value,
        # `auto` stays auto: the job resolves it per run ("any" on one node, where no inter-node
        # link exists, else RAYTRAIN_EXPECT_TRANSPORT, which the workers get from the settings).
        "--expect-transport", job.expect_transport.value,
    ]  # fmt: skip
    # Explicit either way: the training CLI's own default (on for GPU workers) must not decide.
    args.append("--compile" if job.compile else "--no-compile")
    if job.activation_checkpointing:
        args.append("--activation-checkpointing")
    args.append("--liger" if job.liger else "--no-liger")
    args.append("--float8" if job.float8_on(settings.gpu_nodes.instance) else "--no-float8")
    if job.output_dir:
        args += ["--output-dir", job.output_dir]
    prepared = prepared_data_uri(settings, checkpoint_uri=checkpoint_uri)
    if prepared is not None:  # ignored by the job when `data` is already prepared shards
        args += ["--text-field", job.text_field, "--prepared-data", prepared,
                 "--max-skipped-fraction", repr(job.max_skipped_fraction)]  # fmt: skip
        args += ["--data-format", job.data_format.value, "--too-long", job.too_long.value]
        if job.max_dropped_fraction is not None:
            args += ["--max-dropped-fraction", repr(job.max_dropped_fraction)]
    args += _eval_args(job)
    args.append("--export" if job.export else "--no-export")
    if job.lora_spec is not None:
        args += job.lora_spec.as_args()
    if job.export_merged:
        args.append("--export-merged")
    if job.resume:  # continue the run's checkpoints (refused if its options differ but the steps)
        args.append("--resume")
    if job_id is not None:
        args += ["--job-id", job_id]
    if settings.observability.metrics:
        # Step metrics as CloudWatch EMF lines (training/reporting/emf.py), dimension ClusterName.
        args += ["--metrics-cluster", settings.cluster.name]
    return args


def _schedule_args(job: Any) -> list[str]:
    """Warm-up, schedule, weight decay and clipping, only where the job sets them: unset, the
    training command's own defaults apply (written there once)."""
    flags = {
        "--warmup-steps": job.warmup_steps,
        "--warmup-ratio": job.warmup_ratio,
        "--lr-schedule": job.lr_schedule,
        "--weight-decay": job.weight_decay,
        "--grad-clip": job.grad_clip,
    }
    return [part for flag, value in flags.items() if value is not None for part in (flag, str(value))]


def _eval_args(job: Any) -> list[str]:
    """The held-out evaluation flags (training/methods/evaluate.py), only where the job sets them."""
    args: list[str] = []
    if job.eval_data:
        args += ["--eval-data", job.eval_data]
    if job.eval_fraction:
        args += ["--eval-fraction", repr(job.eval_fraction)]
    if job.eval_every:
        args += ["--eval-every", str(job.eval_every)]
    if job.early_stop_patience:
        args += ["--early-stop-patience", str(job.early_stop_patience)]
    return args


def entrypoint(settings: Settings, *, checkpoint_uri: str, **run: str | None) -> str:
    """`run`: training_args' run_name and job_id."""
    args = training_args(settings, checkpoint_uri=checkpoint_uri, **run)
    return shlex.join(["python", "-m", "training", *args])


def prepare_entrypoint(settings: Settings, *, checkpoint_uri: str) -> str:
    args = prepare_args(settings, checkpoint_uri=checkpoint_uri)
    return shlex.join(["python", "-m", "training.prepare", *args])


def runtime_env_yaml(code_uri: str) -> str:
    """The code asset as working_dir, and nothing to install: the packages the image lacks travel
    inside the asset (stacks/code_asset.py). A pip runtime_env would, with Ray 2.58, copy the image's
    multi-GB virtualenv on every node and reach the package index at every job start."""
    # JSON is YAML: no quoting rules to get wrong around a token or a URI.
    return json.dumps({"working_dir": code_uri}, sort_keys=True)


def _submitter(settings: Settings) -> Any:
    """The Kubernetes Job's pod that runs `ray job submit` (K8sJobMode), on a system node."""
    t = SUBMITTER_TYPES
    return t("")(
        metadata=t("Metadata")(labels=labels(SUBMITTER)),
        spec=t("Spec")(
            # KubeRay fills in the `ray job submit` command and the head's address and token.
            containers=[
                t("SpecContainers")(
                    name="ray-job-submitter",
                    image=settings.ray_image_ref,
                    image_pull_policy="IfNotPresent",
                    # `ray job submit` itself makes no AWS call; the region is there for any AWS
                    # SDK or CLI the submission runs (one value for every Ray pod).
                    env=[
                        t("SpecContainersEnv")(name=k, value=v)
                        for k, v in aws_region_env(settings.region).items()
                    ],
                    resources=resources(t, {"cpu": SUBMITTER_CPU, "memory": SUBMITTER_MEMORY}),
                    security_context=container_security(t, []),
                )
            ],
            restart_policy="Never",
            node_selector=dict(SYSTEM_NODE_SELECTOR),
            # The submitter needs neither AWS nor the Kubernetes API.
            automount_service_account_token=False,
            security_context=pod_security(t),
        ),
    )


def job_spec(
    settings: Settings,
    *,
    code_uri: str,
    checkpoint_uri: str,
    service_account_name: str,
    run_name: str | None = None,
    job_id: str | None = None,
) -> rj.RayJobSpec:
    """The RayJob's spec: entry point, runtime_env, submitter, and its own cluster or the standing one.
    `run_name` and `job_id` as training_args (left out of the spec that rayjob_name hashes)."""
    return _spec(
        settings,
        entrypoint(settings, checkpoint_uri=checkpoint_uri, run_name=run_name, job_id=job_id),
        code_uri=code_uri,
        service_account_name=service_account_name,
    )


def prepare_job_spec(
    settings: Settings,
    *,
    code_uri: str,
    checkpoint_uri: str,
    service_account_name: str,
) -> rj.RayJobSpec:
    """The preparation RayJob: `python -m training.prepare` on a cluster like the training job's
    (its nodes' CPUs run the Ray Data tasks), with the same code and lifecycle. Tokenizers, pyarrow
    and Ray Data are in the image."""
    return _spec(
        settings,
        prepare_entrypoint(settings, checkpoint_uri=checkpoint_uri),
        code_uri=code_uri,
        service_account_name=service_account_name,
    )


# A job's own cluster under Kueue (k8s/kueue.py: every own-cluster RayJob is queued). Kueue admits
# such a RayJob only with shutdownAfterJobFinishes: true ("a kueue managed job should delete the
# cluster after finishing", kueue v0.19.2 pkg/controller/jobs/rayjob/rayjob_webhook.go), and KubeRay
# refuses that beside deletion rules (utils/validation.go validateDeletionConfiguration, v1.7.0), so
# the earlier rules (workers at once, the head after an inspection time) give way to it. Kueue gives
# the job's quota back when it ends (rayjob_controller.go Finished: deployment status Complete or
# Failed), so its cluster goes then too, GPU workers and head: ttlSecondsAfterFinished 0, or the
# next admitted job would find the nodes still taken. The driver log stays: KubeRay deletes the
# RayCluster only, "so that users can still access the driver logs" (rayjob_controller.go
# handleShutdownAfterJobFinishes), and the RayJob stays until deleted. A job stopped from Ray
# (`ray job stop`) ends Complete and is cleaned up the same way.
QUEUED_TTL_SECONDS = 0


def _spec(settings: Settings, entry: str, *, code_uri: str, service_account_name: str) -> rj.RayJobSpec:
    job = settings.job
    own = job.cluster is ClusterMode.OWN
    return rj.RayJobSpec(
        entrypoint=entry,
        runtime_env_yaml=runtime_env_yaml(code_uri),
        submission_mode="K8sJobMode",  # a Kubernetes Job runs `ray job submit` and follows it
        submitter_pod_template=_submitter(settings),
        # Own cluster: queued by Kueue, created suspended (Kueue unsuspends it on admission and
        # suspends it again on preemption or eviction), deleted when the job ends (above).
        # Standing cluster: selected by name and left running; not managed by Kueue.
        shutdown_after_job_finishes=True if own else None,
        ttl_seconds_after_finished=QUEUED_TTL_SECONDS if own else None,
        suspend=True if own else None,
        cluster_selector=None if own else {"ray.io/cluster": STANDING_CLUSTER_NAME},
        ray_cluster_spec=ray_cluster_spec(
            settings, service_account_name=service_account_name, types=RAYJOB_CLUSTER_TYPES
        )
        if own
        else None,
        active_deadline_seconds=job.active_deadline_seconds,
        # GPU nodes start from zero when the cluster's worker pods are pending, and KubeRay submits
        # the entry point only once every pod is ready. "PreRunningDeadlineSeconds is the deadline
        # in seconds for a RayJob to reach the Running state from when it is first initialized";
        # past it the attempt fails (KubeRay API reference, v1.6+) instead of holding the nodes that
        # did start until activeDeadlineSeconds.
        pre_running_deadline_seconds=job.start_timeout_seconds,
        backoff_limit=job.backoff_limit,
    )


def rayjob_name(settings: Settings, *, code_hash: str, service_account_name: str = SERVICE_ACCOUNT) -> str:
    """`rj-<run name>-<hash>`: the hash covers the whole job spec (its cluster copy, or the standing
    cluster's spec) and the code, so a changed job or changed code gets a new RayJob (KubeRay
    ignores spec updates of an existing one). The URIs enter as placeholders: at synth time they
    are tokens whose text is not stable; `code_hash` stands for the code."""
    return _name(settings, job_spec, "rj", code_hash=code_hash, service_account_name=service_account_name)


def prepare_rayjob_name(
    settings: Settings, *, code_hash: str, service_account_name: str = SERVICE_ACCOUNT
) -> str:
    """`rj-prep-<run name>-<hash>`, hashed like rayjob_name."""
    return _name(
        settings, prepare_job_spec, "rj-prep", code_hash=code_hash, service_account_name=service_account_name
    )


def _name(settings: Settings, build: Any, prefix: str, *, code_hash: str, service_account_name: str) -> str:
    spec = build(
        settings,
        code_uri="<code>",
        checkpoint_uri="<checkpoint>",
        service_account_name=service_account_name,
    )
    material: dict[str, Any] = {"job": rj.RayJob.manifest(spec=spec)["spec"], "code": code_hash}
    if settings.job.cluster is ClusterMode.STANDING:
        cluster = ray_cluster_spec(settings, service_account_name=service_account_name)
        material["standing_cluster"] = rc.RayCluster.manifest(spec=cluster)["spec"]
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:10]
    # A DNS-1035 label of at most 47 characters: KubeRay appends 6 to name the job's cluster.
    room = 32 - len(prefix)  # 30 for "rj-": names from before the preparation job stay as they were
    slug = re.sub(r"[^a-z0-9-]+", "-", settings.job.run_name).strip("-")[:room].strip("-")
    return f"{prefix}-{slug}-{digest}" if slug else f"{prefix}-{digest}"

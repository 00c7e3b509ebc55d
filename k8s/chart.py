"""The workload chart: Ray namespace objects, the RayCluster spec, the RayJob, network policies.

Every number comes from `Settings` and the instance catalogue. The RayCluster spec is built by one
function (`ray_cluster_spec`) and used either by the standing RayCluster or, as a copy, by the
RayJob's `rayClusterSpec` (`job.cluster` in the settings says which; see `ClusterMode`).

`code_uri` and `checkpoint_uri` may be unresolved CDK tokens when the chart is synthesized inside
the CDK app: they are only ever embedded in strings, never parsed, and they are kept out of the
RayJob's name hash (token text is not stable); `code_hash` (the asset hash) stands in for the code.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import shlex
from pathlib import Path
from typing import Any

import cdk8s
import cdk8s_plus_27 as kplus
from cdk8s_plus_27 import k8s as kube

from config.names import (
    EFA_RESOURCE,
    GPU_NODE_LABELS,
    GPU_RESOURCE,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    KUBERAY_NAMESPACE,
    NODE_ROLE_LABEL,
    PART_OF,
    PART_OF_LABEL,
    SERVICE_ACCOUNT,
    STANDING_CLUSTER_NAME,
    SYSTEM_NODE_LABELS,
)
from config.settings import ClusterMode, Settings
from k8s.imports.raycluster.io import ray as rc
from k8s.imports.rayjob.io import ray as rj

# The KubeRay operator's namespace, where the cluster stack installs it. Its pods reach the head's
# dashboard port to submit and follow jobs; nothing else outside the namespace may.
KUBERAY_OPERATOR_NAMESPACE = KUBERAY_NAMESPACE

# Node labels and the GPU taint are the node groups' own (one definition for EKS and the pods).
SYSTEM_NODE_SELECTOR = dict(SYSTEM_NODE_LABELS)
GPU_NODE_SELECTOR = {NODE_ROLE_LABEL: GPU_NODE_LABELS[NODE_ROLE_LABEL]}

GCS_PORT = 6379
DASHBOARD_PORT = 8265  # dashboard and job server (HTTP)
CLIENT_PORT = 10001
HEAD_PORTS = {"gcs": GCS_PORT, "dashboard": DASHBOARD_PORT, "client": CLIENT_PORT}

# Paths inside the Ray containers (not on this machine): Ray's session/log directory, an emptyDir,
# and the shared-memory mount.
RAY_TMP = "/tmp/ray"  # noqa: S108
DEV_SHM = "/dev/shm"  # noqa: S108

# EKS Pod Identity agent (a DaemonSet on every node): the Ray pods get their AWS credentials here.
POD_IDENTITY_AGENT_CIDR = "169.254.170.23/32"
# Never reached over the HTTPS egress rule: private (VPC, peered networks) and link-local (IMDS).
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16")

# Extra packages the job installs on top of the image, through the runtime_env. Exact pins only;
# a change here changes the RayJob's name, like a code change. The DLC has no liger-kernel: the job
# adds it when `job.liger` is on (the version measured in BENCHMARKS.md).
TRAINING_RUNTIME_PIP: tuple[str, ...] = ()
LIGER_PIP = "liger-kernel==0.8.5"


def runtime_pip(settings: Settings) -> list[str]:
    return [*TRAINING_RUNTIME_PIP, *([LIGER_PIP] if settings.job.liger else [])]


COMPONENT = "app.kubernetes.io/component"
HEAD, WORKER, SUBMITTER = "ray-head", "ray-worker", "job-submitter"
WORKER_GROUP = "gpu"

# The job submitter only runs `ray job submit` and follows the logs.
SUBMITTER_CPU = "500m"
SUBMITTER_MEMORY = "1Gi"


def _labels(component: str) -> dict[str, str]:
    return {PART_OF_LABEL: PART_OF, COMPONENT: component}


# --- RayCluster spec ------------------------------------------------------------------------------


class SpecTypes:
    """One family of generated classes for a RayCluster spec.

    The RayCluster CRD and the RayJob CRD's `rayClusterSpec` have the same schema, but cdk8s-cli
    generates separate classes for each (`RayClusterSpecHeadGroupSpec...` and
    `RayJobSpecRayClusterSpecHeadGroupSpec...`). The one builder below takes the family, so the
    standing cluster and the job's copy are the same code, both checked by the generated types.
    """

    def __init__(self, module: Any, prefix: str) -> None:
        self._module = module
        self._prefix = prefix

    def __call__(self, suffix: str) -> Any:
        return getattr(self._module, self._prefix + suffix)

    def sub(self, infix: str) -> SpecTypes:
        return SpecTypes(self._module, self._prefix + infix)


RAYCLUSTER_TYPES = SpecTypes(rc, "RayClusterSpec")
RAYJOB_CLUSTER_TYPES = SpecTypes(rj, "RayJobSpecRayClusterSpec")


def _quantities(t: SpecTypes, kind: str, values: dict[str, str | int]) -> Any:
    cls = t(f"SpecContainersResources{kind}")
    return {
        key: cls.from_number(v) if isinstance(v, int) else cls.from_string(v) for key, v in values.items()
    }


def _resources(t: SpecTypes, values: dict[str, str | int]) -> Any:
    # requests == limits: Guaranteed QoS, so the kubelet never evicts a training pod for a
    # neighbour and CPU pinning policies apply.
    return t("SpecContainersResources")(
        limits=_quantities(t, "Limits", values), requests=_quantities(t, "Requests", values)
    )


def _empty_dir(t: SpecTypes, name: str, *, memory: bool = False, size_gib: int | None = None) -> Any:
    size = t("SpecVolumesEmptyDirSizeLimit").from_string(f"{size_gib}Gi") if size_gib else None
    return t("SpecVolumes")(
        name=name,
        empty_dir=t("SpecVolumesEmptyDir")(medium="Memory" if memory else None, size_limit=size),
    )


def _container_security(t: SpecTypes, add: list[str]) -> Any:
    # No privilege escalation and no capabilities beyond what the pod needs (`add`). The DLC image
    # runs as root, so runAsNonRoot is not set (the kubelet would refuse to start it); a root
    # process without capabilities cannot load modules, change ownership or bypass file modes.
    # The root filesystem stays writable: Ray, pip (runtime_env) and the HF cache write outside
    # /tmp/ray.
    return t("SpecContainersSecurityContext")(
        allow_privilege_escalation=False,
        privileged=False,
        capabilities=t("SpecContainersSecurityContextCapabilities")(drop=["ALL"], add=add or None),
    )


def _pod_security(t: SpecTypes) -> Any:
    return t("SpecSecurityContext")(
        seccomp_profile=t("SpecSecurityContextSeccompProfile")(type="RuntimeDefault")
    )


def worker_env(settings: Settings) -> dict[str, str]:
    """The GPU workers' environment: NCCL/libfabric defaults, then `workload.worker_env`."""
    env = {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        # One log per process beside Ray's logs: the transport check and post-mortems read them.
        # Directly in the mounted /tmp/ray: NCCL does not create folders, and with a missing one it
        # logs to stdout, where the transport gate cannot find the log.
        "NCCL_DEBUG_FILE": f"{RAY_TMP}/nccl.%h.%p.log",
        "NCCL_SOCKET_IFNAME": "eth0",
    }
    if settings.gpu_nodes.efa:
        # Without these NCCL may pick TCP sockets and still "succeed", at a fraction of the speed.
        env |= {"FI_PROVIDER": "efa", "NCCL_NET_PLUGIN": "ofi"}
    env |= settings.workload.worker_env
    env["RAYTRAIN_EXPECT_TRANSPORT"] = settings.job.transport(settings.gpu_nodes.efa).value
    return env


def _head_group(types: SpecTypes, settings: Settings, service_account_name: str) -> Any:
    w = settings.workload
    t = types.sub("HeadGroupSpecTemplate")
    container = t("SpecContainers")(
        name="ray-head",
        image=w.image_ref,
        image_pull_policy="IfNotPresent",
        ports=[
            t("SpecContainersPorts")(name=name, container_port=port, protocol="TCP")
            for name, port in HEAD_PORTS.items()
        ],
        # The head shares system nodes with no GPU; "void" keeps CUDA from probing for one.
        env=[t("SpecContainersEnv")(name="NVIDIA_VISIBLE_DEVICES", value="void")],
        resources=_resources(t, {"cpu": f"{w.head_cpu_millis}m", "memory": f"{w.head_memory_mib}Mi"}),
        volume_mounts=[t("SpecContainersVolumeMounts")(name="ray-tmp", mount_path=RAY_TMP)],
        security_context=_container_security(t, []),
    )
    spec = t("Spec")(
        containers=[container],
        node_selector=dict(SYSTEM_NODE_SELECTOR),
        service_account_name=service_account_name,
        # Pod Identity mounts its own projected token; the Ray pods never call the Kubernetes API.
        automount_service_account_token=False,
        security_context=_pod_security(t),
        volumes=[_empty_dir(t, "ray-tmp")],
    )
    return types("HeadGroupSpec")(
        # No tasks or GPUs on the head: all training work goes to the GPU workers.
        ray_start_params={"num-cpus": "0", "num-gpus": "0"},
        service_type="ClusterIP",  # reachable inside the cluster only; port-forward for people
        template=t("")(metadata=t("Metadata")(labels=_labels(HEAD)), spec=spec),
    )


def _worker_group(types: SpecTypes, settings: Settings, service_account_name: str) -> Any:
    w, gpu = settings.workload, settings.gpu_nodes.instance
    t = types.sub("WorkerGroupSpecsTemplate")
    cpu_millis, memory_mib = w.worker_cpu_millis(gpu), w.worker_memory_mib(gpu)
    resources: dict[str, str | int] = {
        "cpu": f"{cpu_millis}m",
        "memory": f"{memory_mib}Mi",
        GPU_RESOURCE: gpu.gpus,
    }
    if settings.gpu_nodes.efa:
        # Every EFA interface of the node: without the request the pod gets no EFA device.
        resources[EFA_RESOURCE] = gpu.efa_interfaces
    container = t("SpecContainers")(
        name="ray-worker",
        image=w.image_ref,
        image_pull_policy="IfNotPresent",
        env=[t("SpecContainersEnv")(name=k, value=v) for k, v in worker_env(settings).items()],
        resources=_resources(t, resources),
        volume_mounts=[
            t("SpecContainersVolumeMounts")(name="dshm", mount_path=DEV_SHM),
            t("SpecContainersVolumeMounts")(name="ray-tmp", mount_path=RAY_TMP),
        ],
        # IPC_LOCK: libfabric/EFA registers (pins) memory for RDMA, beyond the default memlock
        # limit. It is the one capability kept, and only on EFA nodes.
        security_context=_container_security(t, ["IPC_LOCK"] if settings.gpu_nodes.efa else []),
    )
    spec = t("Spec")(
        containers=[container],
        node_selector=dict(GPU_NODE_SELECTOR),
        tolerations=[
            t("SpecTolerations")(
                key=GPU_TAINT_KEY, operator="Equal", value=GPU_TAINT_VALUE, effect="NoSchedule"
            )
        ],
        service_account_name=service_account_name,
        automount_service_account_token=False,
        security_context=_pod_security(t),
        volumes=[
            _empty_dir(t, "dshm", memory=True, size_gib=w.shm_size_gib),
            _empty_dir(t, "ray-tmp"),
        ],
    )
    nodes = settings.gpu_nodes.desired_size
    return types("WorkerGroupSpecs")(
        group_name=WORKER_GROUP,
        # A fixed size: one worker pod per GPU node, no autoscaling.
        replicas=nodes,
        min_replicas=nodes,
        max_replicas=nodes,
        # num-gpus from the same number as the GPU request; whole CPUs of the pod for Ray tasks.
        ray_start_params={"num-gpus": str(gpu.gpus), "num-cpus": str(cpu_millis // 1000)},
        template=t("")(metadata=t("Metadata")(labels=_labels(WORKER)), spec=spec),
    )


def ray_cluster_spec(
    settings: Settings,
    *,
    service_account_name: str,
    types: SpecTypes = RAYCLUSTER_TYPES,
) -> Any:
    """The one RayCluster spec: the standing cluster's (RAYCLUSTER_TYPES) or the copy a RayJob
    carries (RAYJOB_CLUSTER_TYPES). Only the standing cluster gets an upgrade strategy: KubeRay
    rejects one on clusters that a RayJob creates."""
    standing = types is RAYCLUSTER_TYPES
    return types("")(
        ray_version=settings.workload.ray_version,
        enable_in_tree_autoscaling=False,
        auth_options=types("AuthOptions")(mode=types("AuthOptionsMode").TOKEN),
        head_group_spec=_head_group(types, settings, service_account_name),
        worker_group_specs=[_worker_group(types, settings, service_account_name)],
        # KubeRay does not roll pods on template changes unless told to: recreate the standing
        # cluster when its spec changes, so it never runs a stale image or environment.
        upgrade_strategy=types("UpgradeStrategy")(type=types("UpgradeStrategyType").RECREATE)
        if standing
        else None,
    )


# --- RayJob ---------------------------------------------------------------------------------------


def training_args(settings: Settings, *, checkpoint_uri: str) -> list[str]:
    """Arguments of `python -m training`, from the job settings."""
    job = settings.job
    args = [
        "--run-name", job.run_name,
        "--storage-path", checkpoint_uri,
        "--num-workers", str(settings.num_workers),
        # The entry point runs on the head: join the cluster it runs in.
        "--address", "auto",
        "--max-failures", str(job.max_failures),
        "--checkpoint-every", str(job.checkpoint_every),
        "--keep-checkpoints", str(job.keep_checkpoints),
        "--model", job.model,
        "--init", job.init.value,
        "--shape", job.shape.value,
        "--data", job.data,
        "--seq-len", str(job.seq_len),
        "--global-batch-size", str(job.global_batch_size),
        "--micro-batch-size", str(job.micro_batch_size),
        "--steps", str(job.steps),
        "--lr", repr(job.lr),
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
    if job.output_dir:
        args += ["--output-dir", job.output_dir]
    return args


def entrypoint(settings: Settings, *, checkpoint_uri: str) -> str:
    return shlex.join(["python", "-m", "training", *training_args(settings, checkpoint_uri=checkpoint_uri)])


def runtime_env_yaml(code_uri: str, pip: list[str]) -> str:
    # JSON is YAML: no quoting rules to get wrong around a token or a URI.
    env: dict[str, Any] = {"working_dir": code_uri}
    if pip:
        env["pip"] = {"packages": pip, "pip_check": False}
    return json.dumps(env, sort_keys=True)


def _job_spec(
    settings: Settings,
    *,
    code_uri: str,
    checkpoint_uri: str,
    service_account_name: str,
) -> rj.RayJobSpec:
    job = settings.job
    own = job.cluster is ClusterMode.OWN
    q = {"cpu": SUBMITTER_CPU, "memory": SUBMITTER_MEMORY}
    submitter = rj.RayJobSpecSubmitterPodTemplate(
        metadata=rj.RayJobSpecSubmitterPodTemplateMetadata(labels=_labels(SUBMITTER)),
        spec=rj.RayJobSpecSubmitterPodTemplateSpec(
            # KubeRay fills in the `ray job submit` command and the head's address and token.
            containers=[
                rj.RayJobSpecSubmitterPodTemplateSpecContainers(
                    name="ray-job-submitter",
                    image=settings.workload.image_ref,
                    image_pull_policy="IfNotPresent",
                    resources=rj.RayJobSpecSubmitterPodTemplateSpecContainersResources(
                        limits={
                            k: rj.RayJobSpecSubmitterPodTemplateSpecContainersResourcesLimits.from_string(v)
                            for k, v in q.items()
                        },
                        requests={
                            k: rj.RayJobSpecSubmitterPodTemplateSpecContainersResourcesRequests.from_string(v)
                            for k, v in q.items()
                        },
                    ),
                    security_context=rj.RayJobSpecSubmitterPodTemplateSpecContainersSecurityContext(
                        allow_privilege_escalation=False,
                        privileged=False,
                        capabilities=rj.RayJobSpecSubmitterPodTemplateSpecContainersSecurityContextCapabilities(
                            drop=["ALL"]
                        ),
                    ),
                )
            ],
            restart_policy="Never",
            node_selector=dict(SYSTEM_NODE_SELECTOR),
            # The submitter needs neither AWS nor the Kubernetes API.
            automount_service_account_token=False,
            security_context=rj.RayJobSpecSubmitterPodTemplateSpecSecurityContext(
                seccomp_profile=rj.RayJobSpecSubmitterPodTemplateSpecSecurityContextSeccompProfile(
                    type="RuntimeDefault"
                )
            ),
        ),
    )
    return rj.RayJobSpec(
        entrypoint=entrypoint(settings, checkpoint_uri=checkpoint_uri),
        runtime_env_yaml=runtime_env_yaml(code_uri, runtime_pip(settings)),
        submission_mode="K8sJobMode",  # a Kubernetes Job runs `ray job submit` and follows it
        submitter_pod_template=submitter,
        # Own cluster: removed when the job ends (TTL after), so idle GPUs are not held.
        # Standing cluster: selected by name and left running; KubeRay allows no TTL then.
        shutdown_after_job_finishes=True if own else None,
        ttl_seconds_after_finished=job.ttl_seconds_after_finished if own else None,
        cluster_selector=None if own else {"ray.io/cluster": STANDING_CLUSTER_NAME},
        ray_cluster_spec=ray_cluster_spec(
            settings, service_account_name=service_account_name, types=RAYJOB_CLUSTER_TYPES
        )
        if own
        else None,
        active_deadline_seconds=job.active_deadline_seconds,
        backoff_limit=job.backoff_limit,
    )


def rayjob_name(settings: Settings, *, code_hash: str, service_account_name: str = SERVICE_ACCOUNT) -> str:
    """`rj-<run name>-<hash>`: the hash covers the whole job spec (its cluster copy, or the standing
    cluster's spec) and the code, so a changed job or changed code gets a new RayJob (KubeRay
    ignores spec updates of an existing one). The URIs enter as placeholders: at synth time they
    are tokens whose text is not stable; `code_hash` stands for the code."""
    spec = _job_spec(
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
    slug = re.sub(r"[^a-z0-9-]+", "-", settings.job.run_name).strip("-")[:30].strip("-")
    # A DNS-1035 label of at most 47 characters: KubeRay appends 6 to name the job's cluster.
    return f"rj-{slug}-{digest}" if slug else f"rj-{digest}"


# --- Network policies -----------------------------------------------------------------------------


def _select(*components: str) -> kube.LabelSelector:
    return kube.LabelSelector(
        match_labels={PART_OF_LABEL: PART_OF},
        match_expressions=[
            kube.LabelSelectorRequirement(key=COMPONENT, operator="In", values=list(components))
        ],
    )


def _tcp(*ports: int) -> list[kube.NetworkPolicyPort]:
    return [kube.NetworkPolicyPort(port=kube.IntOrString.from_number(p), protocol="TCP") for p in ports]


def _network_policies(chart: cdk8s.Chart, settings: Settings) -> None:
    ns = settings.workload.namespace
    ray_nodes = _select(HEAD, WORKER)

    def policy(name: str, spec: kube.NetworkPolicySpec) -> None:
        kube.KubeNetworkPolicy(chart, name, metadata=kube.ObjectMeta(name=name, namespace=ns), spec=spec)

    # Everything in the namespace starts closed, both ways; the policies below add what is needed.
    policy(
        "default-deny",
        kube.NetworkPolicySpec(pod_selector=kube.LabelSelector(), policy_types=["Ingress", "Egress"]),
    )
    policy(
        "allow-dns",
        kube.NetworkPolicySpec(
            pod_selector=kube.LabelSelector(),
            policy_types=["Egress"],
            egress=[
                kube.NetworkPolicyEgressRule(
                    to=[
                        kube.NetworkPolicyPeer(
                            namespace_selector=kube.LabelSelector(
                                match_labels={"kubernetes.io/metadata.name": "kube-system"}
                            ),
                            pod_selector=kube.LabelSelector(match_labels={"k8s-app": "kube-dns"}),
                        )
                    ],
                    ports=[
                        kube.NetworkPolicyPort(port=kube.IntOrString.from_number(53), protocol=proto)
                        for proto in ("UDP", "TCP")
                    ],
                )
            ],
        ),
    )
    # Ray pods talk to each other on any port: GCS, raylets, object manager, worker ports and
    # NCCL's TCP bootstrap all use ranges. (EFA traffic bypasses the IP stack altogether.)
    # Out of the cluster they get HTTPS only, to public addresses: S3 (code, checkpoints, data),
    # Hugging Face, pip; through the NAT gateway or the S3 gateway endpoint. Private ranges are
    # excluded so a pod cannot reach node ports, databases or peered networks over 443; image
    # pulls are done by the kubelet, not the pod, and need no rule here.
    excluded = _private_ranges(settings.vpc.cidr)
    policy(
        "ray-nodes",
        kube.NetworkPolicySpec(
            pod_selector=ray_nodes,
            policy_types=["Ingress", "Egress"],
            ingress=[kube.NetworkPolicyIngressRule(from_=[kube.NetworkPolicyPeer(pod_selector=ray_nodes)])],
            egress=[
                kube.NetworkPolicyEgressRule(to=[kube.NetworkPolicyPeer(pod_selector=ray_nodes)]),
                kube.NetworkPolicyEgressRule(
                    to=[kube.NetworkPolicyPeer(ip_block=kube.IpBlock(cidr="0.0.0.0/0", except_=excluded))],
                    ports=_tcp(443),
                ),
                # AWS credentials for the service account (EKS Pod Identity agent on the node).
                kube.NetworkPolicyEgressRule(
                    to=[kube.NetworkPolicyPeer(ip_block=kube.IpBlock(cidr=POD_IDENTITY_AGENT_CIDR))],
                    ports=_tcp(80),
                ),
            ],
        ),
    )
    # Of the head's ports, only the job server is reachable from outside the Ray pods: by the
    # job submitter and the KubeRay operator (job status). GCS and the client port stay internal.
    policy(
        "ray-head-job-server",
        kube.NetworkPolicySpec(
            pod_selector=_select(HEAD),
            policy_types=["Ingress"],
            ingress=[
                kube.NetworkPolicyIngressRule(
                    from_=[
                        kube.NetworkPolicyPeer(pod_selector=_select(SUBMITTER)),
                        kube.NetworkPolicyPeer(
                            namespace_selector=kube.LabelSelector(
                                match_labels={"kubernetes.io/metadata.name": KUBERAY_OPERATOR_NAMESPACE}
                            )
                        ),
                    ],
                    ports=_tcp(DASHBOARD_PORT),
                )
            ],
        ),
    )
    policy(
        "job-submitter",
        kube.NetworkPolicySpec(
            pod_selector=_select(SUBMITTER),
            policy_types=["Egress"],
            egress=[
                kube.NetworkPolicyEgressRule(
                    to=[kube.NetworkPolicyPeer(pod_selector=_select(HEAD))], ports=_tcp(DASHBOARD_PORT)
                )
            ],
        ),
    )


def _private_ranges(vpc_cidr: str) -> list[str]:
    """The HTTPS rule's exceptions: the private ranges, plus the VPC's CIDR when it lies outside
    them (a VPC may use e.g. 100.64.0.0/10)."""
    vpc = ipaddress.ip_network(vpc_cidr)
    ranges = [ipaddress.ip_network(r) for r in PRIVATE_RANGES]
    if not any(vpc.subnet_of(r) for r in ranges):  # type: ignore[arg-type]
        ranges.append(vpc)
    return [str(r) for r in ranges]


# --- Chart ----------------------------------------------------------------------------------------


def build_workload_chart(
    scope: cdk8s.App,
    settings: Settings,
    *,
    code_uri: str,
    code_hash: str,
    checkpoint_uri: str,
    service_account_name: str = SERVICE_ACCOUNT,
    include_namespace: bool = True,
) -> cdk8s.Chart:
    """The workload chart for one environment.

    `include_namespace=False` leaves the Namespace out, for a caller that creates it elsewhere
    (e.g. before the KubeRay operator, whose namespaced RBAC needs it first).
    """
    ns = settings.workload.namespace
    chart = cdk8s.Chart(scope, "workload", labels={PART_OF_LABEL: PART_OF})
    if include_namespace:
        # No Pod Security Admission label: the EFA workers need IPC_LOCK, which the baseline
        # level forbids; the pods' own security contexts carry the restrictions instead.
        kplus.Namespace(chart, "namespace", metadata=cdk8s.ApiObjectMetadata(name=ns))
    kplus.ServiceAccount(
        chart,
        "service-account",
        metadata=cdk8s.ApiObjectMetadata(name=service_account_name, namespace=ns),
        automount_token=False,
    )
    if settings.job.cluster is ClusterMode.STANDING:
        rc.RayCluster(
            chart,
            "ray-cluster",
            metadata=cdk8s.ApiObjectMetadata(name=STANDING_CLUSTER_NAME, namespace=ns),
            spec=ray_cluster_spec(settings, service_account_name=service_account_name),
        )
    rj.RayJob(
        chart,
        "ray-job",
        metadata=cdk8s.ApiObjectMetadata(
            name=rayjob_name(settings, code_hash=code_hash, service_account_name=service_account_name),
            namespace=ns,
            labels={"ray-train/run-name": settings.job.run_name},
        ),
        spec=_job_spec(
            settings,
            code_uri=code_uri,
            checkpoint_uri=checkpoint_uri,
            service_account_name=service_account_name,
        ),
    )
    _network_policies(chart, settings)
    return chart


def render_manifests(
    settings: Settings,
    out_dir: Path,
    *,
    code_uri: str,
    code_hash: str,
    checkpoint_uri: str,
    service_account_name: str = SERVICE_ACCOUNT,
    include_namespace: bool = True,
) -> list[Path]:
    """Write the chart as YAML for review: one file per object, `<Kind>.<name>.k8s.yaml`, under
    `out_dir` (stale `*.k8s.yaml` files there are removed first). Returns the files, sorted."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.k8s.yaml"):
        old.unlink()
    app = cdk8s.App(outdir=str(out_dir), yaml_output_type=cdk8s.YamlOutputType.FILE_PER_RESOURCE)
    build_workload_chart(
        app,
        settings,
        code_uri=code_uri,
        code_hash=code_hash,
        checkpoint_uri=checkpoint_uri,
        service_account_name=service_account_name,
        include_namespace=include_namespace,
    )
    app.synth()
    return sorted(out_dir.glob("*.k8s.yaml"))

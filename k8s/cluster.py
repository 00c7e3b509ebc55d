"""The one RayCluster spec: head group on the system nodes, one GPU worker group.

Every number comes from `Settings` and the instance catalogue. The spec is built by one function
(`ray_cluster_spec`) and used either by the standing RayCluster or, as a copy, by the RayJob's
`rayClusterSpec` (`job.cluster` in the settings says which; see `ClusterMode`).
"""

from __future__ import annotations

from typing import Any

from config.checkpointing import stop_grace_seconds
from config.names import (
    EFA_RESOURCE,
    GPU_NODE_LABELS,
    GPU_RESOURCE,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    NODE_ROLE_LABEL,
    SYSTEM_NODE_LABELS,
)
from config.settings import Settings
from k8s.imports.raycluster.io import ray as rc
from k8s.imports.rayjob.io import ray as rj
from k8s.pods import (
    HEAD,
    WORKER,
    SpecTypes,
    aws_region_env,
    container_security,
    empty_dir,
    labels,
    pod_identity_check,
    pod_security,
    resources,
)
from training.common.hub_token import HF_TOKEN_SECRET_ENV
from training.common.stop_notice import PRESTOP_MARGIN_S, head_prestop_script, prestop_script
from training.network.probe import GATE_LOG_ENV
from training.sizing.checkpoint_time import NOTICE_POLL_S

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

WORKER_GROUP = "gpu"

RAYCLUSTER_TYPES = SpecTypes(rc, "RayClusterSpec")
RAYJOB_CLUSTER_TYPES = SpecTypes(rj, "RayJobSpecRayClusterSpec")


def worker_env(settings: Settings) -> dict[str, str]:
    """The GPU workers' environment: NCCL/libfabric defaults, then `workload.worker_env`."""
    env = {
        # INFO lines of INIT and NET, which the transport gate reads (to the file below).
        **GATE_LOG_ENV,
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
    env |= notice_env(settings)
    env["RAYTRAIN_EXPECT_TRANSPORT"] = settings.job.transport(settings.gpu_nodes.efa).value
    env |= aws_region_env(settings.region)
    return env | token_env(settings)


def notice_env(settings: Settings) -> dict[str, str]:
    """How a stop notice reaches the training (training/checkpoint/notice.py), on every Ray pod: Ray
    Train's preemption watcher polls the drained nodes this often (ray/train/v2/_internal/constants.py,
    default 5 s), and `ray start --block` drains its node on SIGTERM for this long before it kills
    the node's processes (ray/_private/ray_constants.py, default 30 s): the pod's grace period less the
    preStop hook's margin."""
    return {
        "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": str(NOTICE_POLL_S),
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(stop_grace_seconds(settings) - PRESTOP_MARGIN_S),
    }


def head_env(settings: Settings) -> dict[str, str]:
    """The head's environment: no GPU, and the region for the job driver's AWS calls."""
    # The head shares system nodes with no GPU; "void" keeps CUDA from probing for one.
    return {
        "NVIDIA_VISIBLE_DEVICES": "void",
        **aws_region_env(settings.region),
        **notice_env(settings),
        **token_env(settings),
    }


def token_env(settings: Settings) -> dict[str, str]:
    """Where a gated model's token is (job.hf_token_secret's ARN, not the token): head and workers
    both, as the head's driver prepares data and exports (training/common/hub_token.py)."""
    arn = settings.job.hf_token_secret
    return {HF_TOKEN_SECRET_ENV: arn} if arn else {}


def _head_group(types: SpecTypes, settings: Settings, service_account_name: str) -> Any:
    w = settings.workload
    t = types.sub("HeadGroupSpecTemplate")
    container = t("SpecContainers")(
        name="ray-head",
        image=settings.ray_image_ref,
        image_pull_policy="IfNotPresent",
        ports=[
            t("SpecContainersPorts")(name=name, container_port=port, protocol="TCP")
            for name, port in HEAD_PORTS.items()
        ],
        env=[t("SpecContainersEnv")(name=k, value=v) for k, v in head_env(settings).items()],
        resources=resources(t, {"cpu": f"{w.head_cpu_millis}m", "memory": f"{w.head_memory_mib}Mi"}),
        volume_mounts=[
            t("SpecContainersVolumeMounts")(name="dshm", mount_path=DEV_SHM),
            t("SpecContainersVolumeMounts")(name="ray-tmp", mount_path=RAY_TMP),
        ],
        security_context=container_security(t, []),
        # The driver and Ray Train's controller run here: told to stop (the RayCluster deleted by a
        # Kueue preemption or `raytrain job stop`, its system node drained), drain the run's GPU
        # workers and outlive their checkpoint on notice (training/checkpoint/notice.py).
        lifecycle=t("SpecContainersLifecycle")(
            pre_stop=t("SpecContainersLifecyclePreStop")(
                exec=t("SpecContainersLifecyclePreStopExec")(
                    command=["/bin/bash", "-c", head_prestop_script(stop_grace_seconds(settings))]
                )
            )
        ),
    )
    spec = t("Spec")(
        init_containers=[pod_identity_check(t, settings.ray_image_ref)],
        containers=[container],
        # A failed pod is replaced by KubeRay, not restarted in place (k8s/pods.py, pod_identity_check).
        restart_policy="Never",
        # The workers' grace period: the head waits within it for their checkpoint on notice.
        termination_grace_period_seconds=stop_grace_seconds(settings),
        node_selector=dict(SYSTEM_NODE_SELECTOR),
        service_account_name=service_account_name,
        # Pod Identity mounts its own projected token; the Ray pods never call the Kubernetes API.
        automount_service_account_token=False,
        security_context=pod_security(t),
        # Ray's object store lives in /dev/shm (the pod default is 64 MiB).
        volumes=[empty_dir(t, "dshm", memory=True, size_gib=w.head_shm_size_gib), empty_dir(t, "ray-tmp")],
    )
    return types("HeadGroupSpec")(
        # No tasks or GPUs on the head: all training work goes to the GPU workers.
        ray_start_params={"num-cpus": "0", "num-gpus": "0"},
        service_type="ClusterIP",  # reachable inside the cluster only; port-forward for people
        template=t("")(metadata=t("Metadata")(labels=labels(HEAD)), spec=spec),
    )


def _worker_group(types: SpecTypes, settings: Settings, service_account_name: str) -> Any:
    w, gpu = settings.workload, settings.gpu_nodes.instance
    t = types.sub("WorkerGroupSpecsTemplate")
    cpu_millis, memory_mib = w.worker_cpu_millis(gpu), w.worker_memory_mib(gpu)
    amounts: dict[str, str | int] = {
        "cpu": f"{cpu_millis}m",
        "memory": f"{memory_mib}Mi",
        GPU_RESOURCE: gpu.gpus,
    }
    if settings.gpu_nodes.efa:
        # Every EFA interface of the node: without the request the pod gets no EFA device.
        amounts[EFA_RESOURCE] = gpu.efa_interfaces
    container = t("SpecContainers")(
        name="ray-worker",
        image=settings.ray_image_ref,
        image_pull_policy="IfNotPresent",
        env=[t("SpecContainersEnv")(name=k, value=v) for k, v in worker_env(settings).items()],
        resources=resources(t, amounts),
        volume_mounts=[
            t("SpecContainersVolumeMounts")(name="dshm", mount_path=DEV_SHM),
            t("SpecContainersVolumeMounts")(name="ray-tmp", mount_path=RAY_TMP),
        ],
        # IPC_LOCK: libfabric/EFA registers (pins) memory for RDMA, beyond the default memlock
        # limit. It is the one capability kept, and only on EFA nodes.
        security_context=container_security(t, ["IPC_LOCK"] if settings.gpu_nodes.efa else []),
        # Told to stop (drain, eviction, Spot interruption, Kueue preemption, job stop): drain this
        # Ray node and wait for the checkpoint on notice before the SIGTERM (training/checkpoint/notice.py).
        lifecycle=t("SpecContainersLifecycle")(
            pre_stop=t("SpecContainersLifecyclePreStop")(
                exec=t("SpecContainersLifecyclePreStopExec")(
                    command=["/bin/bash", "-c", prestop_script(stop_grace_seconds(settings))]
                )
            )
        ),
    )
    spec = t("Spec")(
        init_containers=[pod_identity_check(t, settings.ray_image_ref)],
        containers=[container],
        restart_policy="Never",
        # Sized from the job's checkpoint (config/checkpointing.py): the preStop hook and the
        # checkpoint on notice run within it; the kubelet's SIGKILL ends it.
        termination_grace_period_seconds=stop_grace_seconds(settings),
        node_selector=dict(GPU_NODE_SELECTOR),
        tolerations=[
            t("SpecTolerations")(
                key=GPU_TAINT_KEY, operator="Equal", value=GPU_TAINT_VALUE, effect="NoSchedule"
            )
        ],
        service_account_name=service_account_name,
        automount_service_account_token=False,
        security_context=pod_security(t),
        volumes=[
            empty_dir(t, "dshm", memory=True, size_gib=w.shm_size_gib),
            empty_dir(t, "ray-tmp"),
        ],
    )
    nodes = settings.job.nodes
    return types("WorkerGroupSpecs")(
        group_name=WORKER_GROUP,
        # A fixed size: one worker pod per GPU node, no Ray autoscaling (the Cluster Autoscaler
        # starts the nodes for pending pods; docs/gpu-fleet.md, "GPU nodes only while a job runs").
        replicas=nodes,
        min_replicas=nodes,
        max_replicas=nodes,
        # num-gpus from the same number as the GPU request; whole CPUs of the pod for Ray tasks.
        ray_start_params={"num-gpus": str(gpu.gpus), "num-cpus": str(cpu_millis // 1000)},
        # Kueue's topology-aware placement, where the settings ask for it (config/settings/queueing.py).
        template=t("")(
            metadata=t("Metadata")(
                labels=labels(WORKER),
                annotations=settings.topology.worker_annotations(settings.gpu_nodes.instance_type) or None,
            ),
            spec=spec,
        ),
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

"""The KubeRay operator, the RayClusters and the RayJobs of the Ray namespace."""

from __future__ import annotations

from typing import Any

from config.names import (
    EFA_RESOURCE,
    GPU_RESOURCE,
    KUBERAY_NAMESPACE,
    KUBERAY_RELEASE,
    STANDING_CLUSTER_NAME,
)
from config.settings import ClusterMode, Settings
from raytrain.verify.api import Api
from raytrain.verify.checks import FAIL, INFO, PASS, Check, _condition, _name, _quantity

# The operator's Deployment is named after its Helm release (the chart's fullnameOverride is unset).
KUBERAY_OPERATOR_DEPLOYMENT = KUBERAY_RELEASE


def check_operator(api: Api, checks: list[Check]) -> None:
    subject = f"{KUBERAY_NAMESPACE}/{KUBERAY_OPERATOR_DEPLOYMENT}"
    dep = api.deployment(KUBERAY_NAMESPACE, KUBERAY_OPERATOR_DEPLOYMENT)
    if dep is None:
        checks.append(Check("KubeRay operator", subject, FAIL, "Deployment not found"))
        return
    status = dep.get("status") or {}
    available = _condition(dep, "Available") == "True" and (status.get("availableReplicas") or 0) >= 1
    pod_spec = ((dep.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers: list[dict[str, Any]] = pod_spec.get("containers") or []
    detail = f"available {status.get('availableReplicas') or 0}/{status.get('replicas') or 0}"
    if containers and containers[0].get("image"):
        detail += f"; {containers[0]['image']}"
    checks.append(Check("KubeRay operator", subject, PASS if available else FAIL, detail))


def _worker_groups(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    return list(((cluster.get("spec") or {}).get("workerGroupSpecs")) or [])


def _container_limits(group: dict[str, Any]) -> dict[str, Any]:
    containers = (((group.get("template") or {}).get("spec") or {}).get("containers")) or [{}]
    resources = containers[0].get("resources") or {}
    return resources.get("limits") or resources.get("requests") or {}


def check_ray(api: Api, settings: Settings, checks: list[Check]) -> None:
    ns = settings.workload.namespace
    clusters = api.ray_objects(ns, "rayclusters")
    jobs = api.ray_objects(ns, "rayjobs")
    if clusters is None:
        checks.append(Check("RayCluster", f"{ns}/*", FAIL, "RayCluster CRD (ray.io/v1) not installed"))
        return
    standing = settings.job.cluster is ClusterMode.STANDING
    names = {_name(c) for c in clusters}
    if standing and STANDING_CLUSTER_NAME not in names:
        checks.append(
            Check(
                "RayCluster",
                f"{ns}/{STANDING_CLUSTER_NAME}",
                FAIL,
                f"not found (job.cluster is standing); present: {', '.join(sorted(names)) or 'none'}",
            )
        )
    if not clusters and not standing:
        checks.append(
            Check(
                "RayCluster",
                f"{ns}/*",
                INFO,
                "none running: job.cluster is 'own', so each RayJob brings its cluster",
            )
        )
    want_gpus = settings.num_workers
    for cluster in sorted(clusters, key=_name):
        checks.append(_check_cluster(cluster, ns, settings, want_gpus))
    by_name = {_name(c): c for c in clusters}
    for job in sorted(jobs or [], key=_name):
        status = job.get("status") or {}
        deploy, state = status.get("jobDeploymentStatus"), status.get("jobStatus")
        failed = deploy == "Failed" or state == "FAILED"
        detail = f"deployment {deploy or '-'}, job {state or '-'}"
        if status.get("message"):
            detail += f": {status['message']}"
        held = by_name.get(status.get("rayClusterName") or "")
        if state == "STOPPED" and not standing and held is not None and not workers_released(held):
            # Stopped from Ray (`ray job stop`, the dashboard): KubeRay 1.7's deletion rules can name
            # only SUCCEEDED, FAILED and deployment Failed (RayJob CRD), so nothing frees this
            # job's cluster: its GPU nodes stay until the RayJob is deleted.
            failed = True
            detail += (
                f"; stopped from Ray, its cluster {_name(held)} still holds its GPU workers (no "
                f"deletion rule fires for STOPPED): kubectl -n {ns} delete rayjob {_name(job)}"
            )
        checks.append(Check("RayJob", f"{ns}/{_name(job)}", FAIL if failed else INFO, detail))
    if jobs is not None and not jobs:
        checks.append(Check("RayJob", f"{ns}/*", INFO, "none"))


def workers_released(cluster: dict[str, Any]) -> bool:
    """Every worker group is suspended: the job's deletion rule has deleted the GPU workers and
    the head stays for inspection (k8s/job.py). KubeRay sets `suspend` on worker groups only for a
    RayJob's DeleteWorkers ("not a user-facing API and is only used by RayJob DeletionStrategy",
    RayCluster CRD, v1.7.0)."""
    groups = _worker_groups(cluster)
    return bool(groups) and all(g.get("suspend") is True for g in groups)


def _check_cluster(cluster: dict[str, Any], ns: str, settings: Settings, want_gpus: int) -> Check:
    gpu = settings.gpu_nodes
    status = cluster.get("status") or {}
    groups = _worker_groups(cluster)
    if workers_released(cluster):
        # Only a RayJob with deletion rules leaves its head behind: one made before the namespace's
        # jobs were queued (or by hand). Queued jobs delete their whole cluster when they end
        # (shutdownAfterJobFinishes, TTL 0: k8s/job.py), whatever job.ttl_seconds_after_finished says.
        head = "head pod ready" if _condition(cluster, "HeadPodReady") == "True" else "head pod not ready"
        owner = next(
            (o.get("name") for o in (cluster.get("metadata") or {}).get("ownerReferences") or []
             if o.get("kind") == "RayJob"),
            None,
        )  # fmt: skip
        gone = (
            f"kubectl -n {ns} delete rayjob {owner}"
            if owner
            else f"kubectl -n {ns} delete raycluster {_name(cluster)}"
        )
        return Check(
            "RayCluster",
            f"{ns}/{_name(cluster)}",
            INFO,
            f"its job has ended: GPU workers released, {head}; the head stays until its RayJob's "
            f"own deletion rule fires (a job from before the queues: today's jobs delete their whole "
            f"cluster when they end), or: {gone}",
        )
    replicas = sum(int(g.get("replicas") or 0) for g in groups)
    ready_workers = int(status.get("readyWorkerReplicas") or 0)
    problems: list[str] = []
    state = status.get("state")
    provisioned = _condition(cluster, "RayClusterProvisioned")
    # KubeRay >= 1.2 reports conditions; `state` is kept for older operators.
    if not (provisioned == "True" or (provisioned is None and state == "ready")):
        problems.append(f"not ready (state {state or '-'}, RayClusterProvisioned {provisioned or '-'})")
    if _condition(cluster, "HeadPodReady") == "False":
        problems.append("head pod not ready")
    if ready_workers < replicas:
        problems.append(f"{ready_workers}/{replicas} workers ready")
    spec_gpus = 0
    for g in groups:
        limits = _container_limits(g)
        per_pod = _quantity(limits.get(GPU_RESOURCE))
        spec_gpus += per_pod * int(g.get("replicas") or 0)
        efa = _quantity(limits.get(EFA_RESOURCE))
        if gpu.efa and per_pod and efa < 1:
            problems.append(
                f"worker group {g.get('groupName')!r} requests no {EFA_RESOURCE}: its pods get no "
                "EFA device and NCCL falls back to TCP sockets"
            )
    if spec_gpus != want_gpus:
        problems.append(
            f"workers request {spec_gpus} GPUs, the job has {want_gpus} "
            f"(job.nodes {settings.job.nodes} × {gpu.instance.gpus})"
        )
    detail = "; ".join(problems) or f"ready; {ready_workers}/{replicas} workers, {spec_gpus} GPUs"
    return Check("RayCluster", f"{ns}/{_name(cluster)}", FAIL if problems else PASS, detail)

"""Finding a job of the environment, its RayCluster and its pods (names KubeRay gives them)."""

from __future__ import annotations

from typing import Any

from config.names import STANDING_CLUSTER_NAME
from config.settings import ClusterMode, Settings
from raytrain.job.api import JobApi
from raytrain.job.common import CLUSTER_LABEL, JOB_NAME_LABEL, JOBS_SELECTOR, NODE_TYPE_LABEL, JobError


def _meta(obj: dict[str, Any], key: str, default: Any = None) -> Any:
    return (obj.get("metadata") or {}).get(key, default)


def _created(obj: dict[str, Any]) -> str:
    return str(_meta(obj, "creationTimestamp", "") or "")


_FINISHED = ("Complete", "Failed", "ValidationFailed")


def finished(job: dict[str, Any]) -> bool:
    """KubeRay's deployment status says the job ended (its Ray job may have been stopped)."""
    return (job.get("status") or {}).get("jobDeploymentStatus") in _FINISHED


def gpu_nodes_held(job: dict[str, Any]) -> int:
    """GPU worker pods (one per GPU node) the job's own cluster asks for; 0 on a standing cluster."""
    cluster = (job.get("spec") or {}).get("rayClusterSpec") or {}
    return sum(int(g.get("replicas") or 0) for g in cluster.get("workerGroupSpecs") or [])


def select_job(jobs: list[dict[str, Any]], name: str | None, namespace: str) -> dict[str, Any] | None:
    """`--job NAME`, else the newest unfinished RayJob (a data-preparation job that ended after the
    training job started is not the one to watch), else the newest; None when there is none."""
    if name:
        for job in jobs:
            if _meta(job, "name") == name:
                return job
        present = ", ".join(sorted(str(_meta(j, "name")) for j in jobs)) or "none"
        raise JobError(f"no RayJob {name!r} in namespace {namespace!r}; present: {present}")
    running = [j for j in jobs if not finished(j)]
    pool = running or jobs
    return max(pool, key=lambda j: (_created(j), str(_meta(j, "name")))) if pool else None


def cluster_name(job: dict[str, Any] | None, settings: Settings) -> str | None:
    """The RayCluster the job runs on: the one KubeRay made for it, or the standing one it selects."""
    if job is not None:
        status_name = (job.get("status") or {}).get("rayClusterName")
        if status_name:
            return str(status_name)
        selector = (job.get("spec") or {}).get("clusterSelector") or {}
        if selector.get(CLUSTER_LABEL):
            return str(selector[CLUSTER_LABEL])
    if settings.job.cluster is ClusterMode.STANDING:
        return STANDING_CLUSTER_NAME
    return None


def kuberay_check_name(name: str) -> str:
    """KubeRay's utils.CheckName (v1.7.0): what it names per-cluster objects such as the auth Secret."""
    max_length = 50
    if len(name) > max_length:
        name = name[len(name) - max_length :]
    if name[0].isdigit() or not name[0].isalnum():
        name = "r" + name[1:]
    return name


def _pod_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )


def _restarts(pod: dict[str, Any]) -> int:
    return sum(
        int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or []
    )


def _role(pod: dict[str, Any]) -> str:
    labels = _meta(pod, "labels") or {}
    if JOB_NAME_LABEL in labels:
        return "submitter"
    return str(labels.get(NODE_TYPE_LABEL, "?"))


def _by_name(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(pods, key=lambda p: str(_meta(p, "name")))


class Target:
    """One job's objects, looked up once."""

    def __init__(self, api: JobApi, settings: Settings, job_name: str | None) -> None:
        self.api, self.settings = api, settings
        self.namespace = settings.workload.namespace
        self.jobs = api.rayjobs(self.namespace, JOBS_SELECTOR)
        self.job = select_job(self.jobs, job_name, self.namespace)
        self.cluster_name = cluster_name(self.job, settings)
        self.cluster = api.raycluster(self.namespace, self.cluster_name) if self.cluster_name else None

    def cluster_pods(self, node_type: str) -> list[dict[str, Any]]:
        if not self.cluster_name:
            return []
        selector = f"{CLUSTER_LABEL}={self.cluster_name},{NODE_TYPE_LABEL}={node_type}"
        return _by_name(self.api.pods(self.namespace, selector))

    def submitter_pods(self) -> list[dict[str, Any]]:
        if self.job is None:
            return []
        return _by_name(self.api.pods(self.namespace, f"{JOB_NAME_LABEL}={_meta(self.job, 'name')}"))

    def describe(self) -> str:
        if self.job is not None:
            return f"RayJob {self.namespace}/{_meta(self.job, 'name')}"
        return f"namespace {self.namespace!r}"

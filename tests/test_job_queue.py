"""`raytrain job queue`, and `raytrain job status` of queued and ended jobs, against the fake Kubernetes API
server of tests/test_job.py (its helpers)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from config.loader import load_settings
from config.settings import Settings
from tests.test_job import CLUSTER, ENV, TEAM, FakeApi, cluster_routes, run


@pytest.fixture
def api_server(serve_kube_api: Callable[[FakeApi], FakeApi]) -> FakeApi:
    return serve_kube_api(FakeApi())


@pytest.fixture
def settings() -> Settings:
    return load_settings(ENV).for_team(TEAM)


def _workload(
    job: str, priority: str, value: int, created: str, conditions: list[dict[str, Any]]
) -> dict[str, Any]:
    """A Kueue v1beta2 Workload of a RayJob, as Kueue writes it (owner: the RayJob)."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": f"rayjob-{job}-abcde",
            "creationTimestamp": created,
            "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": job, "uid": "u"}],
        },
        "spec": {
            "priority": value,
            "priorityClassRef": {
                "group": "kueue.x-k8s.io",
                "kind": "WorkloadPriorityClass",
                "name": priority,
            },
        },
        "status": {"conditions": conditions},
    }


PENDING_WHY = (
    "couldn't assign flavors to pod set workers: insufficient unused quota for nvidia.com/gpu in "
    "flavor g6-12xlarge, 4 more needed"
)


def queue_routes(settings: Settings) -> dict[str, Any]:
    """The team's LocalQueue (one node's GPUs in use) and four Workloads: one admitted, three
    pending of which the later high-priority one is first in Kueue's order."""
    team = settings.active_team
    ns = team.namespace
    pending = [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": PENDING_WHY}]
    admitted = [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}]
    local_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": team.queue, "namespace": ns},
        "spec": {"clusterQueue": team.queue},
        "status": {
            "pendingWorkloads": 3,
            "admittedWorkloads": 1,
            "flavorsUsage": [
                {"name": "g6-12xlarge", "resources": [{"name": "nvidia.com/gpu", "total": "4"}]}
            ],
            "flavorsReservation": [
                {"name": "g6-12xlarge", "resources": [{"name": "nvidia.com/gpu", "total": "4"}]}
            ],
        },
    }
    workloads = [
        _workload("running", "normal", 1000, "2026-12-01T08:00:00Z", admitted),
        _workload("old-low", "low", 100, "2026-12-01T08:01:00Z", pending),
        _workload("normal-first", "normal", 1000, "2026-12-01T08:02:00Z", pending),
        _workload("late-high", "high", 10000, "2026-12-01T09:00:00Z", pending),
    ]
    base = f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}"
    return {
        f"{base}/localqueues/{team.queue}": local_queue,
        f"{base}/workloads": {
            "kind": "WorkloadList",
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "items": workloads,
        },
    }


def test_queue_shows_quota_use_and_each_pending_jobs_position_and_reason(
    tmp_path: Path, api_server: FakeApi, settings: Settings
) -> None:
    api_server.routes = queue_routes(settings)
    rc, text = run(tmp_path, api_server, "queue")
    assert rc == 0, text
    flat = " ".join(text.split())
    team = settings.active_team
    assert (
        f"team {team.name}: queue {team.queue} in namespace {team.namespace}; quota {team.gpu_nodes}" in flat
    )
    assert "in use: 4 GPUs (1 node(s))" in flat and "1 admitted, 3 pending" in flat
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]
    # Kueue's order: priority first (late-high), then the earlier of two normals, low last.
    assert [r[:4] for r in rows] == [
        ["", "running", "normal", "admitted"],
        ["1", "late-high", "high", "pending"],
        ["2", "normal-first", "normal", "pending"],
        ["3", "old-low", "low", "pending"],
    ]
    assert "insufficient unused quota for nvidia.com/gpu" in rows[1][5]


def test_queue_without_kueue_says_so(tmp_path: Path, api_server: FakeApi, settings: Settings) -> None:
    api_server.routes = {}
    rc, text = run(tmp_path, api_server, "queue")
    assert rc == 2 and "is Kueue installed" in text, text


def test_status_says_how_many_jobs_are_ahead_or_admitted(settings: Settings) -> None:
    from raytrain.job.queue import entry, queue_state

    workloads = queue_routes(settings)[
        f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{settings.workload.namespace}/workloads"
    ]
    entries = [entry(w) for w in workloads["items"]]
    assert queue_state(entries, "running") == "queue: admitted"
    assert queue_state(
        entries,
        "late-high",
    ).startswith("queued: 0 jobs ahead in its team's queue; Kueue: couldn't")
    assert queue_state(entries, "old-low").startswith("queued: 2 jobs ahead")
    assert queue_state(entries, "normal-first").startswith("queued: 1 job ahead")
    assert queue_state(entries, "not-queued") is None


def test_status_of_an_ended_job_shows_its_workers_released(
    tmp_path: Path, api_server: FakeApi, settings: Settings
) -> None:
    routes = cluster_routes(settings)
    ns = settings.workload.namespace
    newest = routes[f"/apis/ray.io/v1/namespaces/{ns}/rayjobs"]["items"][1]
    newest["status"] |= {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
    cluster = routes[f"/apis/ray.io/v1/namespaces/{ns}/rayclusters/{CLUSTER}"]
    # The job's DeleteWorkers rule: KubeRay suspends the worker group and deletes its pods.
    cluster["spec"]["workerGroupSpecs"] = [{"groupName": "gpu", "replicas": 2, "suspend": True}]
    cluster["status"] |= {"readyWorkerReplicas": 0, "desiredWorkerReplicas": 0}
    pods = routes[f"/api/v1/namespaces/{ns}/pods"]["items"]
    routes[f"/api/v1/namespaces/{ns}/pods"]["items"] = [p for p in pods if "-gpu-worker-" not in str(p)]
    api_server.routes = routes
    rc, text = run(tmp_path, api_server, "status")
    assert rc == 0, text
    assert "released (job ended; head kept for inspection)" in text
    assert "-head-" in text and "-gpu-worker-" not in text

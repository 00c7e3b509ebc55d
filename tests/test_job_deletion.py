"""What happens to a job's own Ray cluster when the job ends, and the rules Kueue and KubeRay hold a
queued RayJob to, checked for every environment and variant.

KubeRay (ray-operator, v1.7.0): `handleShutdownAfterJobFinishes` in controllers/ray/
rayjob_controller.go deletes the RayCluster (not the submitter Job: its driver log stays)
`ttlSecondsAfterFinished` after status.endTime once the deployment status is Complete or Failed;
`validateDeletionConfiguration` in controllers/ray/utils/validation.go refuses deletion rules beside
shutdownAfterJobFinishes. Kueue (v0.19.2): pkg/controller/jobs/rayjob/rayjob_webhook.go refuses a
queued RayJob with a clusterSelector, without shutdownAfterJobFinishes, or with more pod sets than a
Workload holds (jobframework.MaxPodSets = 18; the Workload CRD's podSets maxItems 18), and
rayjob_controller.go PodSets counts the head, each worker group and, in K8sJobMode, the submitter.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from k8s.job import QUEUED_TTL_SECONDS
from k8s.kueue import QUEUE_LABEL
from tests.chart_render import ALL, CHECKPOINT_URI, settings_of, the

OWN = [n for n in ALL if settings_of(n).job.cluster == "own"]
MAX_POD_SETS = 18  # kueue v0.19.2 pkg/controller/jobframework/constants.go


def kuberay_refusals(spec: dict[str, Any]) -> list[str]:
    """KubeRay 1.7's validation of a RayJob's deletion settings (see the module docstring)."""
    problems = []
    if not spec.get("shutdownAfterJobFinishes") and spec.get("ttlSecondsAfterFinished", 0) > 0:
        problems.append("ttlSecondsAfterFinished without shutdownAfterJobFinishes")
    rules = (spec.get("deletionStrategy") or {}).get("deletionRules") or []
    if rules and spec.get("shutdownAfterJobFinishes"):
        problems.append("shutdownAfterJobFinishes and deletionRules are mutually exclusive")
    if spec.get("suspend") and not spec.get("shutdownAfterJobFinishes"):
        # "a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended"
        problems.append("suspend without shutdownAfterJobFinishes")
    return problems


def pod_sets(spec: dict[str, Any]) -> int:
    cluster = spec["rayClusterSpec"]
    return 1 + len(cluster.get("workerGroupSpecs", [])) + (spec.get("submissionMode") == "K8sJobMode")


def kueue_refusals(job: dict[str, Any]) -> list[str]:
    """Kueue's webhook on a RayJob that names a queue (see the module docstring)."""
    if QUEUE_LABEL not in job["metadata"].get("labels", {}):
        return []
    spec, problems = job["spec"], []
    if spec.get("clusterSelector"):
        problems.append("clusterSelector: a kueue managed job should not use an existing cluster")
    if not spec.get("rayClusterSpec"):
        return [*problems, "rayClusterSpec is required"]
    if not spec.get("shutdownAfterJobFinishes"):
        problems.append(
            "shutdownAfterJobFinishes: a kueue managed job should delete the cluster after finishing"
        )
    if pod_sets(spec) > MAX_POD_SETS:
        problems.append(f"workerGroupSpecs: {pod_sets(spec)} pod sets, at most {MAX_POD_SETS}")
    if any(g.get("groupName") == "head" for g in spec["rayClusterSpec"].get("workerGroupSpecs", [])):
        problems.append('"head" is reserved for the head group')
    if spec["rayClusterSpec"].get("enableInTreeAutoscaling"):
        problems.append("autoscaling only as an elastic job")
    return problems


@pytest.mark.parametrize("name", OWN)
def test_every_own_cluster_job_is_queued_and_kueue_accepts_it(name: str) -> None:
    job = the(name, "RayJob")
    s = settings_of(name)
    assert job["metadata"]["labels"][QUEUE_LABEL] == s.deploy_team.queue
    assert job["metadata"]["namespace"] == s.deploy_team.namespace
    assert job["spec"]["suspend"] is True  # created suspended: Kueue admits it
    assert kueue_refusals(job) == []
    assert kuberay_refusals(job["spec"]) == []


@pytest.mark.parametrize("name", OWN)
def test_the_whole_cluster_goes_when_the_job_ends(name: str) -> None:
    """Kueue gives the quota back at the end (Finished: deployment status Complete or Failed), so
    the GPU workers must go then, not after an inspection time."""
    spec = the(name, "RayJob")["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == QUEUED_TTL_SECONDS == 0
    assert "deletionStrategy" not in spec


def test_a_standing_cluster_job_is_not_queued() -> None:
    job = the("standing", "RayJob")
    assert QUEUE_LABEL not in job["metadata"]["labels"]
    assert "suspend" not in job["spec"] and "shutdownAfterJobFinishes" not in job["spec"]
    assert kuberay_refusals(job["spec"]) == []


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (lambda s: s.update(clusterSelector={"ray.io/cluster": "x"}), "clusterSelector"),
        (lambda s: s.update(shutdownAfterJobFinishes=False), "shutdownAfterJobFinishes"),
        (
            lambda s: s["rayClusterSpec"].update(
                workerGroupSpecs=[
                    {**s["rayClusterSpec"]["workerGroupSpecs"][0], "groupName": f"g{i}"} for i in range(17)
                ]
            ),
            "pod sets",
        ),
        (lambda s: s["rayClusterSpec"]["workerGroupSpecs"][0].update(groupName="head"), "reserved"),
        (lambda s: s["rayClusterSpec"].update(enableInTreeAutoscaling=True), "elastic"),
    ],
)
def test_the_kueue_check_refuses_what_kueue_refuses(change: Any, refusal: str) -> None:
    job = copy.deepcopy(the("dev", "RayJob"))
    change(job["spec"])
    assert any(refusal in p for p in kueue_refusals(job)), kueue_refusals(job)


def test_sixteen_worker_groups_still_fit_with_the_submitter() -> None:
    job = copy.deepcopy(the("dev", "RayJob"))
    group = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"] = [{**group, "groupName": f"g{i}"} for i in range(16)]
    assert kueue_refusals(job) == []


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (lambda s: s.update(deletionStrategy={"deletionRules": [{}]}), "mutually exclusive"),
        (lambda s: s.update(shutdownAfterJobFinishes=False, ttlSecondsAfterFinished=600), "without shutdown"),
        (lambda s: s.update(shutdownAfterJobFinishes=False), "suspend without"),
    ],
)
def test_the_kuberay_check_refuses_what_kuberay_refuses(change: Any, refusal: str) -> None:
    spec = copy.deepcopy(the("dev", "RayJob")["spec"])
    change(spec)
    assert any(refusal in p for p in kuberay_refusals(spec)), kuberay_refusals(spec)


@pytest.mark.parametrize("name", OWN)
def test_a_preempted_and_readmitted_job_runs_the_same_entry_point(name: str) -> None:
    """Kueue admits a job by unsuspending it and adding its flavors' nodeLabels to the pod sets'
    node selectors (kueue v0.19.2 podset.Merge via RayJob.RunWithPodSetsInfo), and preempts it by
    suspending it and restoring them (RestorePodSetsInfo). KubeRay then deletes the cluster and the
    submitter and, once unsuspended, runs spec.entrypoint again on a new cluster (rayjob_controller.go
    v1.7.0, the Suspending and Suspended cases). So the entry point must carry everything a resume
    needs and nothing that changes between admissions: the run, its storage path, the RayJob's name
    as the job id (the training side resumes from the run's last checkpoint: issue 53)."""
    from k8s.kueue import resource_flavors

    job = the(name, "RayJob")
    s = settings_of(name)
    entry = job["spec"]["entrypoint"]
    words = entry.split()
    assert words[words.index("--run-name") + 1] == job["metadata"]["labels"]["ray-train/run-name"]
    assert words[words.index("--job-id") + 1] == job["metadata"]["name"]
    # The storage path the chart was given (the Workload stack gives the team's prefix:
    # tests/test_workload_stack.py, test_manifests_rendered_for_review).
    assert words[words.index("--storage-path") + 1] == CHECKPOINT_URI
    # Admission: the flavors' labels merged into each pod set's selector, never contradicting it.
    system, gpu = (f["spec"]["nodeLabels"] for f in resource_flavors(s))
    cluster = job["spec"]["rayClusterSpec"]
    for selector, flavor in (
        (cluster["headGroupSpec"]["template"]["spec"]["nodeSelector"], system),
        (cluster["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"], gpu),
        (job["spec"]["submitterPodTemplate"]["spec"]["nodeSelector"], system),
    ):
        assert all(flavor.get(k, v) == v for k, v in selector.items()), (selector, flavor)
    admitted = copy.deepcopy(job)
    admitted["spec"]["suspend"] = False
    for group in admitted["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        group["template"]["spec"]["nodeSelector"] = {**group["template"]["spec"]["nodeSelector"], **gpu}
    readmitted = copy.deepcopy(admitted)
    assert readmitted["spec"]["entrypoint"] == entry == job["spec"]["entrypoint"]
    assert kuberay_refusals(admitted["spec"]) == [] and kueue_refusals(admitted) == []

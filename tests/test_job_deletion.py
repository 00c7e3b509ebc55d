"""What happens to a job's own Ray cluster when the job ends: the RayJob's deletion rules, played
the way KubeRay 1.7's controller plays them, and checked against the rules its validation enforces.

KubeRay (ray-operator, v1.7.0): `handleDeletionRules` and `isDeletionRuleMatched` in
controllers/ray/rayjob_controller.go run, once the RayJob's deployment status is terminal
(Complete or Failed), every rule whose condition equals the final jobStatus (or
jobDeploymentStatus) once `ttlSeconds` have passed since status.endTime. `validateDeletionConfiguration`
and `validateDeletionRules` in controllers/ray/utils/validation.go refuse the RayJob otherwise.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from config.settings import Settings
from k8s import chart as wl
from tests.chart_render import ALL, crd_errors, settings_of, the, variant

OWN = [n for n in ALL if settings_of(n).job.cluster == "own"]

# Final (jobStatus, jobDeploymentStatus) pairs a RayJob ends in, and why.
ENDS = {
    "succeeded": ("SUCCEEDED", "Complete"),
    "application failed": ("FAILED", "Failed"),  # reason AppFailed
    "activeDeadlineSeconds exceeded while running": ("RUNNING", "Failed"),  # DeadlineExceeded
    "cluster never ready (preRunningDeadlineSeconds)": ("", "Failed"),  # PreRunningDeadlineExceeded
    "submission failed": ("PENDING", "Failed"),  # SubmissionFailed
}


def due(spec: dict[str, Any], job_status: str, deployment_status: str, seconds_after_end: int) -> set[str]:
    """The policies KubeRay has carried out `seconds_after_end` after the job's end."""
    done = set()
    for rule in spec["deletionStrategy"]["deletionRules"]:
        cond = rule["condition"]
        matched = (
            cond["jobStatus"] == job_status
            if "jobStatus" in cond
            else cond["jobDeploymentStatus"] == deployment_status
        )
        if matched and seconds_after_end >= cond.get("ttlSeconds", 0):  # the CRD's default: 0
            done.add(rule["policy"])
    return done


def kuberay_refusals(spec: dict[str, Any]) -> list[str]:
    """KubeRay 1.7's validation of a RayJob's deletion settings (see the module docstring)."""
    problems = []
    strategy = spec.get("deletionStrategy")
    if not spec.get("shutdownAfterJobFinishes") and spec.get("ttlSecondsAfterFinished", 0) > 0:
        problems.append("ttlSecondsAfterFinished without shutdownAfterJobFinishes")
    if not strategy:
        return problems
    rules = strategy.get("deletionRules") or []
    if rules and spec.get("shutdownAfterJobFinishes"):
        problems.append("shutdownAfterJobFinishes and deletionRules are mutually exclusive")
    if rules and ("onSuccess" in strategy or "onFailure" in strategy):
        problems.append("legacy onSuccess/onFailure beside deletionRules")
    autoscaling = (spec.get("rayClusterSpec") or {}).get("enableInTreeAutoscaling", False)
    ttls: dict[tuple[str, str], dict[str, int]] = {}
    for i, rule in enumerate(rules):
        cond, policy = rule["condition"], rule["policy"]
        if spec.get("clusterSelector") and policy in ("DeleteCluster", "DeleteWorkers"):
            problems.append(f"deletionRules[{i}]: {policy} with clusterSelector")
        if autoscaling and policy == "DeleteWorkers":
            problems.append(f"deletionRules[{i}]: DeleteWorkers with autoscaling enabled")
        field = "jobStatus" if "jobStatus" in cond else "jobDeploymentStatus"
        key = (field, cond[field])
        if policy in ttls.setdefault(key, {}):
            problems.append(f"deletionRules[{i}]: duplicate {policy} for {key}")
        ttls[key][policy] = cond.get("ttlSeconds", 0)
    for key, by_policy in ttls.items():
        order = [by_policy[p] for p in ("DeleteWorkers", "DeleteCluster", "DeleteSelf") if p in by_policy]
        if order != sorted(order):
            problems.append(f"{key}: TTLs must not decrease from DeleteWorkers to DeleteCluster, DeleteSelf")
    return problems


def job_spec(s: Settings) -> dict[str, Any]:
    import cdk8s

    chart = wl.build_workload_chart(
        cdk8s.App(), s, code_uri="s3://b/c.zip", code_hash="0123abcd", checkpoint_uri="s3://b/ckpt"
    )
    (job,) = [o for o in chart.to_json() if o["kind"] == "RayJob"]
    return job["spec"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", OWN)
@pytest.mark.parametrize("end", sorted(ENDS))
def test_gpu_workers_go_when_the_job_ends_and_the_head_after_the_inspection_time(name: str, end: str) -> None:
    spec = the(name, "RayJob")["spec"]
    head_seconds = settings_of(name).job.ttl_seconds_after_finished
    assert head_seconds > 0
    status = ENDS[end]
    assert due(spec, *status, 0) == {"DeleteWorkers"}
    assert due(spec, *status, head_seconds - 1) == {"DeleteWorkers"}
    assert due(spec, *status, head_seconds) == {"DeleteWorkers", "DeleteCluster"}
    # The RayJob itself (its status, the submitter's driver log) stays: CloudFormation owns it.
    assert "DeleteSelf" not in due(spec, *status, 10**9)


def test_a_job_stopped_from_ray_matches_no_rule() -> None:
    """STOPPED (`ray job stop`) ends in deployment status Complete; KubeRay 1.7's CRD allows no
    condition for it, so its cluster stays until the RayJob is deleted (docs/cost.md)."""
    assert due(the("dev", "RayJob")["spec"], "STOPPED", "Complete", 10**9) == set()


def test_no_inspection_time_deletes_the_whole_cluster_at_once() -> None:
    spec = job_spec(variant("dev", job={"ttl_seconds_after_finished": 0}))
    for status in ENDS.values():
        assert due(spec, *status, 0) == {"DeleteWorkers", "DeleteCluster"}
    assert not kuberay_refusals(spec)
    assert not crd_errors({"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {}, "spec": spec})


@pytest.mark.parametrize("name", ALL)
def test_kuberay_accepts_the_jobs_deletion_settings(name: str) -> None:
    # The CRD's schema and CEL rules: tests/test_chart.py (test_ray_objects_match_the_crd_schema).
    spec = the(name, "RayJob")["spec"]
    assert not kuberay_refusals(spec)
    if settings_of(name).job.cluster == "standing":
        assert "deletionStrategy" not in spec  # the job never deletes the standing cluster


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (lambda s: s.update(shutdownAfterJobFinishes=True), "mutually exclusive"),
        (lambda s: s.update(ttlSecondsAfterFinished=600), "without shutdownAfterJobFinishes"),
        (lambda s: s["deletionStrategy"]["deletionRules"][0]["condition"].update(ttlSeconds=10**6), "TTLs"),
        (
            lambda s: s["deletionStrategy"]["deletionRules"].append(
                s["deletionStrategy"]["deletionRules"][0]
            ),
            "dup",
        ),
        (lambda s: s["rayClusterSpec"].update(enableInTreeAutoscaling=True), "autoscaling"),
        (lambda s: s.update(clusterSelector={"ray.io/cluster": "x"}), "clusterSelector"),
    ],
)
def test_the_kuberay_check_refuses_what_kuberay_refuses(change: Any, refusal: str) -> None:
    spec = copy.deepcopy(the("dev", "RayJob")["spec"])
    change(spec)
    assert any(refusal in p for p in kuberay_refusals(spec)), kuberay_refusals(spec)

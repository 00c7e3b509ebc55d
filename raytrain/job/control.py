"""`raytrain job stop` and `raytrain job delete`: end a job and give its GPU nodes back.

Why stop deletes a running job rather than suspending it: a queued job's `spec.suspend` is Kueue's
(it unsuspends on admission and suspends on preemption, docs/teams.md), so a suspend from here
would only put the job back in its queue; on a standing cluster (clusterSelector) KubeRay refuses
suspend ("a RayJob with shutdownAfterJobFinishes set to false is not allowed to be suspended",
ray-operator/controllers/ray/utils/validation.go, v1.7.0). Deleting the RayJob is KubeRay's own way to stop
it: its finalizer `ray.io/rayjob-finalizer` stops the Ray job through the head's job API before
the RayJob goes (rayjob_controller.go, Reconcile on deletionTimestamp), and its RayCluster (head
and GPU workers) and submitter Job go with it by owner reference. Checkpoints stay in S3: a new
job with the same run_name and job.resume continues from the latest one.

A running queued job is stopped the way Kueue preempts one, first, so that it checkpoints on notice:
its Workload is deactivated (`spec.active: false`, which Kueue's Workload CRD documents as evicting
it and never admitting it again), KubeRay deletes the suspended job's cluster without stopping the
Ray job ("KubeRay doesn't stop the Ray job before suspending the RayJob", rayjob_controller.go,
v1.7.0), and the pods' preStop hooks write the checkpoint (training/checkpoint/notice.py). The
RayJob is deleted once its cluster is gone. A job on a standing cluster is stopped by deletion
only: the Ray job ends at once, and the run continues from its last periodic checkpoint.

A job that already ended holds no GPU worker: a queued job's cluster goes when it ends, STOPPED from
Ray included (shutdownAfterJobFinishes acts on deployment status Complete or Failed, k8s/job.py).
A cluster that still has workers after its job ended (one deployed before Kueue, with deletion
rules that cannot name STOPPED) is released the way KubeRay's DeleteWorkers rule does (suspend
every worker group; the head stays for its logs).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.console import Console
from rich.markup import escape

from config.checkpointing import stop_grace_seconds
from config.names import DEPLOYED, ORIGIN_LABEL
from config.settings import Settings
from k8s.kueue import QUEUE_LABEL
from raytrain import verify
from raytrain.job.api import JobApi
from raytrain.job.common import CLUSTER_LABEL, EXIT_OK, JobError, consoles
from raytrain.job.entry import guarded
from raytrain.job.find import Target, _meta, finished

# Beyond the pods' grace period: KubeRay's and Kueue's reconcile loops, and the API server's
# garbage collection of the cluster's pods.
STOP_MARGIN_S = 60


def run_stop(args: argparse.Namespace, console: Console | None = None) -> int:
    console, err = consoles(console)

    def body(settings: Settings, api: JobApi) -> int:
        target = Target(api, settings, args.job)
        job, ns = _job(target), target.namespace
        name = str(_meta(job, "name"))
        status = job.get("status") or {}
        if finished(job):
            cluster = target.cluster
            own = not (job.get("spec") or {}).get("clusterSelector")
            if own and cluster is not None and not verify.workers_released(cluster):
                api.suspend_workers(ns, cluster)
                console.print(
                    f"RayJob {ns}/{escape(name)} had ended ({status.get('jobStatus') or '-'}) but its "
                    f"cluster {escape(target.cluster_name or '')} still held its GPU workers (a job "
                    "stopped from Ray matches no deletion rule): workers released, head kept for its "
                    f"logs; `raytrain job delete --env {settings.name} --job {name}` removes the rest",
                    highlight=False,
                    soft_wrap=True,
                )
                return EXIT_OK
            console.print(
                f"RayJob {ns}/{escape(name)} has ended ({status.get('jobDeploymentStatus')}, "
                f"{status.get('jobStatus') or '-'}): it holds no GPU worker; nothing to stop",
                highlight=False,
            )
            return EXIT_OK
        if not _checkpoint_then_stop(settings, api, ns, job, console, poll_s=args.poll_seconds):
            _delete(api, ns, job, console, "stopping")
        console.print(
            f"its Ray job is stopped and its cluster deleted; checkpoints stay under the run "
            f"{escape(str((_meta(job, 'labels') or {}).get('ray-train/run-name', '?')))}: a job "
            "with the same job.run_name and job.resume=true continues from the latest",
            highlight=False,
            soft_wrap=True,
        )
        return _maybe_wait(args, api, ns, name, console)

    return guarded(args, console, body, err=err)


def run_delete(args: argparse.Namespace, console: Console | None = None) -> int:
    console, err = consoles(console)

    def body(settings: Settings, api: JobApi) -> int:
        target = Target(api, settings, args.job)
        job = _job(target)
        _delete(api, target.namespace, job, console, "deleting")
        return _maybe_wait(args, api, target.namespace, str(_meta(job, "name")), console)

    return guarded(args, console, body, err=err)


def _admitted_workload(api: JobApi, ns: str, job: dict[str, Any]) -> dict[str, Any] | None:
    """The active, admitted Kueue Workload of a queued job that has its own cluster; else None."""
    if (job.get("spec") or {}).get("clusterSelector") or QUEUE_LABEL not in (_meta(job, "labels") or {}):
        return None
    uid = _meta(job, "uid")
    for w in api.workloads(ns):
        owners = (w.get("metadata") or {}).get("ownerReferences") or []
        if not any(o.get("kind") == "RayJob" and o.get("uid") == uid for o in owners):
            continue
        admitted = any(
            c.get("type") == "Admitted" and c.get("status") == "True"
            for c in (w.get("status") or {}).get("conditions") or []
        )
        active = (w.get("spec") or {}).get("active", True)
        return w if admitted and active else None
    return None


def _checkpoint_then_stop(
    settings: Settings, api: JobApi, ns: str, job: dict[str, Any], console: Console, *, poll_s: float
) -> bool:
    """Stop an admitted queued job the way a preemption does, so that it writes a checkpoint on
    notice: deactivate its Workload (Kueue evicts it and suspends the RayJob; KubeRay deletes the
    cluster without stopping the Ray job first, and the pods' preStop hooks drain the workers and
    keep the head until the checkpoint is registered: training/checkpoint/notice.py). Deleting the
    RayJob at once would not: KubeRay's finalizer stops the Ray job, driver and workers, before
    the pods go. Then, once the cluster's pods are gone (or the pods' grace period and a margin have
    passed), delete the RayJob. False when the job is not such a job (then it is only deleted)."""
    workload = _admitted_workload(api, ns, job)
    if workload is None:
        return False
    name, grace = str(_meta(job, "name")), stop_grace_seconds(settings)
    # KubeRay clears the name once Suspended (rayjob_controller.go v1.7.0): read it now.
    cluster = (job.get("status") or {}).get("rayClusterName")
    if api.deactivate_workload(ns, str(workload["metadata"]["name"])) is None:
        return False  # the Workload went meanwhile: nothing to evict
    console.print(
        f"RayJob {ns}/{escape(name)}: its Kueue workload deactivated; its pods write a checkpoint on "
        f"notice before they go (up to {grace} s)",
        highlight=False,
        soft_wrap=True,
    )
    deadline = time.monotonic() + grace + STOP_MARGIN_S
    while time.monotonic() < deadline:
        current = api.rayjob(ns, name)
        if current is None:
            return True
        if _released(api, ns, current, cluster):
            break
        time.sleep(poll_s)
    else:
        console.print(
            f"[yellow]its cluster's pods were not gone {grace + STOP_MARGIN_S} s later[/]: deleting the "
            "RayJob now; the newest complete checkpoint is what a rerun continues from",
            highlight=False,
            soft_wrap=True,
        )
    _delete(api, ns, job, console, "stopping")
    return True


def _released(api: JobApi, ns: str, job: dict[str, Any], cluster: str | None) -> bool:
    """Whether a deactivated job's pods are all gone, or it ended meanwhile. KubeRay marks the RayJob
    Suspended once the RayCluster object is gone, which is deleted in the background: its pods go
    afterwards, each after its preStop hook (the checkpoint on notice), so wait for them too."""
    status = (job.get("status") or {}).get("jobDeploymentStatus")
    if status in {"Complete", "Failed"}:
        return True
    if status != "Suspended":
        return False
    return not cluster or not api.pods(ns, f"{CLUSTER_LABEL}={cluster}")


def _job(target: Target) -> dict[str, Any]:
    if target.job is None:  # --job is required: select_job raised for an unknown name
        raise JobError(f"no RayJob in namespace {target.namespace!r}")
    return target.job


def _delete(api: JobApi, ns: str, job: dict[str, Any], console: Console, doing: str) -> None:
    name = str(_meta(job, "name"))
    if (_meta(job, "labels") or {}).get(ORIGIN_LABEL) == DEPLOYED:
        console.print(
            f"[yellow]{escape(name)} is the Workload stack's job[/]: CloudFormation does not recreate "
            "it; set job.deploy: false before the next deploy if it should not run again",
            highlight=False,
            soft_wrap=True,
        )
    if api.delete_rayjob(ns, name) is None:
        raise JobError(f"RayJob {ns}/{name} is gone already")
    console.print(f"{doing} RayJob {ns}/{escape(name)}: deletion requested", highlight=False)


def _maybe_wait(args: argparse.Namespace, api: JobApi, ns: str, name: str, console: Console) -> int:
    if not args.wait:
        return EXIT_OK
    while api.rayjob(ns, name) is not None:
        time.sleep(args.poll_seconds)
    console.print(f"RayJob {ns}/{escape(name)} and its cluster are gone", highlight=False)
    return EXIT_OK

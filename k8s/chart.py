"""The workload chart: Ray namespace objects, the RayCluster spec, the RayJob, network policies.

The pieces live beside it: `cluster` (the one RayCluster spec), `job` (the RayJob, its arguments
and name), `network_policy`, and `pods` (pod-template helpers all three pod kinds share). This
module puts them into one cdk8s chart, for the workload stack and for review (`render_manifests`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cdk8s
import cdk8s_plus_27 as kplus
from constructs import Construct

from config.names import (
    DEPLOYED,
    JOBS_ANCHOR,
    ORIGIN_LABEL,
    PART_OF,
    PART_OF_LABEL,
    RUN_NAME_LABEL,
    SERVICE_ACCOUNT,
    STANDING_CLUSTER_NAME,
    STEP_LABEL,
    SUBMITTED,
)
from config.settings import ClusterMode, Settings
from k8s.cluster import ray_cluster_spec, worker_env
from k8s.imports.raycluster.io import ray as rc
from k8s.imports.rayjob.io import ray as rj
from k8s.job import (
    deployed_run_name,
    entrypoint,
    job_spec,
    prepare_job_spec,
    prepare_rayjob_name,
    rayjob_name,
    training_args,
)
from k8s.kueue import PRIORITY_LABEL, QUEUE_LABEL
from k8s.network_policy import network_policies
from k8s.rbac import job_roles

__all__ = [
    "JobOwner",
    "build_workload_chart",
    "entrypoint",
    "ray_cluster_spec",
    "rayjob_name",
    "render_manifests",
    "submitted_rayjob",
    "training_args",
    "worker_env",
]


def build_workload_chart(
    scope: cdk8s.App,
    settings: Settings,
    *,
    code_uri: str,
    code_hash: str,
    checkpoint_uri: str,
    service_account_name: str = SERVICE_ACCOUNT,
    include_namespace: bool = True,
    include_jobs: bool = True,
) -> cdk8s.Chart:
    """The workload chart for one environment.

    `include_namespace=False` leaves the Namespace out, for a caller that creates it elsewhere
    (e.g. before the KubeRay operator, whose namespaced RBAC needs it first). `include_jobs=False`
    leaves the RayJobs out (job.deploy false: jobs come from `raytrain job submit`).
    """
    chart = _chart(scope, "workload")
    deploy = settings.deploy_team
    for team in settings.team_list:
        # The implicit team's objects keep their construct ids (and so everything as before teams).
        where = chart if team.implicit else Construct(chart, f"team-{team.name}")
        _team_objects(
            where,
            settings.for_team(team.name),
            code_uri=code_uri,
            code_hash=code_hash,
            checkpoint_uri=checkpoint_uri,
            service_account_name=service_account_name,
            include_namespace=include_namespace,
            include_jobs=include_jobs and team.name == deploy.name,
        )
    return chart


def _team_objects(
    chart: Construct,
    settings: Settings,
    *,
    code_uri: str,
    code_hash: str,
    checkpoint_uri: str,
    service_account_name: str,
    include_namespace: bool,
    include_jobs: bool,
) -> None:
    """One team's objects in its namespace (`settings` is the team's view, Settings.for_team)."""
    ns = settings.workload.namespace
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
    jobs_anchor(chart, settings)
    job_roles(chart, settings)
    if include_jobs:
        add_rayjob(
            chart,
            settings,
            name=rayjob_name(settings, code_hash=code_hash, service_account_name=service_account_name),
            origin=DEPLOYED,
            code_uri=code_uri,
            checkpoint_uri=checkpoint_uri,
            service_account_name=service_account_name,
        )
    if include_jobs and settings.job.prepare_data:
        rj.RayJob(
            chart,
            "prepare-job",
            metadata=cdk8s.ApiObjectMetadata(
                name=prepare_rayjob_name(
                    settings, code_hash=code_hash, service_account_name=service_account_name
                ),
                namespace=ns,
                labels={
                    RUN_NAME_LABEL: settings.job.run_name,
                    STEP_LABEL: "prepare-data",
                    ORIGIN_LABEL: DEPLOYED,
                    **queue_labels(settings),
                },
            ),
            spec=prepare_job_spec(
                settings,
                code_uri=code_uri,
                checkpoint_uri=checkpoint_uri,
                service_account_name=service_account_name,
            ),
        )
    network_policies(chart, settings)


def queue_labels(settings: Settings, priority: str | None = None) -> dict[str, str]:
    """The Kueue labels of a RayJob of the settings' team (Settings.active_team): its LocalQueue, and
    its WorkloadPriorityClass (`priority`, else the team's default). None for a job on the standing
    cluster, which Kueue does not manage (a clusterSelector job is skipped, rayjob_webhook.go)."""
    if settings.job.cluster is not ClusterMode.OWN:
        return {}
    team = settings.active_team
    return {QUEUE_LABEL: team.queue, PRIORITY_LABEL: priority or team.default_priority}


def _chart(scope: cdk8s.App, chart_id: str) -> cdk8s.Chart:
    # Every object carries part-of: `raytrain job` selects the environment's RayJobs by it.
    return cdk8s.Chart(scope, chart_id, labels={PART_OF_LABEL: PART_OF})


@dataclass(frozen=True)
class JobOwner:
    """The jobs anchor as it exists in the cluster: what a submitted RayJob's ownerReference names."""

    uid: str
    name: str = JOBS_ANCHOR


def jobs_anchor(chart: Construct, settings: Settings) -> kplus.ConfigMap:
    """The owner of every submitted RayJob, applied with the Workload stack's service account.

    Deleting an owner deletes its dependents (Kubernetes garbage collection), so no submitted
    RayJob outlives the stack. The `foregroundDeletion` finalizer would make that deletion wait
    for them, but only for a delete that names no propagation policy: CDK's kubectl handler runs
    `kubectl delete -f`, whose default `--cascade=background` is sent explicitly and overrides the
    finalizer (apiserver store.go, shouldDeleteDependents). What holds the destroy until the jobs
    are gone is the Workload stack's drain (cdk_constructs/job_drain.py), which runs first; the
    finalizer still makes a DELETE that names no policy (a plain API call) foreground.
    """
    return kplus.ConfigMap(
        chart,
        "jobs-anchor",
        metadata=cdk8s.ApiObjectMetadata(
            name=JOBS_ANCHOR,
            namespace=settings.workload.namespace,
            finalizers=["foregroundDeletion"],
        ),
        data={
            "purpose": (
                "Owner of the RayJobs `raytrain job submit` creates: deleting it (the Workload "
                "stack's destroy) deletes them first."
            ),
        },
    )


def add_rayjob(
    chart: Construct,
    settings: Settings,
    *,
    name: str,
    origin: str,
    code_uri: str,
    checkpoint_uri: str,
    service_account_name: str = SERVICE_ACCOUNT,
    owner: JobOwner | None = None,
    priority: str | None = None,
) -> rj.RayJob:
    """The training RayJob, the one way it is built: the Workload stack's chart (origin deployed)
    and `raytrain job submit` (origin submitted, owned by the jobs anchor) both call this."""
    owners = None
    if owner is not None:
        owners = [
            cdk8s.OwnerReference(
                api_version="v1",
                kind="ConfigMap",
                name=owner.name,
                uid=owner.uid,
                block_owner_deletion=True,
            )
        ]
    # A deployed job trains a run of its own (k8s/job.py deployed_run_name); a submitted one
    # job.run_name. Either is retried by KubeRay under its RayJob's name, which --job-id carries.
    run = deployed_run_name(settings, name) if origin == DEPLOYED else settings.job.run_name
    return rj.RayJob(
        chart,
        "ray-job",
        metadata=cdk8s.ApiObjectMetadata(
            name=name,
            namespace=settings.workload.namespace,
            labels={RUN_NAME_LABEL: run, ORIGIN_LABEL: origin, **queue_labels(settings, priority)},
            owner_references=owners,
        ),
        spec=job_spec(
            settings,
            code_uri=code_uri,
            checkpoint_uri=checkpoint_uri,
            service_account_name=service_account_name,
            run_name=run,
            job_id=name,
        ),
    )


def submitted_rayjob(
    settings: Settings,
    *,
    name: str,
    code_uri: str,
    checkpoint_uri: str,
    owner: JobOwner,
    service_account_name: str = SERVICE_ACCOUNT,
    priority: str | None = None,
) -> dict[str, Any]:
    """The RayJob `raytrain job submit` creates, as the object the Kubernetes API takes: in the
    namespace and queue of the settings' team (Settings.for_team)."""
    chart = _chart(cdk8s.App(), "submitted")
    add_rayjob(
        chart,
        settings,
        name=name,
        origin=SUBMITTED,
        code_uri=code_uri,
        checkpoint_uri=checkpoint_uri,
        service_account_name=service_account_name,
        owner=owner,
        priority=priority,
    )
    (obj,) = chart.to_json()
    return dict(obj)


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
    `out_dir` (stale `*.k8s.yaml` files there are removed first); with several teams, whose
    namespaces hold objects of the same names, `<Kind>.<namespace>.<name>.k8s.yaml` for the
    namespaced ones. Returns the files, sorted."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.k8s.yaml"):
        old.unlink()
    chart = build_workload_chart(
        cdk8s.App(),
        settings,
        code_uri=code_uri,
        code_hash=code_hash,
        checkpoint_uri=checkpoint_uri,
        service_account_name=service_account_name,
        include_namespace=include_namespace,
    )
    several = len(settings.team_list) > 1
    for obj in chart.to_json():
        meta = obj["metadata"]
        where = f"{meta['namespace']}." if several and meta.get("namespace") else ""
        (out_dir / f"{obj['kind']}.{where}{meta['name']}.k8s.yaml").write_text(cdk8s.Yaml.stringify(obj))
    return sorted(out_dir.glob("*.k8s.yaml"))

"""The workload chart: Ray namespace objects, the RayCluster spec, the RayJob, network policies.

The pieces live beside it: `cluster` (the one RayCluster spec), `job` (the RayJob, its arguments
and name), `network_policy`, and `pods` (pod-template helpers all three pod kinds share). This
module puts them into one cdk8s chart, for the workload stack and for review (`render_manifests`).
"""

from __future__ import annotations

from pathlib import Path

import cdk8s
import cdk8s_plus_27 as kplus

from config.names import PART_OF, PART_OF_LABEL, SERVICE_ACCOUNT, STANDING_CLUSTER_NAME
from config.settings import ClusterMode, Settings
from k8s.cluster import ray_cluster_spec, worker_env
from k8s.imports.raycluster.io import ray as rc
from k8s.imports.rayjob.io import ray as rj
from k8s.job import (
    entrypoint,
    job_spec,
    prepare_job_spec,
    prepare_rayjob_name,
    rayjob_name,
    training_args,
)
from k8s.network_policy import network_policies

__all__ = [
    "build_workload_chart",
    "entrypoint",
    "ray_cluster_spec",
    "rayjob_name",
    "render_manifests",
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
        spec=job_spec(
            settings,
            code_uri=code_uri,
            checkpoint_uri=checkpoint_uri,
            service_account_name=service_account_name,
        ),
    )
    if settings.job.prepare_data:
        rj.RayJob(
            chart,
            "prepare-job",
            metadata=cdk8s.ApiObjectMetadata(
                name=prepare_rayjob_name(
                    settings, code_hash=code_hash, service_account_name=service_account_name
                ),
                namespace=ns,
                labels={"ray-train/run-name": settings.job.run_name, "ray-train/step": "prepare-data"},
            ),
            spec=prepare_job_spec(
                settings,
                code_uri=code_uri,
                checkpoint_uri=checkpoint_uri,
                service_account_name=service_account_name,
            ),
        )
    network_policies(chart, settings)
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

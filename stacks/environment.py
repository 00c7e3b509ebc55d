"""One environment's stacks: settings → Network, Cluster and Workload stacks, with the cdk-nag gate.

Builds into an App or into a pipeline's Stage alike, and knows nothing of the pipeline: the app
adds it on top (`stacks/app_builder.py`), and the pipeline's stages call `build_environment`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from cdk_constructs.checkov import FrameworkFunctionSkips
from config.settings import Settings
from stacks.cluster_stack import ClusterStack
from stacks.nag import acknowledge_cluster_findings, acknowledge_workload_findings
from stacks.network_stack import NetworkStack
from stacks.workload_stack import WorkloadStack

CDK_JSON = Path(__file__).resolve().parents[1] / "cdk.json"


@dataclass
class EnvironmentStacks:
    network: NetworkStack
    cluster: ClusterStack
    workload: WorkloadStack

    pipeline: cdk.Stack | None = None
    # CodePipeline's replication-bucket stacks, one per other region the pipeline deploys to.
    pipeline_support: list[cdk.Stack] = field(default_factory=list)

    def all(self) -> list[cdk.Stack]:
        return [
            self.network,
            self.cluster,
            self.workload,
            *([self.pipeline] if self.pipeline else []),
            *self.pipeline_support,
        ]


def availability_zones_context(settings: Settings) -> dict[str, list[str]]:
    """Offline synthesis: tell CDK the AZs instead of letting it look them up with credentials
    (and silently use dummy AZs when it cannot)."""
    key = f"availability-zones:account={settings.account}:region={settings.region}"
    return {key: list(settings.vpc.availability_zones)}


def cdk_json_context() -> dict[str, Any]:
    """cdk.json's context (feature flags), so `python app.py`, the tests and `npx cdk` agree."""
    return dict(json.loads(CDK_JSON.read_text(encoding="utf-8")).get("context", {}))


def new_app(settings: Settings, *, outdir: str | None = None) -> cdk.App:
    context = {**cdk_json_context(), **availability_zones_context(settings), "env": settings.name}
    return cdk.App(outdir=outdir, context=context)


def build_environment(app: cdk.Stage, settings: Settings, *, nag: bool = True) -> EnvironmentStacks:
    """`app` is the App, or a pipeline's Stage (stacks/pipeline/stage.py) holding the same stacks."""
    env = cdk.Environment(account=settings.account, region=settings.region)
    prefix = settings.stack_prefix
    common: dict = {
        "env": env,
        "termination_protection": settings.termination_protection,
    }
    network = NetworkStack(
        app,
        f"{prefix}-Network",
        # Explicit, so inside a pipeline Stage the stacks keep these names (not "<stage>-<id>").
        stack_name=f"{prefix}-Network",
        settings=settings,
        description=f"Ray Train on EKS ({settings.name}): VPC, NAT, endpoints, flow logs",
        **common,
    )
    cluster = ClusterStack(
        app,
        f"{prefix}-Cluster",
        stack_name=f"{prefix}-Cluster",
        settings=settings,
        vpc=network.vpc,
        gpu_subnet=network.private_subnet_in(settings.gpu_nodes.availability_zone),
        description=f"Ray Train on EKS ({settings.name}): EKS, node groups, GPU/EFA/KubeRay add-ons",
        **common,
    )
    workload = WorkloadStack(
        app,
        f"{prefix}-Workload",
        stack_name=f"{prefix}-Workload",
        settings=settings,
        cluster=cluster.cluster_ref,
        description=f"Ray Train on EKS ({settings.name}): checkpoints, training code, RayCluster/RayJob",
        **common,
    )
    # Destroy order: the workload (RayJob, RayCluster) goes before the cluster's operator and nodes.
    workload.add_stack_dependency(cluster)
    stacks = EnvironmentStacks(network=network, cluster=cluster, workload=workload)

    for key, value in {"environment": settings.name, **settings.tags}.items():
        cdk.Tags.of(app).add(key, value)
    # checkov (make iac-scan): CDK's own framework functions carry their suppressions and reasons
    # (here, on the App or a pipeline Stage: aspects do not cross into nested Stages).
    cdk.Aspects.of(app).add(FrameworkFunctionSkips())
    if nag:
        cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
        acknowledge_cluster_findings(cluster)
        acknowledge_workload_findings(workload)
    return stacks

"""Every pod the cluster runs, scheduled (offline) against our node groups.

The add-ons' own charts at the pinned versions (tests/fixtures/charts/, each with its SOURCE.md)
are rendered by the kubectl layer's `helm template` with the values in the synthesized Cluster
template; the Ray pods come from the cdk8s chart. Each pod template is then checked against each
node group's labels, taints and allocatable (tests/scheduling.py):

- every agent a GPU node needs schedules on the GPU group: the NVIDIA and EFA device plugins, and
  with node monitoring on its agent and DCGM host engine;
- the KubeRay operator, the Cluster Autoscaler and the Ray head stay on the system group;
- the Ray worker lands on the GPU group only, and its requests fit beside every DaemonSet's
  requests in one GPU node's allocatable;
- the autoscaler's template node (the node-template tags of the GPU group) offers what the worker
  asks, so it scales the group up from zero for a pending worker.

EKS's own core add-ons (vpc-cni, kube-proxy, eks-pod-identity-agent) are not rendered: their charts
are not published at the versions EKS picks; workload.gpu_node_daemon_* keeps room for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import cdk8s
import pytest

from cdk_constructs.cluster_autoscaler import NODE_TEMPLATE
from config.catalogue import CATALOGUE
from config.names import (
    DCGM_SERVER,
    EFA_DEVICE_PLUGIN_CHART,
    EFA_RESOURCE,
    GPU_NODE_ROLE,
    GPU_RESOURCE,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    KUBERAY_RELEASE,
    NODE_MONITORING_AGENT,
    NODE_MONITORING_NAMESPACE,
    NVIDIA_DEVICE_PLUGIN_CHART,
    SYSTEM_NODE_ROLE,
)
from config.settings import Settings
from k8s import chart as workload_chart
from tests import scheduling as sch
from tests.helm_charts import cloudwatch_release, helm_releases, layer_helm, nma_release, render

ENVS = ["dev", "prod", "p5"]
CODE_URI = "s3://cdk-assets-111122223333-us-west-2/0123abcd.zip"
CHECKPOINT_URI = "s3://ray-train-checkpoints/checkpoints"


@dataclass
class Cluster:
    settings: Settings
    system: sch.NodeGroup
    gpu: sch.NodeGroup
    pods: list[sch.PodTemplate]

    def named(self, kind: str, name: str) -> sch.PodTemplate:
        found = [p for p in self.pods if p.kind == kind and f"/{name} " in p.owner]
        assert len(found) == 1, f"{kind} {name}: {[p.owner for p in self.pods]}"
        return found[0]

    def of_kind(self, kind: str) -> list[sch.PodTemplate]:
        return [p for p in self.pods if p.kind == kind]


def _node_groups(template: dict[str, Any], settings: Settings) -> dict[str, sch.NodeGroup]:
    out = {}
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::EKS::Nodegroup":
            continue
        p = resource["Properties"]
        role = p["Labels"]["role"]
        gpu = role == GPU_NODE_ROLE
        instance = settings.gpu_nodes.instance if gpu else CATALOGUE[settings.system_nodes.instance_type]
        out[role] = sch.node_group(
            role,
            instance,
            labels=p["Labels"],
            taints=p.get("Taints") or [],
            zone=settings.gpu_nodes.availability_zone if gpu else settings.vpc.availability_zones[0],
            capacity_type=p.get("CapacityType", "ON_DEMAND"),
            gpu_resource=GPU_RESOURCE,
            efa_resource=EFA_RESOURCE,
            efa=settings.gpu_nodes.efa,
        )
    return out


def ray_pods(settings: Settings) -> list[sch.PodTemplate]:
    app = cdk8s.App()
    chart = workload_chart.build_workload_chart(
        app, settings, code_uri=CODE_URI, code_hash="0123abcd", checkpoint_uri=CHECKPOINT_URI
    )
    return sch.pod_templates(list(chart.to_json()), "cdk8s workload chart")


@pytest.fixture(scope="module")
def helm_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("charts")


def _helm(settings: Settings, work: Path) -> Path:
    return layer_helm(settings.cluster.kubernetes_version, work)


@pytest.fixture(scope="module")
def clusters(synthesized: dict[str, Any], helm_work: Path) -> dict[str, Cluster]:
    out = {}
    for env in ENVS:
        settings = synthesized[env].settings
        template = synthesized[env].template("Cluster")
        helm = _helm(settings, helm_work)
        work = helm_work / env
        work.mkdir(exist_ok=True)
        releases = list(helm_releases(template).values())
        if settings.observability.node_monitoring:
            releases.append(nma_release(template, settings))
        if settings.observability.metrics:
            releases.append(cloudwatch_release(template, settings))
        pods: list[sch.PodTemplate] = []
        for release in releases:
            docs = render(helm, release, work, kubernetes_version=settings.cluster.kubernetes_version)
            pods += sch.pod_templates(docs, f"chart {release.chart} {release.version}", release.namespace)
        pods += ray_pods(settings)
        groups = _node_groups(template, settings)
        out[env] = Cluster(settings, groups[SYSTEM_NODE_ROLE], groups[GPU_NODE_ROLE], pods)
    return out


def required_on_gpu_nodes(settings: Settings) -> list[tuple[str, str]]:
    """(what, DaemonSet name) of every agent a GPU node of this environment needs."""
    agents = [("NVIDIA device plugin", NVIDIA_DEVICE_PLUGIN_CHART)]
    if settings.gpu_nodes.efa:
        agents.append(("EFA device plugin", EFA_DEVICE_PLUGIN_CHART))
    if settings.observability.node_monitoring:
        agents += [("node monitoring agent", NODE_MONITORING_AGENT), ("DCGM host engine", DCGM_SERVER)]
    if settings.observability.metrics:
        # Container Insights: node and GPU/EFA metrics, container logs (the training job's too).
        agents += [
            ("CloudWatch agent", "cloudwatch-agent"),
            ("DCGM exporter (GPU metrics)", "dcgm-exporter"),
            ("Fluent Bit (container logs)", "fluent-bit"),
        ]
    return agents


def agents_kept_away(
    pods: list[sch.PodTemplate], group: sch.NodeGroup, agents: list[tuple[str, str]]
) -> list[str]:
    """One line per required agent that would not run on the group: the agent and what keeps it away."""
    problems = []
    for what, name in agents:
        found = [p for p in pods if p.kind == "DaemonSet" and f"/{name} " in p.owner]
        if not found:
            problems.append(f"{what}: no DaemonSet {name} among the rendered charts")
            continue
        reason = sch.why_not(found[0], group)
        if reason:
            problems.append(
                f"{what} ({found[0].owner}) does not schedule on node group {group.name}: {reason}"
            )
    return problems


# --- the agents a GPU node needs --------------------------------------------------------------------


@pytest.mark.parametrize("env", ENVS)
def test_every_agent_a_gpu_node_needs_schedules_there(clusters: dict[str, Cluster], env: str) -> None:
    c = clusters[env]
    assert agents_kept_away(c.pods, c.gpu, required_on_gpu_nodes(c.settings)) == []


def test_prod_checks_the_cloudwatch_agents(clusters: dict[str, Cluster]) -> None:
    c = clusters["prod"]
    assert c.settings.observability.metrics
    names = {name for _, name in required_on_gpu_nodes(c.settings)}
    assert {"cloudwatch-agent", "dcgm-exporter", "fluent-bit"} <= names
    # The add-on's operator is a controller: on system nodes, not GPU ones.
    operator = c.named("Deployment", "amazon-cloudwatch-observability-controller-manager")
    assert sch.why_not(operator, c.system) is None and sch.why_not(operator, c.gpu) is not None


@pytest.mark.parametrize("env", ENVS)
def test_node_monitoring_agent_runs_on_system_nodes_too(clusters: dict[str, Cluster], env: str) -> None:
    c = clusters[env]
    agent = c.named("DaemonSet", NODE_MONITORING_AGENT)
    assert sch.why_not(agent, c.system) is None
    # The DCGM engine is for GPU nodes only (its chart's instance-type affinity).
    reason = sch.why_not(c.named("DaemonSet", DCGM_SERVER), c.system)
    assert reason and "node.kubernetes.io/instance-type In" in reason


def test_the_check_catches_dcgm_without_tolerations(synthesized: dict[str, Any], helm_work: Path) -> None:
    """The original bug: the add-on with the chart's default `dcgmAgent.tolerations: []`."""
    settings = synthesized["dev"].settings
    template = synthesized["dev"].template("Cluster")
    work = helm_work / "bug"
    work.mkdir(exist_ok=True)
    docs = render(
        _helm(settings, helm_work),
        nma_release(template, settings, config={}),
        work,
        kubernetes_version=settings.cluster.kubernetes_version,
    )
    pods = sch.pod_templates(
        docs, "chart eks-node-monitoring-agent, default values", NODE_MONITORING_NAMESPACE
    )
    gpu = _node_groups(template, settings)[GPU_NODE_ROLE]
    (problem,) = agents_kept_away(pods, gpu, [("DCGM host engine", DCGM_SERVER)])
    assert problem.startswith("DCGM host engine (DaemonSet kube-system/dcgm-server")
    assert problem.endswith(f"taint {GPU_TAINT_KEY}={GPU_TAINT_VALUE}:NoSchedule is not tolerated")
    # The agent itself tolerates every taint by the chart's default.
    assert agents_kept_away(pods, gpu, [("node monitoring agent", NODE_MONITORING_AGENT)]) == []


def test_the_check_names_a_missing_label(clusters: dict[str, Cluster]) -> None:
    """A GPU group without nvidia.com/gpu.present gets no NVIDIA device plugin (DESIGN.md)."""
    c = clusters["dev"]
    labels = {k: v for k, v in c.gpu.labels.items() if k != "nvidia.com/gpu.present"}
    unlabelled = sch.NodeGroup(c.gpu.name, labels, c.gpu.taints, c.gpu.allocatable)
    (problem,) = agents_kept_away(c.pods, unlabelled, [("NVIDIA device plugin", NVIDIA_DEVICE_PLUGIN_CHART)])
    assert (
        "nodeSelector nvidia.com/gpu.present=true (the node has no label nvidia.com/gpu.present)" in problem
    )


# --- what must not land on GPU nodes ------------------------------------------------------------------


@pytest.mark.parametrize("env", ENVS)
def test_controllers_and_the_ray_head_stay_on_system_nodes(clusters: dict[str, Cluster], env: str) -> None:
    c = clusters[env]
    controllers = c.of_kind("Deployment") + c.of_kind("RayHead")
    owners = " ".join(p.owner for p in controllers)
    assert f"/{KUBERAY_RELEASE} " in owners and "cluster-autoscaler" in owners and "head" in owners
    for pod in controllers:
        assert sch.why_not(pod, c.system) is None, f"{pod.owner} cannot run on system nodes"
        assert sch.why_not(pod, c.gpu) is not None, f"{pod.owner} could land on a GPU node"


@pytest.mark.parametrize("env", ENVS)
def test_ray_worker_lands_on_gpu_nodes_only(clusters: dict[str, Cluster], env: str) -> None:
    c = clusters[env]
    (worker,) = c.of_kind("RayWorker")
    assert sch.why_not(worker, c.gpu) is None
    assert sch.why_not(worker, c.system) is not None


# --- room on a GPU node -----------------------------------------------------------------------------


def _daemonsets_on(c: Cluster, group: sch.NodeGroup) -> list[sch.PodTemplate]:
    return [p for p in c.of_kind("DaemonSet") if sch.why_not(p, group) is None]


@pytest.mark.parametrize("env", ENVS)
def test_ray_worker_fits_beside_every_daemonset(clusters: dict[str, Cluster], env: str) -> None:
    c = clusters[env]
    (worker,) = c.of_kind("RayWorker")
    daemons = _daemonsets_on(c, c.gpu)
    assert {NVIDIA_DEVICE_PLUGIN_CHART, DCGM_SERVER} <= {p.owner.split("/")[1].split(" ")[0] for p in daemons}
    assert sch.shortfall(c.gpu, [*daemons, worker]) == []
    # The rendered DaemonSets ask less than the room the worker's size leaves for them.
    w = c.settings.workload
    asked_cpu = sum((sch.requests(p).get("cpu", Decimal(0)) for p in daemons), Decimal(0))
    asked_mem = sum((sch.requests(p).get("memory", Decimal(0)) for p in daemons), Decimal(0))
    assert asked_cpu * 1000 <= w.gpu_node_daemon_cpu_millis
    assert asked_mem <= w.gpu_node_daemon_memory_mib * 1024 * 1024


def test_shortfall_names_the_resource() -> None:
    group = sch.NodeGroup("g", {}, (), {"cpu": Decimal(1), "memory": Decimal(2**30), "pods": Decimal(10)})
    pod = sch.PodTemplate(
        "Deployment x/y (test)", "Deployment", {"containers": [{"resources": {"limits": {"cpu": "1500m"}}}]}
    )
    assert sch.shortfall(group, [pod]) == ["cpu: 1500m asked, 1000m allocatable on g"]


# --- scale from zero ----------------------------------------------------------------------------------


def template_node(settings: Settings, template: dict[str, Any]) -> sch.NodeGroup:
    """The node the Cluster Autoscaler imagines for the GPU group with none running, as its AWS
    provider builds it for a managed node group (aws_manager.go buildNodeFromTemplate, 1.34-1.36):
    the instance type's resources, the node group's Labels and Taints (eks:DescribeNodegroup) and
    the `node-template/resources/*` of the node group's Tags, all read from the synthesized template."""
    gpu = settings.gpu_nodes
    (props,) = [
        r["Properties"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::EKS::Nodegroup" and r["Properties"]["Labels"].get("role") == "gpu-worker"
    ]
    node = sch.node_group(
        "gpu-template",
        gpu.instance,
        labels=dict(props["Labels"]),
        taints=list(props.get("Taints", [])),
        zone=gpu.availability_zone,
        capacity_type=str(gpu.capacity_type),
        gpu_resource=GPU_RESOURCE,
        efa_resource=EFA_RESOURCE,
        efa=False,  # extended resources come from the tags only
    )
    extended = {
        k.removeprefix(f"{NODE_TEMPLATE}/resources/"): Decimal(v)
        for k, v in props.get("Tags", {}).items()
        if k.startswith(f"{NODE_TEMPLATE}/resources/")
    }
    allocatable = {k: v for k, v in node.allocatable.items() if k in ("cpu", "memory", "pods")} | extended
    return sch.NodeGroup(node.name, node.labels, node.taints, allocatable)


@pytest.mark.parametrize("env", ENVS)
def test_autoscaler_template_node_offers_what_the_worker_asks(
    clusters: dict[str, Cluster], synthesized: dict[str, Any], env: str
) -> None:
    c = clusters[env]
    (worker,) = c.of_kind("RayWorker")
    node = template_node(c.settings, synthesized[env].template("Cluster"))
    assert sch.why_not(worker, node) is None
    # The autoscaler places the DaemonSets' pods on its template node too before it fits the worker.
    assert sch.shortfall(node, [*_daemonsets_on(c, node), worker]) == []
    asked = sch.requests(worker)
    assert asked[GPU_RESOURCE] == node.allocatable[GPU_RESOURCE]
    if c.settings.gpu_nodes.efa:
        assert asked[EFA_RESOURCE] == node.allocatable[EFA_RESOURCE]


# --- the evaluator's own rules ------------------------------------------------------------------------


def test_tolerations_follow_kubernetes_matching() -> None:
    taint = sch.Taint(GPU_TAINT_KEY, GPU_TAINT_VALUE, "NoSchedule")
    assert sch._tolerates({"operator": "Exists"}, taint)
    assert sch._tolerates({"key": GPU_TAINT_KEY, "operator": "Exists"}, taint)
    assert sch._tolerates({"key": GPU_TAINT_KEY, "operator": "Equal", "value": GPU_TAINT_VALUE}, taint)
    assert sch._tolerates({"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": "NoSchedule"}, taint)
    assert not sch._tolerates({"key": GPU_TAINT_KEY, "operator": "Equal", "value": "true"}, taint)
    assert not sch._tolerates({"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}, taint)
    assert not sch._tolerates({"key": "CriticalAddonsOnly", "operator": "Exists"}, taint)


def test_affinity_expressions_follow_kubernetes_matching() -> None:
    labels = {"a": "1", "b": "x"}
    assert sch._expression_holds({"key": "c", "operator": "NotIn", "values": ["x"]}, labels)
    assert sch._expression_holds({"key": "c", "operator": "DoesNotExist"}, labels)
    assert not sch._expression_holds({"key": "c", "operator": "In", "values": ["x"]}, labels)
    assert sch._expression_holds({"key": "a", "operator": "Gt", "values": ["0"]}, labels)
    assert not sch._expression_holds({"key": "b", "operator": "Lt", "values": ["3"]}, labels)
    pod = sch.PodTemplate(
        "DaemonSet x/y (test)",
        "DaemonSet",
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "b", "operator": "In", "values": ["y"]}]},
                            {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
                        ]
                    }
                }
            }
        },
    )
    group = sch.NodeGroup("g", labels, (), {})
    assert sch.why_not(pod, group) is None  # terms are ORed
    assert "b In ['y']" in (sch.why_not(pod, sch.NodeGroup("g", {"b": "x"}, (), {})) or "")

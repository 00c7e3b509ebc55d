"""Kueue topology-aware scheduling (settings `topology`, config/topology.py, k8s/kueue.py): a
Topology of EKS's network-node-layer labels, the GPU flavor's topologyName, and the RayJob's worker
pod template annotation, each validated against the CRDs the pinned charts render. Only where the
GPU type has EC2 instance-topology data."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest

from config.loader import environment_names, load_settings
from config.topology import FOUR_LAYERS, THREE_LAYERS, network_layers
from k8s import kueue as queues
from tests import chart_render
from tests.chart_render import P5_NODES, crd_errors, variant
from tests.kueue_crds import kueue_errors, schema

P6_NODES = {**P5_NODES, "instance_type": "p6-b200.48xlarge"}


def p5(placement: str = "preferred", **topology: Any):
    return variant("prod", gpu_nodes=P5_NODES, topology={"placement": placement, **topology})


def kinds(settings) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for obj in queues.queue_objects(settings):
        found.setdefault(obj["kind"], []).append(obj)
    return found


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param(lambda: p5("preferred"), id="p5-preferred"),
        pytest.param(lambda: p5("required", layer=2), id="p5-required-layer-2"),
        pytest.param(
            lambda: variant("prod", gpu_nodes=P6_NODES, topology={"placement": "required"}), id="p6-b200"
        ),
    ],
)
def test_topology_objects_pass_the_crds(settings):
    s = settings()
    for obj in queues.queue_objects(s):
        assert kueue_errors(obj) == [], (obj["kind"], obj["metadata"]["name"])
    (topology,) = kinds(s)["Topology"]
    layers = network_layers(s.gpu_nodes.instance_type)
    assert [lv["nodeLabel"] for lv in topology["spec"]["levels"]] == [
        *(f"topology.k8s.aws/network-node-layer-{i}" for i in range(1, layers + 1)),
        "kubernetes.io/hostname",
    ]
    _, gpu = queues.resource_flavors(s)
    assert gpu["spec"]["topologyName"] == topology["metadata"]["name"] == f"aws-network-{layers}"
    # Every ClusterQueue asks for the flavor that has the topology, with the provisioning check on it.
    for cq in kinds(s)["ClusterQueue"]:
        flavors = [f["name"] for f in cq["spec"]["resourceGroups"][0]["flavors"]]
        assert flavors == [queues.SYSTEM_FLAVOR, gpu["metadata"]["name"]]
        (check,) = cq["spec"]["admissionChecksStrategy"]["admissionChecks"]
        assert check["onFlavors"] == [gpu["metadata"]["name"]]


@pytest.mark.parametrize("env", [*environment_names(), "example"])
def test_no_topology_where_the_settings_ask_for_none(env):
    s = load_settings(env)
    assert "Topology" not in kinds(s)
    assert "topologyName" not in queues.resource_flavors(s)[1]["spec"]


def test_the_crd_check_refuses_a_topology_the_api_server_would():
    topology = copy.deepcopy(kinds(p5())["Topology"][0])
    levels = topology["spec"]["levels"]
    levels.insert(0, levels.pop())  # hostname not last: a CEL rule
    assert any("kubernetes.io/hostname" in e or "hostname" in e for e in kueue_errors(topology)), (
        kueue_errors(topology)
    )
    topology["spec"]["levels"] = []
    assert kueue_errors(topology)


def _transition_errors(kind: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The transition rules (those naming oldSelf) under `spec` that an update from `old` to `new`
    breaks, each evaluated where the schema puts it, as the API server does on an update."""

    def walk(node_schema: dict[str, Any], before: Any, after: Any) -> list[str]:
        errors = []
        for rule in node_schema.get("x-kubernetes-validations", []):
            if "oldSelf" not in rule["rule"]:
                continue
            env = celpy.Environment()
            result = env.program(env.compile(rule["rule"])).evaluate(
                {"self": celpy.json_to_cel(after), "oldSelf": celpy.json_to_cel(before)}
            )
            if result is not True and result != celpy.celtypes.BoolType(True):
                errors.append(rule.get("message", rule["rule"]))
        if isinstance(before, dict) and isinstance(after, dict):
            for key, sub in node_schema.get("properties", {}).items():
                if key in before and key in after:
                    errors += walk(sub, before[key], after[key])
        return errors

    return walk(schema(kind)["properties"]["spec"], old["spec"], new["spec"])


def test_turning_placement_on_or_off_never_updates_a_flavor_the_crd_freezes():
    off = variant("prod", gpu_nodes=P5_NODES)
    on = p5()
    old_flavors = {f["metadata"]["name"]: f for f in queues.resource_flavors(off)}
    new_flavors = {f["metadata"]["name"]: f for f in queues.resource_flavors(on)}
    for before, after in ((old_flavors, new_flavors), (new_flavors, old_flavors)):
        for name in before.keys() & after.keys():
            assert _transition_errors("ResourceFlavor", before[name], after[name]) == [], name
    # The check would catch it: the same flavor name losing its topology is refused.
    tas = new_flavors[queues.gpu_flavor_name(on)]
    plain = copy.deepcopy(tas)
    del plain["spec"]["topologyName"]
    assert _transition_errors("ResourceFlavor", tas, plain)


def test_topology_names_follow_the_layer_count_so_levels_never_change_in_place():
    p5_topology = kinds(p5())["Topology"][0]
    p6_topology = kinds(variant("prod", gpu_nodes=P6_NODES, topology={"placement": "preferred"}))["Topology"][
        0
    ]
    assert p5_topology["metadata"]["name"] != p6_topology["metadata"]["name"]
    # Levels are immutable: the same name with other levels would be refused.
    assert _transition_errors("Topology", p5_topology, {**p5_topology, "spec": p6_topology["spec"]})


def test_the_rayjob_asks_kueue_to_place_its_workers_and_passes_kuberays_crd():
    s = p5("required", layer=2)
    rendered = chart_render.render(s.for_team(s.deploy_team.name))
    (job,) = [o for o in rendered if o["kind"] == "RayJob"]
    assert crd_errors(job) == []
    cluster = job["spec"]["rayClusterSpec"]
    (worker,) = cluster["workerGroupSpecs"]
    assert worker["template"]["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-required-topology": "topology.k8s.aws/network-node-layer-2"
    }
    # The head and the submitter (system flavor, no topology) ask for nothing.
    assert "annotations" not in cluster["headGroupSpec"]["template"]["metadata"]
    assert "annotations" not in job["spec"]["submitterPodTemplate"]["metadata"]


def test_the_shipped_jobs_carry_no_topology_annotation():
    for env in environment_names():
        for job in [o for o in chart_render.rendered(env) if o["kind"] == "RayJob"]:
            (worker,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
            assert "annotations" not in worker["template"]["metadata"], env


def test_topology_types_are_the_ec2_lists():
    # EC2 User Guide, "Prerequisites for Amazon EC2 topology" (config/topology.py): g6 is not there,
    # g6e is; p6-b200 and p6-b300 describe four layers.
    assert "g6.12xlarge" not in THREE_LAYERS | FOUR_LAYERS
    assert {"g6e.12xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "trn2.48xlarge"} <= THREE_LAYERS
    assert {"p6-b200.48xlarge", "p6-b300.48xlarge"} == FOUR_LAYERS

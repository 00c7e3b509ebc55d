"""What Kueue needs from the rest of the file (config/settings/queueing.py): the jobs' start budget
above Kueue's ready timeout, room on the system nodes for every admitted job's head and submitter,
and topology-aware placement only where the GPU type has EC2 topology data. One line each, naming
the field."""

from __future__ import annotations

import json

import pytest
from ruamel.yaml import YAML

from config.catalogue import CATALOGUE
from config.loader import SettingsError, environment_names, environments_dir, load_settings, parse_settings
from config.names import SUBMITTER_CPU_MILLIS, SUBMITTER_MEMORY_MIB
from config.settings.queueing import Placement, heads_per_system_node, jobs_at_once
from config.startup import PODS_READY_TIMEOUT_SECONDS, min_start_timeout_seconds
from config.topology import network_layers

P5 = {
    "instance_type": "p5.48xlarge",
    "capacity_reservation_id": "cr-0123456789abcdef0",
    "placement_group": False,
}
P6 = {**P5, "instance_type": "p6-b200.48xlarge"}


def data_of(env: str, **sections: dict) -> dict:
    data = YAML(typ="safe", pure=True).load((environments_dir() / f"{env}.yaml").read_text())
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return data


def parse(data: dict, env: str = "prod"):
    return parse_settings(json.dumps(data), name=env, source=f"config/environments/{env}.yaml")


def one_line_error(data: dict, env: str = "prod") -> str:
    with pytest.raises(SettingsError) as info:
        parse(data, env)
    message = str(info.value)
    assert "Traceback" not in message and len(message.strip().splitlines()) == 1, message
    return message


# --------------------------------------------------------------------------- start budget


@pytest.mark.parametrize("env", [*environment_names(), "example"])
def test_every_environments_start_budget_outlasts_kueues_timeout(env):
    assert (
        load_settings(env).job.start_timeout_seconds
        >= min_start_timeout_seconds()
        > PODS_READY_TIMEOUT_SECONDS
    )


def test_a_start_budget_kueue_would_outlast_is_refused_by_name():
    message = one_line_error(data_of("dev", job={"start_timeout_seconds": PODS_READY_TIMEOUT_SECONDS}), "dev")
    assert "job.start_timeout_seconds" in message and "waitForPodsReady" in message
    assert str(min_start_timeout_seconds()) in message
    parse(data_of("dev", job={"start_timeout_seconds": min_start_timeout_seconds()}), "dev")


def test_a_standing_cluster_job_is_not_queued_so_its_budget_is_its_own():
    data = data_of("dev", job={"cluster": "standing", "ttl_seconds_after_finished": 0,
                               "start_timeout_seconds": 600})  # fmt: skip
    data["cluster"]["job_submitter_principals"] = [
        a for t in data.pop("teams").values() for a in t["submitters"]
    ]
    assert parse(data, "dev").job.start_timeout_seconds == 600


# --------------------------------------------------------------------------- system headroom


def test_heads_per_node_is_what_allocatable_holds():
    s = load_settings("prod")
    node = CATALOGUE[s.system_nodes.instance_type]
    pair_cpu = s.workload.head_cpu_millis + SUBMITTER_CPU_MILLIS
    pair_mem = s.workload.head_memory_mib + SUBMITTER_MEMORY_MIB
    per_node = heads_per_system_node(s)
    assert per_node * pair_cpu <= node.allocatable_cpu_millis() < (per_node + 1) * pair_cpu or (
        per_node * pair_mem <= node.allocatable_memory_mib() < (per_node + 1) * pair_mem
    )
    assert jobs_at_once(s) == s.gpu_nodes.max_size


def test_system_nodes_too_few_for_every_admitted_jobs_head_are_refused_by_name():
    # prod: 4 GPU nodes, so up to 4 queued jobs at once, one head + submitter per m7i.xlarge.
    message = one_line_error(data_of("prod", system_nodes={"max_size": 3}))
    assert message.startswith("config/environments/prod.yaml: system_nodes.max_size: 3 m7i.xlarge")
    assert "4 jobs can run at once" in message and "raise it to 4" in message
    # A larger type holds more heads per node: 3 nodes are then enough.
    parse(data_of("prod", system_nodes={"max_size": 3, "instance_type": "m7i.2xlarge"}))


def test_a_head_larger_than_any_system_node_names_the_type():
    # The head fits a node, the head and the submitter together do not.
    message = one_line_error(data_of("dev", workload={"head_cpu_millis": 3700}), "dev")
    assert "dev.yaml: system_nodes.instance_type: " in message and "0 per node" in message
    assert "use a larger system_nodes.instance_type" in message


# --------------------------------------------------------------------------- topology


def test_topology_is_off_by_default_and_g6_carries_none():
    for env in [*environment_names(), "example"]:
        s = load_settings(env)
        assert s.topology.placement is Placement.NONE
        assert s.topology.worker_annotations(s.gpu_nodes.instance_type) == {}


@pytest.mark.parametrize("placement", ["preferred", "required"])
def test_topology_on_a_type_without_ec2_topology_data_is_refused_by_name(placement):
    assert network_layers("g6.12xlarge") == 0
    message = one_line_error(data_of("dev", topology={"placement": placement}), "dev")
    assert message.startswith("config/environments/dev.yaml: topology.placement: ")
    assert "g6.12xlarge has no EC2 instance-topology data" in message and "p5.48xlarge" in message


def test_a_layer_the_type_does_not_have_is_refused():
    message = one_line_error(data_of("prod", gpu_nodes=P5, topology={"placement": "required", "layer": 4}))
    assert "topology.layer: 4: p5.48xlarge has 3 network layers" in message
    parse(data_of("prod", gpu_nodes=P6, topology={"placement": "required", "layer": 4}))


def test_unknown_placement_is_refused_with_the_valid_ones():
    message = one_line_error(data_of("prod", gpu_nodes=P5, topology={"placement": "compact"}))
    assert "topology.placement" in message and "preferred" in message


@pytest.mark.parametrize(
    ("nodes", "topology", "annotations"),
    [
        (P5, {"placement": "preferred"},
         {"kueue.x-k8s.io/podset-preferred-topology": "topology.k8s.aws/network-node-layer-3"}),
        (P5, {"placement": "required", "layer": 2},
         {"kueue.x-k8s.io/podset-required-topology": "topology.k8s.aws/network-node-layer-2"}),
        (P6, {"placement": "preferred"},
         {"kueue.x-k8s.io/podset-preferred-topology": "topology.k8s.aws/network-node-layer-4"}),
    ],
)  # fmt: skip
def test_the_worker_annotation_names_the_layer(nodes, topology, annotations):
    s = parse(data_of("prod", gpu_nodes=nodes, topology=topology))
    assert s.topology.worker_annotations(s.gpu_nodes.instance_type) == annotations

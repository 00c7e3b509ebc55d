"""`raytrain verify`'s GPU node checks on a Spot group of several types (gpu_nodes.instance_types):
a node of any listed type passes, with the EFA devices the group's launch template attaches."""

from __future__ import annotations

import json
from typing import Any

from config.loader import parse_settings
from config.names import GPU_NODE_LABELS
from raytrain.verify.checks import FAIL, INSTANCE_TYPE_LABEL, PASS, ZONE_LABEL
from raytrain.verify.nodes import check_nodes
from tests.test_spot_group import SOURCE, TYPES, h200_spot_data


class Nodes:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def nodes(self) -> list[dict[str, Any]]:
        return self.items


def node(name: str, itype: str, efa: int) -> dict[str, Any]:
    resources = {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": str(efa)}
    return {
        "metadata": {"name": name,
                     "labels": {**GPU_NODE_LABELS, INSTANCE_TYPE_LABEL: itype, ZONE_LABEL: "us-east-2c"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": resources,
                   "capacity": resources},
    }  # fmt: skip


def test_a_node_of_each_listed_type_passes_and_another_type_fails() -> None:
    settings = parse_settings(json.dumps(h200_spot_data()), name="h200-spot", source=SOURCE)
    checks: list[Any] = []
    api = Nodes([node("a", TYPES[0], 16), node("b", TYPES[1], 16), node("c", "p5.48xlarge", 16)])
    check_nodes(api, settings, checks)  # type: ignore[arg-type]
    by_node = {c.subject: c for c in checks if c.name == "GPU node"}
    assert by_node["a"].result == by_node["b"].result == PASS, by_node
    assert by_node["c"].result == FAIL
    assert f"instance type p5.48xlarge, settings say {' or '.join(TYPES)}" in by_node["c"].detail
    # p5e with all 32 of its EFA devices would mean a launch template other than the group's 16.
    checks = []
    check_nodes(Nodes([node("d", "p5e.48xlarge", 32)]), settings, checks)  # type: ignore[arg-type]
    (row,) = [c for c in checks if c.name == "GPU node"]
    assert row.result == FAIL and "vpc.amazonaws.com/efa 32, catalogue 16" in row.detail

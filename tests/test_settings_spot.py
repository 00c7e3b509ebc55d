"""gpu_nodes.instance_types: a Spot group of several types (config/gpu_group.py), refused by name when
they cannot share one node group, and what the group offers as one type."""

from __future__ import annotations

import dataclasses

import pytest

from config.catalogue import CATALOGUE
from tests.test_settings import dev_data, error_of, parse

H200 = ["p5e.48xlarge", "p5en.48xlarge"]


def spot_group(types: list[str], **gpu: object) -> dict:
    data = dev_data()
    nodes = {k: v for k, v in data["gpu_nodes"].items() if k != "instance_type"}
    data["gpu_nodes"] = {**nodes, "capacity_type": "SPOT", "instance_types": types, **gpu}
    return data


def test_a_single_type_means_what_instance_type_means() -> None:
    data = dev_data()
    plain = parse(data).gpu_nodes
    listed = parse(spot_group([plain.instance_type], capacity_type="ON_DEMAND")).gpu_nodes
    assert listed.types == plain.types == [plain.instance_type]
    assert listed.instance == plain.instance == CATALOGUE[plain.instance_type]


def test_h200_types_share_a_spot_group_with_the_efa_interfaces_both_have() -> None:
    gpu = parse(spot_group(H200)).gpu_nodes
    assert gpu.instance_type == "p5e.48xlarge" and gpu.types == H200
    group = gpu.instance
    p5e, p5en = CATALOGUE["p5e.48xlarge"], CATALOGUE["p5en.48xlarge"]
    # p5en has 16 cards, p5e 32: the launch template carries 16, valid on both.
    assert group.efa_interfaces == p5en.efa_interfaces == 16
    assert group.efa_interface_layout() == p5en.efa_interface_layout() == p5e.efa_interface_layout()[:16]
    # p5e on half its cards: half its bandwidth; p5en's pod count leaves the least allocatable memory.
    assert group.network_gbps == p5e.network_gbps / 2
    assert group.allocatable_memory_mib() == min(p5e.allocatable_memory_mib(), p5en.allocatable_memory_mib())
    # The order is the user's: the first type names the group.
    assert parse(spot_group(H200[::-1])).gpu_nodes.instance.name == "p5en.48xlarge"


def test_types_with_another_gpu_are_refused_by_index_with_what_is_valid() -> None:
    message = error_of(spot_group(["p5e.48xlarge", "p5.48xlarge"]))
    assert (
        "gpu_nodes.instance_types[1]: p5.48xlarge has 8 x H100 80 GB, 192 vCPU, 2048 GiB where "
        "p5e.48xlarge has 8 x H200 141 GB, 192 vCPU, 2048 GiB; valid: p5en.48xlarge"
    ) in message
    assert message.count("\n") == 0, message


def test_a_different_gpu_count_is_refused() -> None:
    message = error_of(spot_group(["g6e.12xlarge", "g6e.48xlarge"]))
    assert "gpu_nodes.instance_types[1]: g6e.48xlarge has 8 x L40S 48 GB" in message
    # Nothing else in the catalogue has g6e.12xlarge's shape: said so, not an empty list.
    assert (
        "valid: no other type in config/catalogue.py has 4 x L40S 48 GB, 48 vCPU, 384 GiB and EFA" in message
    )


def test_a_type_without_efa_is_refused_when_efa_is_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # A type EC2 does not sell: p5en's shape without EFA, to reach the EFA rule alone.
    fake = dataclasses.replace(
        CATALOGUE["p5en.48xlarge"], name="p5x.48xlarge", efa_interfaces=0, network_cards=1
    )
    monkeypatch.setitem(CATALOGUE, fake.name, fake)
    message = error_of(spot_group(["p5e.48xlarge", fake.name]))
    assert (
        "gpu_nodes.instance_types[1]: p5x.48xlarge has no EFA where p5e.48xlarge has 32 (efa is true)"
        in message
    )
    assert "valid: p5en.48xlarge" in message
    # Without EFA the same group is one (the placement group and transport follow efa: false).
    assert parse(spot_group(["p5e.48xlarge", fake.name], efa=False)).gpu_nodes.instance.efa_interfaces == 0


def test_efa_interfaces_on_other_cards_or_indices_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # EFA with ENA at device index 1 on the second card where p5e takes EFA-only at index 0.
    fake = dataclasses.replace(CATALOGUE["p5en.48xlarge"], name="p5y.48xlarge", efa_only=False)
    monkeypatch.setitem(CATALOGUE, fake.name, fake)
    message = error_of(spot_group(["p5e.48xlarge", fake.name]))
    assert "gpu_nodes.instance_types[1]: p5y.48xlarge's EFA interfaces" in message
    assert "one launch template cannot carry both" in message


@pytest.mark.parametrize("capacity", ["ON_DEMAND", "CAPACITY_BLOCK"])
def test_several_types_are_for_spot_only(capacity: str) -> None:
    extra = {"capacity_reservation_id": "cr-0123456789abcdef0", "placement_group": False}
    data = spot_group(H200, capacity_type=capacity, **(extra if capacity == "CAPACITY_BLOCK" else {}))
    message = error_of(data)
    assert f"gpu_nodes.instance_types: lists 2 types but capacity_type is {capacity}" in message


def test_a_type_listed_twice_or_contradicting_instance_type_is_refused() -> None:
    assert "gpu_nodes.instance_types[2]: p5e.48xlarge is listed twice" in error_of(
        spot_group([*H200, "p5e.48xlarge"])
    )
    message = error_of(spot_group(H200, instance_type="p5en.48xlarge"))
    assert (
        "gpu_nodes.instance_type: 'p5en.48xlarge' differs from instance_types[0] ('p5e.48xlarge')" in message
    )
    assert "gpu_nodes.instance_types: List should have at least 1 item" in error_of(spot_group([]))

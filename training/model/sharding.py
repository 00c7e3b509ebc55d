"""How the ranks are split into FSDP's shard groups, without torch: the loop builds its device
mesh from it (training.model.build.make_mesh) and the memory plan sizes one rank's share from it."""

from __future__ import annotations


def mesh_shape(sharding: str, world: int, local_world: int) -> tuple[int, ...]:
    """(world,) for full sharding; (nodes, per node) for HSDP: replicate across nodes, shard inside.

    auto picks HSDP with more than one node of several GPUs each: the per-layer all-gathers and
    reduce-scatters then stay on the node's NVLink or PCIe and only one gradient all-reduce per step
    crosses the slower inter-node network. (For Qwen2.5-1.5B on two g6.12xlarge, one 5 GB/s EFA
    interface each, per step through a node's NIC: 1.24 s of HSDP all-reduce; full sharding 1.62 s
    with parameters kept gathered, 2.16 s freed. The step-time model, which also weighs what each
    can hide behind, predicts full sharding 1.03-1.11x there with parameters kept: unmeasured, and
    HSDP stays: BENCHMARKS.md.) With one GPU per node HSDP is plain replication: the same bytes
    cross the network, and every GPU holds the whole model and optimizer state; measured over two
    emulated hosts it was 11 % slower with 8.6 GiB more per GPU (BENCHMARKS.md), so auto shards
    fully there.
    """
    nodes = world // local_world if local_world and world % local_world == 0 else 1
    if sharding == "hsdp" or (sharding == "auto" and nodes > 1 and local_world > 1):
        if world % local_world:
            raise ValueError(f"HSDP needs equal workers per node: {world} over {local_world}")
        return (world // local_world, local_world)
    return (world,)


def shard_group(sharding: str, world: int, local_world: int) -> int:
    """Ranks each parameter is sharded over: the mesh's last dimension."""
    return mesh_shape(sharding, world, local_world)[-1]

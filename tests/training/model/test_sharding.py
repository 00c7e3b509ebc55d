"""The FSDP2 sharding plan: one unit per decoder layer, then the root holding the tied weights."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from training.model.build import (
    apply_fsdp,
    build_model,
    make_mesh,
    mesh_shape,
    shape_config,
    sharding_plan,
)


def test_plan_for_qwen25_15b_on_meta() -> None:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape_config("qwen2.5-1.5b"))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    plan = sharding_plan(model)
    assert [u for u, _ in plan] == [f"model.layers.{i}" for i in range(28)] + [""]
    root = dict(plan)[""]
    assert sorted(root) == ["model.embed_tokens.weight", "model.norm.weight"]
    owned = [n for _, names in plan for n in names]
    assert len(owned) == len(set(owned))  # every parameter in exactly one unit
    assert {n for n, _ in model.named_parameters()} == set(owned)


def test_fully_shard_keeps_tied_weights_in_root(single_rank_group: None) -> None:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    model = build_model("random", "tiny", "", seed=0)
    mesh = make_mesh("cpu", "full", world=1, local_world=1)
    apply_fsdp(model, mesh)
    assert isinstance(model, FSDPModule)
    assert all(isinstance(layer, FSDPModule) for layer in model.model.layers)
    assert not isinstance(model.model.embed_tokens, FSDPModule)
    assert not isinstance(model.lm_head, FSDPModule)
    # Still one tensor after sharding: the embedding and lm_head are gathered together, once.
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert isinstance(model.lm_head.weight, DTensor)

    def group_params(module: FSDPModule) -> set[int]:
        state = module._get_fsdp_state()
        group = state._fsdp_param_group
        return {id(p.sharded_param) for p in group.fsdp_params} if group else set()

    tied = id(model.lm_head.weight)
    assert tied in group_params(model)
    assert all(tied not in group_params(layer) for layer in model.model.layers)

    ids = torch.randint(0, 257, (2, 32))
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    assert model.lm_head.weight.grad is not None
    assert torch.isfinite(loss)


def test_hsdp_mesh_is_two_dimensional(single_rank_group: None) -> None:
    mesh = make_mesh("cpu", "hsdp", world=1, local_world=1)
    assert mesh.mesh_dim_names == ("replicate", "shard")
    assert make_mesh("cpu", "auto", world=1, local_world=1).mesh_dim_names == ("shard",)


@pytest.mark.parametrize(
    ("sharding", "world", "local", "shape"),
    [
        ("auto", 8, 8, (8,)),  # one node: plain FSDP
        ("auto", 8, 4, (2, 4)),  # two nodes: shard inside each, replicate across
        ("auto", 2, 1, (2,)),  # one GPU per node: HSDP would only replicate (BENCHMARKS.md)
        ("hsdp", 2, 1, (2, 1)),  # asked for explicitly: replication it is
        ("full", 8, 4, (8,)),
        ("hsdp", 16, 8, (2, 8)),
        ("hsdp", 4, 4, (1, 4)),
    ],
)
def test_mesh_shape(sharding: str, world: int, local: int, shape: tuple[int, ...]) -> None:
    assert mesh_shape(sharding, world, local) == shape


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hsdp_step(rank: int, world: int, port: int, out: str) -> None:
    """One rank of a (2 hosts x 1 rank) HSDP run: one step on rank-specific tokens."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = build_model("random", "tiny", "", seed=0)
        mesh = make_mesh("cpu", "hsdp", world=world, local_world=1)
        apply_fsdp(model, mesh, mixed_precision=False)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        ids = torch.randint(0, 264, (2, 32), generator=torch.Generator().manual_seed(100 + rank))
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        state = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
        torch.save({"mesh": tuple(mesh.shape), "state": state}, f"{out}/rank{rank}.pt")
        dist.barrier()  # both ranks leave together (a gloo peer torn down early can abort the other)
    finally:
        dist.destroy_process_group()


def test_hsdp_replicas_stay_identical_after_a_step(tmp_path: Path) -> None:
    """With one rank per host, HSDP is pure replication: the gradient all-reduce across the
    replicate dimension must leave both replicas with the same weights although each saw other
    tokens, and they must differ from the initial weights."""
    import torch.multiprocessing as mp

    mp.start_processes(_hsdp_step, args=(2, _free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["mesh"] == r1["mesh"] == (2, 1)
    init = dict(build_model("random", "tiny", "", seed=0).named_parameters())
    for name, w0 in r0["state"].items():
        assert torch.equal(w0, r1["state"][name]), name
    assert any(not torch.equal(w, init[n].detach()) for n, w in r0["state"].items())

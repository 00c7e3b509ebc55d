"""The FSDP2 sharding plan: one unit per decoder layer (or per N consecutive layers), then the root
holding the tied weights."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from training.model import (
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


@pytest.mark.parametrize(
    ("unit_layers", "labels"),
    [
        (4, [f"model.layers.{i}-{i + 3}" for i in range(0, 28, 4)]),
        (3, [f"model.layers.{i}-{i + 2}" for i in range(0, 27, 3)] + ["model.layers.27"]),
        (28, ["model.layers.0-27"]),
        (40, ["model.layers.0-27"]),
    ],
)
def test_plan_groups_consecutive_layers(unit_layers: int, labels: list[str]) -> None:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape_config("qwen2.5-1.5b"))
    plan = sharding_plan(model, unit_layers)
    assert [u for u, _ in plan] == [*labels, ""]
    owned = [n for _, names in plan for n in names]
    assert len(owned) == len(set(owned))
    assert {n for n, _ in model.named_parameters()} == set(owned)
    per_layer = [n for u, names in sharding_plan(model) if u for n in names]
    assert [n for u, names in plan if u for n in names] == per_layer  # same names, same order


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


def _grouped_step(rank: int, world: int, port: int, out: str) -> None:
    """One rank of a 2-rank full-sharding run: two accumulated micro-batches and one optimizer step,
    with one FSDP unit per layer and with units of two and of three layers, from the same weights."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        from torch.distributed.fsdp import FSDPModule

        results = {}
        for unit_layers in (1, 2, 3):
            model = build_model("random", "tiny", "", seed=0)
            mesh = make_mesh("cpu", "full", world=world, local_world=world)
            apply_fsdp(model, mesh, mixed_precision=False, unit_layers=unit_layers)
            groups = {
                id(layer._get_fsdp_state()._fsdp_param_group)
                for layer in model.model.layers
                if isinstance(layer, FSDPModule)
            }
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            gen = torch.Generator().manual_seed(100 + rank)
            losses = []
            for mb in range(2):
                model.set_requires_gradient_sync(mb == 1)
                ids = torch.randint(0, 264, (2, 32), generator=gen)
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
                loss.backward()
                losses.append(loss.detach())
            grads = {n: p.grad.full_tensor().clone() for n, p in model.named_parameters()}
            opt.step()
            state = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
            results[unit_layers] = {"groups": len(groups), "losses": losses, "grads": grads, "state": state}
        torch.save(results, f"{out}/rank{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_layers_grouped_into_units_train_as_one_per_layer(tmp_path: Path) -> None:
    """Units of several layers (one all-gather and reduce-scatter for all of them) give the same
    losses, gradients and updated weights as a unit per layer, accumulation included; the tiny
    shape's 4 layers make 4, 2 and 2 (3 + 1) parameter groups."""
    import torch.multiprocessing as mp

    mp.start_processes(_grouped_step, args=(2, _free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in (0, 1):
        r = torch.load(tmp_path / f"rank{rank}.pt")
        assert [r[k]["groups"] for k in (1, 2, 3)] == [4, 2, 2]
        for k in (2, 3):
            for a, b in zip(r[1]["losses"], r[k]["losses"], strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
            for name, g in r[1]["grads"].items():
                torch.testing.assert_close(r[k]["grads"][name], g, rtol=1e-6, atol=1e-7, msg=name)
            for name, w in r[1]["state"].items():
                torch.testing.assert_close(r[k]["state"][name], w, rtol=1e-6, atol=1e-7, msg=name)

"""Sharded checkpoints with torch.distributed.checkpoint (DCP).

Layout of one checkpoint folder (the ranks' local folders are merged by ray.train.report):
  .metadata, __<rank>_0.distcp   DCP: model and optimizer shards, plus step and data position
  rng-rank<r>.pt                 each rank's RNG states (restored when the worker count is the same)
  train_state.json               rank 0: step, data position, worker count, metric history
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

STATE_FILE = "train_state.json"


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def save(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    position: int,
    extra: dict[str, Any] | None = None,
) -> None:
    """Collective: every rank writes its own shards into its own `path`."""
    os.makedirs(path, exist_ok=True)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {
        "model": model_sd,
        "optim": optim_sd,
        "train": {"step": torch.tensor(step), "position": torch.tensor(position)},
    }
    dcp.save(state, checkpoint_id=path)
    rank = dist.get_rank()
    torch.save(rng_state(), os.path.join(path, f"rng-rank{rank}.pt"))
    if rank == 0:
        meta = {"step": step, "position": position, "world_size": dist.get_world_size()}
        meta.update(extra or {})
        with open(os.path.join(path, STATE_FILE), "w") as f:
            json.dump(meta, f)


def load(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Collective: load shards for this rank's layout (DCP reshards when the worker count differs).

    Returns train_state.json with the step and data position from the DCP state.
    """
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {
        "model": model_sd,
        "optim": optim_sd,
        "train": {"step": torch.tensor(0), "position": torch.tensor(0)},
    }
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=StateDictOptions(strict=True),
    )
    with open(os.path.join(path, STATE_FILE)) as f:
        meta: dict[str, Any] = json.load(f)
    meta["step"] = int(state["train"]["step"])
    meta["position"] = int(state["train"]["position"])
    rng_file = os.path.join(path, f"rng-rank{dist.get_rank()}.pt")
    if meta.get("world_size") == dist.get_world_size() and os.path.exists(rng_file):
        set_rng_state(torch.load(rng_file, weights_only=False))
        meta["rng_restored"] = True
    else:
        meta["rng_restored"] = False
    return meta


def full_model_state(path: str) -> dict[str, torch.Tensor]:
    """The unsharded model weights of a checkpoint folder, read without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "full.pt")
        dcp_to_torch_save(path, out)
        sd = torch.load(out, weights_only=False)
    return dict(sd["model"])

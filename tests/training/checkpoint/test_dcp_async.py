"""DCP's asynchronous save as the loop uses it (training/checkpoint/dcp.py AsyncSaver), on 2 gloo ranks:
the checkpoint holds the state of the step it was started at even though training changes the weights
while it is written, loads back bitwise, and a write that fails surfaces in its future."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from tests.training.checkpoint.test_dcp import (
    _assert_same,
    _full,
    _load_worker,
    _merge,
    _setup,
    _teardown,
    _train_once,
)
from training.checkpoint import dcp as checkpoint


def _async_worker(rank: int, world: int, init_file: str, out: str) -> None:
    model, opt = _setup(rank, world, init_file)
    saver = checkpoint.AsyncSaver(on_gpu=False)
    _train_once(model, opt, rank)
    # A copy: the full state dict shares tensors with the live state (the optimizer's step counter).
    reference = copy.deepcopy(_full(model, opt))
    where = os.path.join(out, f"rank{rank}")
    future = saver.start(where, model, opt, step=5, position=40, extra={"history": []})
    _train_once(model, opt, rank)  # changes what was staged: the checkpoint must not see it
    assert future.result() is not None
    changed = _full(model, opt)
    # A second save into a folder that cannot be written: the failure is the future's.
    blocked = os.path.join(out, f"blocked-rank{rank}")
    Path(blocked).write_text("a file where the folder should be")
    try:
        saver.start(os.path.join(blocked, "ckpt"), model, opt, step=6, position=48).result()
        failed: Any = None
    except Exception as exc:  # DCP's CheckpointException, or the folder's OSError before it starts
        failed = type(exc).__name__
    saver.close()
    if rank == 0:
        record = {"reference": reference, "changed": changed, "failed": failed}
        torch.save(record, os.path.join(out, "ref.pt"))
    _teardown()


def test_async_checkpoint_holds_its_own_step_and_loads_bitwise(tmp_path: Path) -> None:
    mp.spawn(_async_worker, args=(2, str(tmp_path / "init-save"), str(tmp_path)), nprocs=2, join=True)
    _merge(tmp_path, tmp_path / "ckpt")
    ref = torch.load(tmp_path / "ref.pt", weights_only=False)
    assert ref["failed"] is not None
    out = tmp_path / "loaded"
    out.mkdir()
    args = (2, str(tmp_path / "init-load"), str(tmp_path / "ckpt"), str(out))
    mp.spawn(_load_worker, args=args, nprocs=2, join=True)
    loaded = torch.load(out / "loaded.pt", weights_only=False)
    _assert_same(ref["reference"]["model"], loaded["full"]["model"])
    _assert_same(ref["reference"]["optim"], loaded["full"]["optim"])
    assert (loaded["meta"]["step"], loaded["meta"]["position"]) == (5, 40)
    some = next(iter(ref["changed"]["model"]))
    assert not torch.equal(ref["changed"]["model"][some], ref["reference"]["model"][some])

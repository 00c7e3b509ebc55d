"""DCP checkpoint round trip: sharded save on 2 ranks, load on 1 rank (resharded) and on 2 again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from training.checkpoint import dcp as checkpoint
from training.model.build import apply_fsdp, build_model, make_mesh

STEP, POSITION = 3, 48


def _setup(rank: int, world: int, init_file: str) -> tuple[Any, torch.optim.Optimizer]:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    model = build_model("random", "tiny", "", seed=0)
    apply_fsdp(model, make_mesh("cpu", "full", world, world))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def _teardown() -> None:
    # Both ranks leave together: a rank that tears gloo down while its peer still holds the pair
    # open can make the peer abort (SIGABRT seen once in CI's image stage, under load).
    dist.barrier()
    dist.destroy_process_group()


def _train_once(model: Any, opt: torch.optim.Optimizer, rank: int) -> None:
    ids = torch.randint(0, 257, (2, 32), generator=torch.Generator().manual_seed(rank))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    opt.step()
    opt.zero_grad()


def _full(model: Any, opt: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": msd, "optim": osd}


def _save_worker(rank: int, world: int, init_file: str, out: str) -> None:
    """Train one step on `world` ranks, save a checkpoint, keep the full state as the reference."""
    model, opt = _setup(rank, world, init_file)
    _train_once(model, opt, rank)
    # Each rank its own folder, as on Ray: ray.train.report merges them into one checkpoint.
    local = os.path.join(out, f"rank{rank}")
    checkpoint.save(local, model, opt, step=STEP, position=POSITION, extra={"history": []})
    full = _full(model, opt)
    if rank == 0:
        torch.save(full, os.path.join(out, "reference.pt"))
    _teardown()


def _load_worker(rank: int, world: int, init_file: str, ckpt: str, out: str) -> None:
    model, opt = _setup(rank, world, init_file)
    meta = checkpoint.load(ckpt, model, opt)
    full = _full(model, opt)
    if rank == 0:
        torch.save({"full": full, "meta": meta}, os.path.join(out, "loaded.pt"))
    torch.save(meta["read"], os.path.join(out, f"read-rank{rank}.pt"))
    _teardown()


def _merge(src: Path, dst: Path) -> None:
    dst.mkdir()
    for rank_dir in sorted(src.glob("rank*")):
        for f in rank_dir.iterdir():
            assert not (dst / f.name).exists(), f"{f.name} written by two ranks"
            f.rename(dst / f.name)


def _assert_same(a: Any, b: Any, path: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path  # bitwise, not approximately
    else:
        assert a == b, path


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("dcp")
    mp.spawn(_save_worker, args=(2, str(tmp / "init-save"), str(tmp)), nprocs=2, join=True)
    _merge(tmp, tmp / "ckpt")
    return tmp / "ckpt", torch.load(tmp / "reference.pt", weights_only=False)


def test_each_rank_writes_its_own_shard(saved: tuple[Path, dict[str, Any]]) -> None:
    ckpt, _ = saved
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == sorted(
        [".metadata", "__0_0.distcp", "__1_0.distcp", "rng-rank0.pt", "rng-rank1.pt",
         checkpoint.STATE_FILE]
    )  # fmt: skip


@pytest.mark.parametrize("world", [2, 1])
def test_round_trip_bitwise(saved: tuple[Path, dict[str, Any]], world: int, tmp_path: Path) -> None:
    """Same worker count restores RNG too; one worker reshards the two ranks' shards."""
    ckpt, ref = saved
    args = (world, str(tmp_path / "init"), str(ckpt), str(tmp_path))
    if world == 1 and not dist.is_initialized():
        _load_worker(0, *args)  # one rank: in this process, no start-up cost
    else:
        mp.spawn(_load_worker, args=args, nprocs=world, join=True)
    loaded = torch.load(tmp_path / "loaded.pt", weights_only=False)
    _assert_same(ref["model"], loaded["full"]["model"])
    _assert_same(ref["optim"], loaded["full"]["optim"])
    meta = loaded["meta"]
    assert (meta["step"], meta["position"], meta["world_size"]) == (STEP, POSITION, 2)
    assert meta["rng_restored"] is (world == 2)


def test_full_model_state_without_process_group(saved: tuple[Path, dict[str, Any]]) -> None:
    ckpt, ref = saved
    _assert_same(ref["model"], checkpoint.full_model_state(str(ckpt)))


def test_each_rank_reads_only_its_own_shards_on_resume(
    saved: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """Same worker count: a rank reads the DCP metadata, its own shard file, its RNG file and the
    state file, and of its shard only the byte ranges its load plan names; never the other rank's."""
    ckpt, _ = saved
    mp.spawn(_load_worker, args=(2, str(tmp_path / "init"), str(ckpt), str(tmp_path)), nprocs=2, join=True)
    total = sum(p.stat().st_size for p in ckpt.iterdir())
    for rank in (0, 1):
        read = torch.load(tmp_path / f"read-rank{rank}.pt", weights_only=False)
        files = read["files"]
        own, other = f"__{rank}_0.distcp", f"__{1 - rank}_0.distcp"
        assert {".metadata", own, f"rng-rank{rank}.pt", checkpoint.STATE_FILE} <= set(files), read
        assert f"rng-rank{1 - rank}.pt" not in files
        # Of the other rank's shards, at most the few replicated values DCP stored there once.
        assert files.get(other, 0) < 0.05 * (ckpt / other).stat().st_size, read
        assert files[own] > 0.9 * (ckpt / own).stat().st_size
        assert read["bytes"] == sum(files.values()) < 0.6 * total, (read, total)


def test_driver_reads_the_state_file_alone(saved: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """The summary needs train_state.json only; the shards may be unreadable to the driver."""
    import shutil

    import pyarrow.fs as pafs

    ckpt, _ = saved
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    for f in copy.iterdir():
        if f.name != checkpoint.STATE_FILE:
            f.write_bytes(b"")  # nothing to read there: a download of them would be noticed as empty
            f.chmod(0)
    state = checkpoint.read_state(pafs.LocalFileSystem(), str(copy))
    assert (state["step"], state["position"], state["world_size"]) == (STEP, POSITION, 2)

"""Sharded checkpoints with torch.distributed.checkpoint (DCP).

Layout of one checkpoint folder (the ranks' local folders are merged by ray.train.report):
  .metadata, __<rank>_0.distcp   DCP: model and optimizer shards, plus step and data position
  rng-rank<r>.pt                 each rank's RNG states (restored when the worker count is the same)
  train_state.json               rank 0: step, data position, worker count, metric history
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from training.common.errors import CheckpointError

STATE_FILE = "train_state.json"
# What a checkpoint holds of the model: the parameters that train. A LoRA run's frozen base is not
# saved (it is the --model it started from, loaded again on resume and at export); a full
# fine-tune has no frozen parameters, so this is all of them.
TRAINED = StateDictOptions(ignore_frozen_params=True)


def _trained_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], Any]:
    """(model state, optimizer state) of the parameters that train. ignore_frozen_params misses a
    frozen lm_head tied to the embedding (torch lists the shared tensor under both names, but
    named_parameters, which decides what is frozen, under one), so the names are filtered too."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=TRAINED)
    if not all(p.requires_grad for p in model.parameters()):
        trained = {n for n, p in model.named_parameters() if p.requires_grad}
        model_sd = {k: v for k, v in model_sd.items() if k in trained}
    return model_sd, optim_sd


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _save_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, position: int
) -> dict[str, Any]:
    model_sd, optim_sd = _trained_state(model, optimizer)
    return {
        "model": model_sd,
        "optim": optim_sd,
        "train": {"step": torch.tensor(step), "position": torch.tensor(position)},
    }


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
    dcp.save(_save_state(model, optimizer, step, position), checkpoint_id=path)
    _save_small_files(path, step, position, extra)


class AsyncSaver:
    """DCP's asynchronous save (torch 2.13: torch/distributed/checkpoint/state_dict_saver.py
    async_save; staging.py DefaultStager): the step waits only while the trained state is copied off
    the GPU into pinned host memory (kept between saves, so only the first save allocates it); the
    files are written by a thread beside training. DCP's async save coordinates the ranks on a
    process group with a CPU backend: a gloo group of its own (as torchtitan does), beside NCCL on
    GPUs, and beside the training's own gloo group on CPUs (two threads' collectives on one gloo
    group interleave and corrupt each other's messages)."""

    def __init__(self, on_gpu: bool) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.group = dist.new_group(backend="gloo")  # collective: every rank, in the same order
        # Pinned memory and non-blocking copies on the GPU; the copy itself is waited for (the next
        # optimizer step must not change what is being copied). No shared memory: thread, not process.
        self.stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=on_gpu,
                use_shared_memory=False,
                use_async_staging=False,
                use_non_blocking_copy=on_gpu,
            )
        )

    def start(
        self,
        path: str,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        step: int,
        position: int,
        extra: dict[str, Any] | None = None,
    ) -> Any:
        """Collective: stage this rank's state and start writing it to `path`; returns the Future
        of the write (its result: DCP's metadata; its exception: the failed write)."""
        os.makedirs(path, exist_ok=True)
        _save_small_files(path, step, position, extra)  # small: before the write, under the same name
        state = _save_state(model, optimizer, step, position)
        return dcp.async_save(state, checkpoint_id=path, process_group=self.group, async_stager=self.stager)

    def close(self) -> None:
        self.stager.close()


def _save_small_files(path: str, step: int, position: int, extra: dict[str, Any] | None) -> None:
    rank = dist.get_rank()
    torch.save(rng_state(), os.path.join(path, f"rng-rank{rank}.pt"))
    if rank == 0:
        meta = {"step": step, "position": position, "world_size": dist.get_world_size()}
        meta.update(extra or {})
        with open(os.path.join(path, STATE_FILE), "w") as f:
            json.dump(meta, f)


class _CountingStream(io.RawIOBase):
    """A pyarrow input file as the seekable binary stream DCP reads; counts the bytes read."""

    def __init__(self, f: Any, counter: dict[str, Any], name: str) -> None:
        self._f, self._counter, self._name = f, counter, name
        counter["files"].setdefault(name, 0)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return int(self._f.seek(offset, whence))

    def tell(self) -> int:
        return int(self._f.tell())

    def read(self, size: int | None = -1) -> bytes:
        data = self._f.read() if size is None or size < 0 else self._f.read(size)
        self._counter["bytes"] += len(data)
        self._counter["files"][self._name] += len(data)
        return bytes(data)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


class ArrowFileSystem(FileSystemBase):
    """DCP's file-system interface over a pyarrow filesystem (Ray Train's storage: S3 on the
    cluster, local in tests), read-only. Files are opened for random access, so DCP's reads of
    a tensor's (offset, length) become ranged reads (S3: ranged GETs): a rank fetches only the
    bytes its load plan names, not whole files. `read` counts the bytes read, in all and per file.
    (DCP stores a replicated value once, in one rank's file: small reads of another rank's file
    for those are expected.)"""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self.read: dict[str, Any] = {"files": {}, "bytes": 0}  # files: name -> bytes read

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        if mode != "rb":
            raise ValueError(f"read-only checkpoint file system: mode {mode!r}")
        with self.fs.open_input_file(str(path)) as f:
            yield _CountingStream(f, self.read, os.path.basename(str(path)))

    def concat_path(self, path: str | os.PathLike, suffix: str) -> str:
        return f"{str(path).rstrip('/')}/{suffix}"

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        raise PermissionError("read-only checkpoint file system: reads only")

    def init_path(self, path: str | os.PathLike) -> str:
        return str(path)

    def mkdir(self, path: str | os.PathLike) -> None:
        raise PermissionError("read-only checkpoint file system: reads only")

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False  # chosen explicitly, never by DCP's inference

    def exists(self, path: str | os.PathLike) -> bool:
        import pyarrow.fs as pafs

        return bool(self.fs.get_file_info(str(path)).type != pafs.FileType.NotFound)

    def rm_file(self, path: str | os.PathLike) -> None:
        raise PermissionError("read-only checkpoint file system: reads only")

    def read_bytes(self, path: str) -> bytes:
        with self.create_stream(path, "rb") as stream:
            return stream.read()


class ArrowCheckpointReader(FileSystemReader):
    """torch's FileSystemReader reading straight from a pyarrow filesystem."""

    def __init__(self, fs: Any, path: str) -> None:
        super().__init__(path)
        self.arrow = ArrowFileSystem(fs)
        self.fs = self.arrow  # type: ignore[assignment]  # FileSystemReader's own is local-only
        self.path = self.arrow.init_path(path)
        self.metadata: Any = None

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        # DCP hands every rank the checkpoint's metadata here (state_dict_loader._load_state_dict):
        # kept to compare what was saved with what was asked for.
        self.metadata = metadata
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)


_RESHAPE_HINT = "train with the --model/--shape it was saved with, or start over under a new --run-name"


def _dcp_reason(exc: BaseException) -> str:
    """One line for a failed dcp.load. DCP raises CheckpointException (a BaseException) holding
    each rank's (exception, traceback) in `failures` (torch/distributed/checkpoint/api.py)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = failures[min(failures)]
        exc = first[0] if isinstance(first, tuple) else first
    text = " ".join(str(exc).split())
    if "Size mismatch" in text or "Missing key" in text:
        return f"it was saved by a model of another shape ({text}): {_RESHAPE_HINT}"
    return (
        f"it is incomplete or corrupt ({type(exc).__name__}: {text[:300]}): start over under a new --run-name"
    )


def _state_meta(files: ArrowFileSystem, path: str) -> dict[str, Any]:
    """train_state.json, checked: a CheckpointError naming the file when it is not usable."""
    where = files.concat_path(path, STATE_FILE)
    try:
        meta = json.loads(files.read_bytes(where))
    except FileNotFoundError:
        raise CheckpointError(
            f"checkpoint {path}: no {STATE_FILE} (not written by python -m training, or incomplete): "
            "start over under a new --run-name"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {path}: {STATE_FILE} is not valid JSON ({exc}): the checkpoint is corrupt; "
            "start over under a new --run-name"
        ) from None
    bad = [
        k
        for k in ("step", "position", "world_size")
        if not isinstance(meta.get(k) if isinstance(meta, dict) else None, int)
    ]
    if bad:
        raise CheckpointError(
            f"checkpoint {path}: {STATE_FILE} lacks integer {', '.join(bad)}: not a checkpoint of "
            "python -m training; start over under a new --run-name"
        )
    return dict(meta)


def read_state(filesystem: Any, path: str) -> dict[str, Any]:
    """train_state.json of a checkpoint (Ray: `checkpoint.filesystem`, `checkpoint.path`) alone."""
    return _state_meta(ArrowFileSystem(filesystem), path.rstrip("/"))


def load(
    path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, filesystem: Any = None
) -> dict[str, Any]:
    """Collective: load shards for this rank's layout (DCP reshards when the worker count differs).

    Reads from `filesystem` (pyarrow; local when None) directly: the DCP metadata, the byte
    ranges of the shards this rank's load plan names, this rank's RNG file and the state file,
    nothing else (no copy of the whole checkpoint on every node). Returns train_state.json with
    the step and data position from the DCP state, and `read`: the files and bytes this rank read.
    """
    model_sd, optim_sd = _trained_state(model, optimizer)
    state: dict[str, Any] = {
        "model": model_sd,
        "optim": optim_sd,
        "train": {"step": torch.tensor(0), "position": torch.tensor(0)},
    }
    if filesystem is None:
        import pyarrow.fs as pafs

        filesystem = pafs.LocalFileSystem()
    reader = ArrowCheckpointReader(filesystem, path)
    files = reader.arrow
    meta = _state_meta(files, path)
    where = f"checkpoint {path} (step {meta['step']})"
    wanted = {f"model.{k}" for k in model_sd}
    try:
        dcp.load(state, storage_reader=reader)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        raise CheckpointError(f"{where}: {_dcp_reason(exc)}") from None
    # DCP loads the keys asked for and ignores the rest: a checkpoint of a deeper model would
    # load into a shallower one without a word.
    saved = {k for k in reader.metadata.state_dict_metadata if k.startswith("model.")}
    if saved != wanted:
        extra, missing = sorted(saved - wanted), sorted(wanted - saved)
        diff = f"{len(extra)} saved parameters this model lacks (first {extra[0]})" if extra else ""
        diff += (", " if diff and missing else "") + (
            f"{len(missing)} parameters it lacks (first {missing[0]})" if missing else ""
        )
        raise CheckpointError(f"{where}: it was saved by a model of another shape ({diff}): {_RESHAPE_HINT}")
    try:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            # The frozen base (LoRA) is not in the checkpoint: strict would ask for it. The keys
            # were compared with what was saved just above.
            options=StateDictOptions(
                strict=all(p.requires_grad for p in model.parameters()), ignore_frozen_params=True
            ),
        )
    except (KeyError, RuntimeError, ValueError) as exc:
        raise CheckpointError(f"{where}: {_dcp_reason(exc)}") from None
    meta["step"] = int(state["train"]["step"])
    meta["position"] = int(state["train"]["position"])
    rng_file = files.concat_path(path, f"rng-rank{dist.get_rank()}.pt")
    if meta.get("world_size") == dist.get_world_size() and files.exists(rng_file):
        try:
            rng = torch.load(io.BytesIO(files.read_bytes(rng_file)), weights_only=False)
            set_rng_state(rng)
        except Exception as exc:
            raise CheckpointError(
                f"{where}: {os.path.basename(rng_file)} is corrupt ({type(exc).__name__}: {exc}): "
                "start over under a new --run-name"
            ) from None
        meta["rng_restored"] = True
    else:
        meta["rng_restored"] = False
    meta["read"] = {"files": dict(sorted(files.read["files"].items())), "bytes": files.read["bytes"]}
    return meta


def full_model_state(path: str) -> dict[str, torch.Tensor]:
    """The unsharded model weights of a checkpoint folder, read without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "full.pt")
        dcp_to_torch_save(path, out)
        sd = torch.load(out, weights_only=False)
    return dict(sd["model"])

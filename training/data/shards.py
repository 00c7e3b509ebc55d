"""Prepared token shards: the on-disk format, its manifest, and reading blocks by position.

Layout under a prepared-data location (a local dir or any pyarrow URI, s3:// on the cluster):

  manifest.json                   written last: its presence means every shard it lists is complete
  shards-<fingerprint16>/00000.bin  raw little-endian uint32, no header: blocks of SEQ_LEN tokens

Block b of a shard starts at byte b·seq_len·4, so a reader needs nothing but the manifest to fetch
any block with one ranged read (or one memory-mapped slice). A block is exactly seq_len tokens,
the model's input: labels are the same ids (Hugging Face causal LMs shift them inside the loss), as
the in-memory packing did before. uint32 because vocabularies outgrow uint16 (Qwen2.5: 151,936).
Shards live in a folder named by the fingerprint, so preparing changed input never rewrites a
shard that a manifest written earlier (and a run reading it) still points to.

Chat (SFT) data (training/methods/sft.py) has format CHAT_FORMAT: beside each shard NAME.bin lies
NAME.flags, one uint8 per token at the same position: FLAG_TARGET marks a token the loss is taken
on (an assistant token: the model predicts it from the tokens before it), FLAG_START the first
token of a conversation (position ids restart there, so packed conversations do not attend to each
other). A reader of the text format refuses the chat format by its version, never ignoring masks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from training.common.errors import InputError

FORMAT = "raytrain-token-shards/1"
CHAT_FORMAT = "raytrain-token-shards/2"  # FORMAT plus a .flags file beside every shard
FORMATS = (FORMAT, CHAT_FORMAT)
FLAGS_SUFFIX = ".flags"
FLAG_TARGET = 1
FLAG_START = 2
MANIFEST = "manifest.json"
DTYPE = np.dtype("<u4")
TOKEN_BYTES = DTYPE.itemsize


class ShardError(InputError, ValueError):
    """Prepared data that cannot be used; the message names the location and what is wrong."""


def is_remote(location: str) -> bool:
    return "://" in location


def join(location: str, *names: str) -> str:
    """A child of a local dir or of a URI (a URI's ?query, e.g. an endpoint_override, stays last)."""
    if not is_remote(location):
        return os.path.join(location, *names)
    base, sep, query = location.partition("?")
    return "/".join([base.rstrip("/"), *names]) + sep + query


def filesystem(location: str) -> tuple[Any, str]:
    """(pyarrow FileSystem, path inside it) for a local path or a URI."""
    import pyarrow.fs as pafs

    if not is_remote(location):
        return pafs.LocalFileSystem(), os.path.abspath(location)
    return pafs.FileSystem.from_uri(location)


def manifest_location(data: str) -> str | None:
    """The manifest a --data value names (the file itself or a folder holding one), else None."""
    import pyarrow.fs as pafs

    candidates = [data] if data.partition("?")[0].endswith(MANIFEST) else [join(data, MANIFEST)]
    for uri in candidates:
        try:
            fs, path = filesystem(uri)
            if fs.get_file_info(path).type == pafs.FileType.File:
                return uri
        except (OSError, ValueError):
            return None
    return None


def format_version(name: Any) -> int:
    """N of a `raytrain-token-shards/N` format name; 0 for anything else."""
    prefix = FORMAT.rsplit("/", 1)[0] + "/"
    if isinstance(name, str) and name.startswith(prefix) and name[len(prefix) :].isdigit():
        return int(name[len(prefix) :])
    return 0


def write_atomic(uri: str, data: bytes) -> None:
    """Write a small file whole or not at all: a local temp file renamed over it (rename(2) is
    atomic), or one PUT to an object store (S3 never exposes a partially written object: a PUT or a
    completed multipart upload appears whole). The bytes are ready before anything is opened."""
    fs, path = filesystem(uri)
    if is_remote(uri) and not uri.startswith("file://"):
        with fs.open_output_stream(path) as f:
            f.write(data)
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with fs.open_output_stream(tmp) as f:
            f.write(data)
        fs.move(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            fs.delete_file(tmp)
        raise


def manifest_checksum(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without its own checksum: any edit (a seq_len, a
    block count) changes it, so a reader trusts only the manifest preparation wrote."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()


def read_manifest(location: str) -> dict[str, Any]:
    """Load and check a manifest (a manifest.json URI/path, or the folder holding it)."""
    uri = location if location.partition("?")[0].endswith(MANIFEST) else join(location, MANIFEST)
    fs, path = filesystem(uri)
    try:
        with fs.open_input_stream(path) as f:
            manifest: dict[str, Any] = json.loads(f.read().decode("utf-8"))
    except FileNotFoundError:
        raise ShardError(f"{uri}: no manifest (not prepared, or preparation did not finish)") from None
    except (OSError, ValueError) as exc:
        raise ShardError(f"{uri}: cannot read the manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in FORMATS:
        got = manifest.get("format") if isinstance(manifest, dict) else None
        reads = " and ".join(FORMATS)
        if format_version(got) > max(format_version(f) for f in FORMATS):
            raise ShardError(
                f"{uri}: written by a newer version of the data preparation (format {got}); this "
                f"version reads {reads}: run the job with the code that prepared it, or prepare the "
                "data again with this one"
            )
        raise ShardError(
            f"{uri}: format {got!r} is not one this version reads ({reads}); prepare the data again"
        )
    if manifest.get("checksum") != manifest_checksum(manifest):
        why = "has no checksum (written by an older version)" if "checksum" not in manifest else "was edited"
        raise ShardError(f"{uri}: the manifest {why}: its shards cannot be trusted; prepare the data again")
    counted = sum(int(s["blocks"]) for s in manifest["shards"])
    if counted != manifest["blocks"]:
        raise ShardError(f"{uri}: shards hold {counted} blocks, the manifest says {manifest['blocks']}")
    return manifest


def write_manifest(location: str, manifest: dict[str, Any]) -> str:
    """Write manifest.json atomically: a local temp file renamed over it, or one S3 PUT (S3 never
    exposes a partially written object: a PUT or a completed multipart upload appears whole)."""
    uri = join(location, MANIFEST)
    manifest = {**manifest, "checksum": manifest_checksum(manifest)}
    write_atomic(uri, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    return uri


class TokenBlocks:
    """The blocks of prepared data, read by global block index.

    Local shards are memory-mapped: the page cache holds what was read, the process holds nothing.
    Remote shards (s3://, any pyarrow URI) are read with RandomAccessFile.read_at, one ranged GET
    per block; arrow documents ReadAt as safe to call from several threads at once (arrow/io/
    interfaces.h), so a pool of threads issues the reads of a batch concurrently.
    """

    def __init__(self, location: str, *, read_threads: int = 16) -> None:
        self.location = location
        self.manifest = read_manifest(location)
        self.seq_len = int(self.manifest["seq_len"])
        self.fingerprint = str(self.manifest["fingerprint"])
        counts = np.array([int(s["blocks"]) for s in self.manifest["shards"]], dtype=np.int64)
        self._ends = np.cumsum(counts)
        self._names = [str(s["name"]) for s in self.manifest["shards"]]
        self._base = location if not location.partition("?")[0].endswith(MANIFEST) else _parent(location)
        self._remote = is_remote(self._base)
        self.has_flags = self.manifest["format"] == CHAT_FORMAT
        self._open: dict[int, Any] = {}
        self._open_flags: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(read_threads) if self._remote else None

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def _locate(self, index: int) -> tuple[int, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"block {index} of {len(self)}")
        shard = int(np.searchsorted(self._ends, index, side="right"))
        start = int(self._ends[shard - 1]) if shard else 0
        return shard, index - start

    def _handle(self, shard: int) -> Any:
        with self._lock:
            h = self._open.get(shard)
            if h is None:
                uri = join(self._base, *self._names[shard].split("/"))
                try:
                    if self._remote:
                        fs, path = filesystem(uri)
                        h = fs.open_input_file(path)
                    else:
                        n = int(self.manifest["shards"][shard]["blocks"])
                        h = np.memmap(uri, dtype=DTYPE, mode="r", shape=(n, self.seq_len))
                except FileNotFoundError:
                    raise ShardError(
                        f"{self.location}: shard {self._names[shard]} is missing; prepare the data again"
                    ) from None
                except (OSError, ValueError) as exc:  # numpy: "mmap length is greater than file size"
                    raise ShardError(
                        f"{self.location}: shard {self._names[shard]} cannot be read as its manifest "
                        f"says ({exc}); prepare the data again"
                    ) from None
                self._open[shard] = h
            return h

    def _flags_handle(self, shard: int) -> Any:
        with self._lock:
            h = self._open_flags.get(shard)
            if h is None:
                uri = join(self._base, *(self._names[shard] + FLAGS_SUFFIX).split("/"))
                if self._remote:
                    fs, path = filesystem(uri)
                    h = fs.open_input_file(path)
                else:
                    n = int(self.manifest["shards"][shard]["blocks"])
                    h = np.memmap(uri, dtype=np.uint8, mode="r", shape=(n, self.seq_len))
                self._open_flags[shard] = h
            return h

    def _read_flags(self, index: int) -> np.ndarray:
        shard, local = self._locate(index)
        h = self._flags_handle(shard)
        if not self._remote:
            return np.asarray(h[local])
        buf = h.read_at(self.seq_len, local * self.seq_len)
        if len(buf) != self.seq_len:
            raise ShardError(
                f"{self.location}: {self._names[shard]}{FLAGS_SUFFIX} is shorter than its manifest says"
            )
        return np.frombuffer(buf, dtype=np.uint8)

    def take_flags(self, indices: Sequence[int]) -> np.ndarray:
        """The blocks' flags [len(indices), seq_len] as uint8 (chat data only: see CHAT_FORMAT)."""
        if not self.has_flags:
            raise ShardError(f"{self.location}: text data has no target flags")
        out = np.empty((len(indices), self.seq_len), dtype=np.uint8)
        rows = (
            self._pool.map(self._read_flags, indices)
            if self._pool is not None
            else map(self._read_flags, indices)
        )
        for row, block in enumerate(rows):
            out[row] = block
        return out

    def _read(self, index: int) -> np.ndarray:
        shard, local = self._locate(index)
        h = self._handle(shard)
        if not self._remote:
            return np.asarray(h[local])
        nbytes = self.seq_len * TOKEN_BYTES
        buf = h.read_at(nbytes, local * nbytes)
        if len(buf) != nbytes:
            raise ShardError(f"{self.location}: shard {self._names[shard]} is shorter than its manifest says")
        return np.frombuffer(buf, dtype=DTYPE)

    def where(self, index: int) -> str:
        """Block `index` as a person finds it: the shard file and the block inside it."""
        shard, local = self._locate(index)
        return f"shard {self._names[shard]} block {local}"

    def take(self, indices: Sequence[int]) -> np.ndarray:
        """Blocks [len(indices), seq_len] as uint32, in the order given."""
        out = np.empty((len(indices), self.seq_len), dtype=DTYPE)
        if self._pool is not None:
            for row, block in enumerate(self._pool.map(self._read, indices)):
                out[row] = block
        else:
            for row, i in enumerate(indices):
                out[row] = self._read(i)
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        for h in [*self._open.values(), *self._open_flags.values()]:
            if hasattr(h, "close"):
                h.close()
        self._open.clear()
        self._open_flags.clear()


def _parent(uri: str) -> str:
    base, sep, query = uri.partition("?")
    parent = base.rsplit("/", 1)[0] if "/" in base else base
    return parent + sep + query

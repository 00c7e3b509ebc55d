"""What a manifest promises about its shards, checked once on the driver before any worker starts.

Cheap by design: the manifest itself (its checksum was verified by shards.read_manifest, so an
edited seq_len or block count never gets this far), one listing per shard folder (a LIST request
on S3) for the sizes, and the largest token id that preparation recorded per shard against the
model's vocabulary. No shard byte is read: a corpus of any size costs the same.

What the listing cannot see (a shard rewritten in place with the same size) is caught when the
blocks are read: data.Batches checks every micro-batch's ids against the vocabulary, a max over
micro x seq_len integers in the prefetch thread, and TokenBlocks refuses short reads.
"""

from __future__ import annotations

from typing import Any

from training.data import shards
from training.data.shards import ShardError, _parent


def _int(manifest: dict[str, Any], key: str, where: str) -> int:
    value = manifest.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ShardError(f"{where}: field {key!r} is {value!r}, not a count; prepare the data again")
    return value


def check_manifest(location: str, manifest: dict[str, Any]) -> None:
    """The manifest's fields agree with each other: dtype, seq_len, per-shard bytes and totals."""
    where = location
    if manifest.get("dtype") != "uint32" or manifest.get("byte_order") != "little":
        raise ShardError(
            f"{where}: tokens are {manifest.get('byte_order')!r}-endian {manifest.get('dtype')!r}; this "
            "reader takes little-endian uint32 only; prepare the data again"
        )
    seq_len = _int(manifest, "seq_len", where)
    if seq_len == 0:
        raise ShardError(f"{where}: seq_len is 0; prepare the data again")
    rows = manifest.get("shards")
    if not isinstance(rows, list) or not rows:
        raise ShardError(f"{where}: lists no shards; prepare the data again")
    total = 0
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):
            raise ShardError(f"{where}: shard entry {i} has no name; prepare the data again")
        name = row["name"]
        blocks, nbytes = (
            _int(row, "blocks", f"{where} shard {name}"),
            _int(row, "bytes", f"{where} shard {name}"),
        )
        if nbytes != blocks * seq_len * shards.TOKEN_BYTES:
            raise ShardError(
                f"{where}: shard {name} is listed with {nbytes} bytes, but {blocks} blocks of seq_len "
                f"{seq_len} are {blocks * seq_len * shards.TOKEN_BYTES}; prepare the data again"
            )
        total += blocks
    if total != _int(manifest, "blocks", where) or _int(manifest, "tokens", where) != total * seq_len:
        raise ShardError(
            f"{where}: totals (blocks {manifest.get('blocks')}, tokens {manifest.get('tokens')}) do not "
            f"match the shards' {total} blocks of {seq_len}; prepare the data again"
        )


def check_files(location: str, manifest: dict[str, Any]) -> None:
    """Every shard is there with the size the manifest gives it: one listing per shard folder."""
    import pyarrow.fs as pafs

    base = _parent(location) if location.partition("?")[0].endswith(shards.MANIFEST) else location
    folders: dict[str, dict[str, int]] = {}
    for row in manifest["shards"]:
        folder, _, _ = row["name"].rpartition("/")
        if folder not in folders:
            fs, path = shards.filesystem(shards.join(base, *folder.split("/")) if folder else base)
            try:
                infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
            except OSError as exc:
                raise ShardError(f"{location}: cannot list the shards in {folder or '.'}: {exc}") from None
            folders[folder] = {i.base_name: int(i.size or 0) for i in infos if i.type == pafs.FileType.File}
        name = row["name"].rpartition("/")[2]
        size = folders[folder].get(name)
        want = int(row["bytes"])
        if size is None:
            raise ShardError(f"{location}: shard {row['name']} is missing; prepare the data again")
        if size != want:
            whole = "" if size % shards.TOKEN_BYTES == 0 else ", not a whole number of 4-byte tokens"
            raise ShardError(
                f"{location}: shard {row['name']} is {size} bytes{whole}; the manifest says {want} "
                f"({row['blocks']} blocks x {manifest['seq_len']} tokens x {shards.TOKEN_BYTES} bytes): "
                "truncated or replaced; prepare the data again"
            )


def check_vocabulary(location: str, manifest: dict[str, Any], vocab_size: int) -> None:
    """Token ids stay inside the model's embedding table: the per-shard maximum recorded at
    preparation (training.run.prepare), else the tokenizer's size."""
    tok = manifest.get("tokenizer") or {}
    for row in manifest["shards"]:
        top = row.get("max_token")
        if isinstance(top, int) and top >= vocab_size:
            raise ShardError(
                f"{location}: shard {row['name']} holds token id {top}, beyond the model's vocabulary "
                f"of {vocab_size} (tokenized by {tok.get('name')!r}); prepare it with the model's tokenizer, "
                "or, if that is the model's own, resize the model's embeddings to the tokenizer"
            )


def validate(location: str, manifest: dict[str, Any], *, vocab_size: int) -> None:
    check_manifest(location, manifest)
    check_files(location, manifest)
    check_vocabulary(location, manifest, vocab_size)

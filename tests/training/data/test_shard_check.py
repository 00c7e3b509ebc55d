"""Prepared shards checked against their manifest before training, with the real shard writer and
reader: an edited manifest, truncated, missing or resized shards, token ids beyond the vocabulary.
Each is one ShardError naming the shard; none reads a shard's bytes at start."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from training.common.errors import InputError
from training.data import shard_check, shards
from training.data.batches import Batches
from training.options.train import SAMPLE_DATA, parse_args
from training.run.driver import resolve_data
from training.run.prepare import Settings, plan_segments, write_segment

SEQ = 32


def _prepare(tmp: Path) -> str:
    """Shards written by the preparation's own segment writer, and the manifest it would write."""
    corpus = tmp / "c.jsonl"
    corpus.write_text(SAMPLE_DATA.read_text())
    item = {"uri": str(corpus), "size": corpus.stat().st_size, "mtime_ns": 0}
    cfg = Settings(seq_len=SEQ, text_field="text", shape="tiny", model="", segment_bytes=3000)
    out = tmp / "prepared"
    (out / "shards-x").mkdir(parents=True)
    rows = []
    for seg in plan_segments([item], cfg.segment_bytes):
        counts = write_segment(seg, cfg, str(out / "shards-x" / f"{seg.index:05d}.bin"))
        rows.append({"name": f"shards-x/{seg.index:05d}.bin", "blocks": counts["blocks"],
                     "bytes": counts["bytes"], "max_token": counts["max_token"]})  # fmt: skip
    blocks = sum(r["blocks"] for r in rows)
    manifest = {"format": shards.FORMAT, "dtype": "uint32", "byte_order": "little", "seq_len": SEQ,
                "fingerprint": "f" * 64, "blocks": blocks, "tokens": blocks * SEQ,
                "bytes": blocks * SEQ * 4, "shards": rows,
                "tokenizer": {"name": "byte", "vocab_size": 257}}  # fmt: skip
    shards.write_manifest(str(out), manifest)
    return str(out)


@pytest.fixture
def prepared(tmp_path: Path) -> str:
    return _prepare(tmp_path)


def _validate(location: str, vocab: int = 264) -> None:
    shard_check.validate(location, shards.read_manifest(location), vocab_size=vocab)


def _shard(location: str, i: int = 1) -> Path:
    return Path(location, "shards-x", f"{i:05d}.bin")


def test_prepared_shards_pass(prepared: str) -> None:
    manifest = shards.read_manifest(prepared)
    assert len(manifest["shards"]) > 2 and all(r["max_token"] == 256 for r in manifest["shards"])  # EOS
    _validate(prepared)
    _validate(f"file://{prepared}/manifest.json")  # the URI path, and a manifest named directly


def test_an_edited_manifest_is_refused(prepared: str) -> None:
    path = Path(prepared, shards.MANIFEST)
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps({**manifest, "seq_len": SEQ // 2}))
    with pytest.raises(shards.ShardError, match="the manifest was edited: its shards cannot be trusted"):
        shards.read_manifest(prepared)
    del manifest["checksum"]
    path.write_text(json.dumps(manifest))
    with pytest.raises(shards.ShardError, match="has no checksum"):
        shards.read_manifest(prepared)


@pytest.mark.parametrize(
    ("cut", "needle"),
    [(4, r"is \d+ bytes; the manifest says \d+ \(\d+ blocks x 32 tokens x 4 bytes\)"),
     (2, r"is \d+ bytes, not a whole number of 4-byte tokens")],
)  # fmt: skip
def test_a_truncated_shard_is_named(prepared: str, cut: int, needle: str) -> None:
    shard = _shard(prepared)
    shard.write_bytes(shard.read_bytes()[:-cut])
    with pytest.raises(shards.ShardError, match=rf"shard shards-x/00001\.bin {needle}"):
        _validate(prepared)
    # Past the start check (a shard cut while a run reads it): a ShardError, not numpy's mmap error.
    blocks = shards.TokenBlocks(prepared)
    with pytest.raises(shards.ShardError, match=r"shards-x/00001\.bin"):
        blocks.take([int(blocks._ends[1]) - 1])  # the last block of shard 1


def test_a_longer_or_missing_shard_is_named(prepared: str) -> None:
    shard = _shard(prepared)
    shard.write_bytes(shard.read_bytes() + b"\0" * 4 * SEQ)
    with pytest.raises(shards.ShardError, match=r"shard shards-x/00001\.bin is .* bytes; the manifest says"):
        _validate(prepared)
    shard.unlink()
    with pytest.raises(shards.ShardError, match=r"shard shards-x/00001\.bin is missing"):
        _validate(prepared)


def test_token_ids_beyond_the_vocabulary_are_refused_at_start(prepared: str) -> None:
    with pytest.raises(shards.ShardError, match="holds token id 256, beyond the model's vocabulary of 200"):
        _validate(prepared, vocab=200)


@pytest.mark.parametrize("remote", [False, True])
def test_a_shard_changed_after_preparation_is_caught_when_read(prepared: str, remote: bool) -> None:
    """Same size, other ids: invisible to the listing; the batch reader names the block."""
    shard = _shard(prepared)
    ids = np.fromfile(shard, dtype="<u4")
    ids[SEQ + 3] = 9999  # block 1 of the shard
    ids.tofile(shard)
    _validate(prepared)
    blocks = shards.TokenBlocks(f"file://{prepared}" if remote else prepared)
    batches = Batches(blocks, seq_len=SEQ, vocab=264, seed=0, micro=len(blocks), accum=1, world=1,
                      rank=0, prefetch=remote)  # fmt: skip
    with pytest.raises(shards.ShardError, match=r"shard shards-x/00001\.bin block 1 holds token id 9999"):
        batches.micro_batch(0, 0)
    batches.close()


def test_the_driver_refuses_bad_shards_before_any_worker(prepared: str, tmp_path: Path) -> None:
    opts = parse_args(["--init", "random", "--shape", "tiny", "--data", prepared,
                       "--output-dir", str(tmp_path / "run")])  # fmt: skip
    assert resolve_data(opts, 264) is not None
    _shard(prepared).write_bytes(b"\0" * 6)
    with pytest.raises(InputError, match="not a whole number of 4-byte tokens"):
        resolve_data(opts, 264)

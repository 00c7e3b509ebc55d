"""Token shards without Ray: segment boundaries, packing per segment, reading blocks by position
(memory-mapped and ranged reads), the manifest, and the batch order the loop sees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training.data import shards
from training.data.batches import EOS_BYTE, Batches, ByteTokenizer, pack
from training.options.train import SAMPLE_DATA, OptionError, parse_args
from training.run.prepare import Settings, _segment_texts, plan_segments, write_segment

TINY = {"shape": "tiny", "model": ""}


def _docs() -> list[str]:
    return [json.loads(x)["text"] for x in SAMPLE_DATA.read_text().splitlines()]


def _jsonl(path: Path, texts: list[str]) -> dict[str, Any]:
    path.write_text("".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate(texts)))
    return {"uri": str(path), "size": path.stat().st_size, "mtime_ns": 0}


@given(segment=st.integers(1, 4000), n_docs=st.integers(0, 12))
@settings(max_examples=25, deadline=None)
def test_jsonl_segments_hold_every_record_once_in_order(segment: int, n_docs: int, tmp_path_factory) -> None:
    """A record belongs to the segment its line starts in, however the byte ranges fall."""
    texts = [t[: 50 + 37 * i] for i, t in enumerate(_docs()[:n_docs])]
    item = _jsonl(tmp_path_factory.mktemp("seg") / "c.jsonl", texts)
    segs = plan_segments([item], segment)
    assert [s.index for s in segs] == list(range(len(segs)))
    got = [t for s in segs for batch in _segment_texts(s, "text") for t in batch]
    assert got == texts


def test_parquet_segments_are_row_groups(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = _docs()
    pq.write_table(pa.table({"text": texts}), tmp_path / "c.parquet", row_group_size=4)
    item = {"uri": str(tmp_path / "c.parquet"), "size": 0, "mtime_ns": 0}
    segs = plan_segments([item], 1)  # every row group its own segment
    assert [(s.start, s.end) for s in segs] == [(i, i + 1) for i in range(0, (len(texts) + 3) // 4)]
    assert [t for s in segs for b in _segment_texts(s, "text") for t in b] == texts


def _prepare_locally(tmp: Path, seq_len: int, segment: int) -> tuple[str, list[np.ndarray]]:
    """Segments written one by one in this process, as the Ray tasks do; returns the location and
    the blocks each segment should hold (pack() of its documents)."""
    item = _jsonl(tmp / "c.jsonl", _docs())
    cfg = Settings(seq_len=seq_len, text_field="text", segment_bytes=segment, **TINY)
    out = tmp / "prepared"
    (out / "shards-x").mkdir(parents=True)
    rows, expected = [], []
    tok = ByteTokenizer()
    for seg in plan_segments([item], segment):
        counts = write_segment(seg, cfg, str(out / "shards-x" / f"{seg.index:05d}.bin"))
        texts = [t for b in _segment_texts(seg, "text") for t in b]
        expected.append(pack((tok.encode(t) for t in texts), seq_len, EOS_BYTE))
        assert counts["blocks"] == len(expected[-1]) and counts["documents"] == len(texts)
        rows.append({"name": f"shards-x/{seg.index:05d}.bin", "blocks": counts["blocks"]})
    manifest = {"format": shards.FORMAT, "seq_len": seq_len, "fingerprint": "f" * 64,
                "blocks": sum(r["blocks"] for r in rows), "shards": rows,
                "tokenizer": {"name": "byte", "vocab_size": 257}}  # fmt: skip
    shards.write_manifest(str(out), manifest)
    return str(out), expected


def test_one_segment_packs_exactly_like_the_whole_file(tmp_path: Path) -> None:
    location, expected = _prepare_locally(tmp_path, 64, 1 << 20)
    tok = ByteTokenizer()
    whole = pack((tok.encode(d) for d in _docs()), 64, EOS_BYTE)
    blocks = shards.TokenBlocks(location)
    assert len(expected) == 1 and len(blocks) == len(whole)
    assert np.array_equal(blocks.take(range(len(blocks))), whole)


@pytest.mark.parametrize("remote", [False, True])
def test_blocks_are_read_by_position_across_shards(tmp_path: Path, remote: bool) -> None:
    """Local shards are memory-mapped; file:// takes the ranged-read path that s3:// takes."""
    location, expected = _prepare_locally(tmp_path, 32, 2000)
    assert len(expected) > 3 and any(len(e) == 0 for e in expected) is False
    every = np.concatenate(expected)
    blocks = shards.TokenBlocks(f"file://{location}" if remote else location)
    assert blocks._remote is remote and len(blocks) == len(every)
    order = np.random.default_rng(0).permutation(len(every))[:50].tolist()
    got = blocks.take(order)
    assert got.dtype == np.uint32 and np.array_equal(got, every[order])
    with pytest.raises(IndexError):
        blocks.take([len(every)])
    blocks.close()


def test_a_truncated_remote_shard_is_an_error_not_garbage(tmp_path: Path) -> None:
    location, _ = _prepare_locally(tmp_path, 32, 1 << 20)
    shard = next(Path(location, "shards-x").iterdir())
    shard.write_bytes(shard.read_bytes()[:-4])
    blocks = shards.TokenBlocks(f"file://{location}")
    with pytest.raises(shards.ShardError, match="shorter than its manifest"):
        blocks.take([len(blocks) - 1])


def test_shards_without_a_manifest_are_not_prepared_data(tmp_path: Path) -> None:
    (tmp_path / "shards-x").mkdir()
    (tmp_path / "shards-x" / "00000.bin").write_bytes(b"\0" * 64)
    assert shards.manifest_location(str(tmp_path)) is None
    with pytest.raises(shards.ShardError, match="not prepared, or preparation did not finish"):
        shards.read_manifest(str(tmp_path))
    shards.write_manifest(str(tmp_path), {"format": "something-else/9"})
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["manifest.json"]  # no temp left
    with pytest.raises(shards.ShardError, match="prepare the data again"):
        shards.read_manifest(str(tmp_path))


def test_prefetched_batches_equal_direct_reads_and_follow_position_jumps(tmp_path: Path) -> None:
    location, expected = _prepare_locally(tmp_path, 32, 3000)
    every = np.concatenate(expected)
    kw: dict[str, Any] = dict(seq_len=32, vocab=257, seed=4, micro=2, accum=3, world=2, rank=1)
    direct = Batches(every, **kw)
    fetched = Batches(shards.TokenBlocks(f"file://{location}"), prefetch=True, **kw)
    positions = [0, 12, 24, 36, 12, 24, 1200]  # a resume goes back; a long run wraps epochs
    for pos in positions:
        for mb in range(3):
            assert np.array_equal(fetched.micro_batch(pos, mb).numpy(), direct.micro_batch(pos, mb).numpy())
    assert len(fetched._pending) == 3  # the rest of the step and the next step: nothing else kept
    fetched.close()


@pytest.mark.parametrize("uri", [False, True])
def test_prepared_shards_without_their_manifest_are_told_so(tmp_path: Path, uri: bool) -> None:
    """Not "no .jsonl/.json/.parquet files": the folder holds our shards and lacks the manifest
    that preparation writes last."""
    folder = tmp_path / "prepared"
    (folder / "shards-0123456789abcdef").mkdir(parents=True)
    (folder / "shards-0123456789abcdef" / "00000.bin").write_bytes(b"\0" * 64)
    data = f"file://{folder}" if uri else str(folder)
    base = ["--init", "random", "--shape", "tiny", "--output-dir", str(tmp_path / "run")]
    with pytest.raises(OptionError) as err:
        parse_args([*base, "--data", data])
    text = str(err.value)
    assert text.startswith(
        f"--data: {data} holds prepared shards (shards-0123456789abcdef/) but no manifest.json"
    )
    assert "prepare the data again" in text and "\n" not in text
    # A folder of other files stays "no data files".
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(OptionError, match=r"no \.jsonl/\.json/\.parquet files under"):
        parse_args([*base, "--data", str(tmp_path / "other")])


def test_a_manifest_of_a_newer_format_names_it_and_what_this_version_reads(tmp_path: Path) -> None:
    shards.write_manifest(str(tmp_path), {"format": "raytrain-token-shards/3", "blocks": 0, "shards": []})
    with pytest.raises(shards.ShardError) as err:
        shards.read_manifest(str(tmp_path))
    assert str(err.value) == (
        f"{tmp_path / 'manifest.json'}: written by a newer version of the data preparation (format "
        "raytrain-token-shards/3); this version reads raytrain-token-shards/1 and raytrain-token-shards/2: "
        "run the job with the code that prepared it, or prepare the data again with this one"
    )
    shards.write_manifest(str(tmp_path), {"format": "raytrain-token-shards/1", "blocks": 0, "shards": [],
                                          "seq_len": 8})  # fmt: skip
    text = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**text, "seq_len": 16}))
    with pytest.raises(shards.ShardError, match="the manifest was edited"):
        shards.read_manifest(str(tmp_path))


def test_a_failed_atomic_write_leaves_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.fs as pafs

    target = tmp_path / "run.json"
    target.write_text('{"old": true}')

    class FailingMove:
        """The local filesystem, whose rename fails (a full disk, a lost mount)."""

        def __init__(self) -> None:
            self.fs = pafs.LocalFileSystem()

        def __getattr__(self, name: str) -> Any:
            return getattr(self.fs, name)

        def move(self, src: str, dest: str) -> None:
            raise OSError("disk full")

    monkeypatch.setattr(shards, "filesystem", lambda uri: (FailingMove(), str(target)))
    with pytest.raises(OSError, match="disk full"):
        shards.write_atomic(str(target), b'{"new": true}')
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"] and target.read_text() == '{"old": true}'


def test_options_take_seq_len_from_prepared_data(tmp_path: Path) -> None:
    location, _ = _prepare_locally(tmp_path, 32, 1 << 20)
    base = ["--init", "random", "--shape", "tiny", "--output-dir", str(tmp_path / "run")]
    opts = parse_args([*base, "--data", location])
    assert opts.seq_len == 32 and opts.prepared_data is None
    assert parse_args([*base, "--data", f"{location}/manifest.json"]).seq_len == 32
    with pytest.raises(OptionError, match=r"--seq-len: 64, but .* blocks of 32 tokens"):
        parse_args([*base, "--data", location, "--seq-len", "64"])
    # Already prepared: a --prepared-data location (the chart passes one for any non-random data) is moot.
    assert (
        parse_args([*base, "--data", location, "--prepared-data", str(tmp_path / "p")]).prepared_data is None
    )
    raw = parse_args([*base, "--data", str(SAMPLE_DATA)])
    assert raw.prepared_data == str(tmp_path / "run" / "checkpoints" / "_prepared" / "train")
    remote = parse_args([*base, "--data", str(SAMPLE_DATA), "--storage-path", "s3://bkt/ckpt"])
    assert remote.prepared_data == "s3://bkt/ckpt/_prepared/train"


def test_a_failed_preparation_removes_its_shards_unless_the_manifest_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """training.run.prepare's cleanup: an identical preparation that finished meanwhile keeps its files."""
    import pyarrow.fs as pafs

    from training.run import prepare

    mine = tmp_path / "shards-aaaa"
    mine.mkdir()
    (mine / "00000.bin").write_bytes(b"\0" * 8)
    fs, lines = pafs.LocalFileSystem(), []
    listed = {"shards": [{"name": "shards-aaaa/00000.bin"}]}
    monkeypatch.setattr(prepare.shards, "read_manifest", lambda out: listed)
    prepare._remove_unlisted(fs, str(mine), str(tmp_path), "shards-aaaa", lines.append)
    assert (mine / "00000.bin").exists()
    listed = {"shards": [{"name": "shards-bbbb/00000.bin"}]}  # another input's manifest
    prepare._remove_unlisted(fs, str(mine), str(tmp_path), "shards-aaaa", lines.append)
    assert not mine.exists() and not lines

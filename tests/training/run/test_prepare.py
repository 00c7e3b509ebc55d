"""The preparation step on local Ray: Ray Data tasks tokenize and write the shards in corpus order,
a second run over unchanged input does nothing, and the driver's memory does not follow the corpus."""

from __future__ import annotations

import json
import os
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from training.data import shards
from training.data.batches import EOS_BYTE, Batches, ByteTokenizer, pack
from training.options.train import SAMPLE_DATA
from training.run.prepare import _segment_texts, list_inputs, plan_segments, prepare

pytestmark = [pytest.mark.ray, pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")]

TINY: dict[str, Any] = {"shape": "tiny", "model": ""}


def _docs() -> list[str]:
    return [json.loads(x)["text"] for x in SAMPLE_DATA.read_text().splitlines()]


def _expected(data: str, seq_len: int, segment_mb: float) -> np.ndarray:
    """pack() of each segment's documents, segments in corpus order: what the shards must hold."""
    tok = ByteTokenizer()
    segs = plan_segments(list_inputs(data), int(segment_mb * 2**20))
    texts = [[t for b in _segment_texts(s, "text") for t in b] for s in segs]
    packed = [pack((tok.encode(t) for t in seg), seq_len, EOS_BYTE) for seg in texts]
    return np.concatenate(packed)


def test_prepare_writes_corpus_order_and_skips_unchanged_input(ray_session: str, tmp_path: Path) -> None:
    docs = _docs()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    # b before a on disk, a before b in the corpus: the sorted names set the order.
    (corpus / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:8]))
    (corpus / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[8:]))
    out, lines = tmp_path / "out", []
    kw: dict[str, Any] = dict(seq_len=64, segment_mb=0.002, log=lines.append, **TINY)
    first = prepare(str(corpus), str(out), **kw)
    assert len(first["shards"]) > 2  # several segments, i.e. several parallel tasks
    blocks = shards.TokenBlocks(str(out))
    assert np.array_equal(blocks.take(range(len(blocks))), _expected(str(corpus), 64, 0.002))
    assert first["documents"] == len(docs) and first["tokens"] == len(blocks) * 64

    written = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    again = prepare(str(corpus), str(out), **kw)
    assert again == first and "up to date" in lines[-1]
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == written  # nothing rewritten

    (corpus / "a.jsonl").write_text(json.dumps({"text": "changed " * 40}) + "\n")
    changed = prepare(str(corpus), str(out), **kw)
    assert changed["fingerprint"] != first["fingerprint"]
    # New shards in a new folder; the ones the old manifest named are left intact for runs reading them.
    assert {p.name for p in out.iterdir()} == {"manifest.json", f"shards-{first['fingerprint'][:16]}",
                                               f"shards-{changed['fingerprint'][:16]}"}  # fmt: skip


def test_prepare_reads_and_writes_uris(ray_session: str, tmp_path: Path) -> None:
    """file:// takes the pyarrow-filesystem path that s3:// takes, for parquet input and the output."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = _docs()
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": docs[5:]}), tmp_path / "in" / "a.parquet", row_group_size=3)
    pq.write_table(pa.table({"text": docs[:5]}), tmp_path / "in" / "b.parquet", row_group_size=3)
    out = f"file://{tmp_path}/out"
    manifest = prepare(f"file://{tmp_path}/in", out, seq_len=48, segment_mb=1e-6, log=print, **TINY)
    parts = [docs[5:][i : i + 3] for i in range(0, len(docs) - 5, 3)] + [docs[:3], docs[3:5]]
    assert len(manifest["shards"]) == len(parts)  # one segment per row group
    tok = ByteTokenizer()
    want = np.concatenate([pack((tok.encode(t) for t in part), 48, EOS_BYTE) for part in parts])
    assert np.array_equal(shards.TokenBlocks(out).take(range(manifest["blocks"])), want)


def _peak_during(fn: Callable[[], Any]) -> tuple[Any, int, int]:
    """(result, peak Python/numpy heap bytes (tracemalloc), peak Arrow pool bytes) while fn runs."""
    import pyarrow as pa

    arrow_peak, base, done = [0], pa.total_allocated_bytes(), threading.Event()

    def watch() -> None:
        while not done.wait(0.005):
            arrow_peak[0] = max(arrow_peak[0], pa.total_allocated_bytes() - base)

    t = threading.Thread(target=watch, daemon=True)
    tracemalloc.start()
    t.start()
    try:
        result = fn()
    finally:
        done.set()
        t.join()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return result, peak, arrow_peak[0]


def test_driver_memory_stays_bounded_for_a_corpus_larger_than_the_bound(
    ray_session: str, tmp_path: Path
) -> None:
    """A scaled-down head: a 24 MiB corpus (96 MiB of shards) prepared and read through with the
    driver's heap held under 8 MiB, measured, not assumed. Reading a rank's batches is bounded too:
    memory-mapped pages belong to the page cache, not to the process's heap."""
    bound = 8 * 2**20
    corpus = tmp_path / "big"
    corpus.mkdir()
    docs = _docs()
    for part in range(2):
        with open(corpus / f"part-{part}.jsonl", "w") as f:
            written, i = 0, 0
            while written < 12 * 2**20:
                line = json.dumps({"text": f"{part}.{i} " + docs[i % len(docs)]}) + "\n"
                f.write(line)
                written, i = written + len(line), i + 1
    size = sum(p.stat().st_size for p in corpus.iterdir())
    assert size >= 3 * bound

    # Ray Data's first use in a process imports and builds ~50 MiB of its own objects, whatever the
    # corpus: warm it up on the sample, then measure what the corpus adds.
    prepare(str(SAMPLE_DATA), str(tmp_path / "warm"), seq_len=256, log=print, **TINY)
    out = tmp_path / "shards"
    manifest, heap, arrow = _peak_during(
        lambda: prepare(str(corpus), str(out), seq_len=256, segment_mb=4, log=print, **TINY)
    )
    print(f"prepare: corpus {size / 2**20:.1f} MiB, shards {manifest['bytes'] / 2**20:.1f} MiB, "
          f"driver heap peak {heap / 2**20:.2f} MiB, arrow peak {arrow / 2**20:.2f} MiB")  # fmt: skip
    assert manifest["bytes"] >= 10 * bound
    assert heap < bound and arrow < bound
    assert sum(os.path.getsize(p) for p in out.rglob("*.bin")) == manifest["bytes"]

    def read_epoch_share() -> int:
        blocks = shards.TokenBlocks(str(out))
        b = Batches(blocks, seq_len=256, vocab=257, seed=1, micro=8, accum=1, world=2, rank=0, prefetch=True)
        total = 0
        for pos in range(0, len(blocks) // 4, 16):  # a quarter of an epoch: 1/8 of the corpus for rank 0
            total += int(b.micro_batch(pos, 0).shape[0])
        b.close()
        blocks.close()
        return total

    total, heap, _ = _peak_during(read_epoch_share)
    print(f"read {total} blocks ({total * 1024 / 2**20:.1f} MiB) with heap peak {heap / 2**20:.2f} MiB")
    assert total * 256 * 4 > bound and heap < bound


def test_bad_records_fail_the_preparation_or_are_counted(
    ray_session: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the Ray Data tasks: strict by default, one line naming the file and line, exit 4,
    no manifest; with --max-skipped-fraction the records are skipped and counted in the manifest."""
    from training.common.errors import INPUT_ERROR_EXIT
    from training.run.prepare import main as prepare_main

    corpus = tmp_path / "c.jsonl"
    docs = _docs()
    lines = [json.dumps({"text": t}) for t in docs]
    lines[5] = '{"text": null}'
    lines[9] = '{"text": "cut off'
    corpus.write_text("\n".join(lines) + "\n")
    argv = ["--data", str(corpus), "--out", str(tmp_path / "out"), "--shape", "tiny", "--seq-len", "64"]
    assert prepare_main(argv) == INPUT_ERROR_EXIT
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"python -m training.prepare: error: {corpus} line 6: 'text' is null; every record must be a "
        "JSON object with a string 'text' (--max-skipped-fraction lets a share of such records be "
        "skipped and counted)"
    ), err
    assert not (tmp_path / "out" / "manifest.json").exists()
    # The shards its other segments wrote are removed with the refusal: nothing is left behind.
    assert not list((tmp_path / "out").glob("shards-*/*")), list((tmp_path / "out").rglob("*"))

    assert prepare_main([*argv, "--max-skipped-fraction", "0.1"]) == 0
    manifest = shards.read_manifest(str(tmp_path / "out"))
    assert manifest["documents"] == len(docs) - 2
    assert manifest["skipped"]["records"] == 2 and manifest["skipped"]["of_records"] == len(docs)
    assert manifest["skipped"]["reasons"] == {"'text' is null": 1, "malformed JSON": 1}
    assert manifest["skipped"]["first"]["at"] == f"{corpus} line 6"
    # Prepared under a looser threshold: a strict run does not take it as up to date.
    assert prepare_main(argv) == INPUT_ERROR_EXIT
    assert "2 of " in capsys.readouterr().err
    # Too many for the threshold: named with the first.
    assert prepare_main([*argv, "--max-skipped-fraction", "0.01"]) == INPUT_ERROR_EXIT
    assert f"more than --max-skipped-fraction 0.01 allows; first: {corpus} line 6" in capsys.readouterr().err

"""Corpus files and records through the preparation's own readers (no Ray): every file and record
is used, refused with one line naming it, or skipped and counted under --max-skipped-fraction."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.training.unprivileged import as_unprivileged
from training.__main__ import main
from training.common.errors import DataError
from training.options.train import OptionError, corpus_listing
from training.run.prepare import Settings, _segment_texts, plan_segments, write_segment

TINY = ["--init", "random", "--shape", "tiny"]
GOOD = [{"text": f"document {i} " * 20} for i in range(6)]


def _lines(records: list[Any]) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    assert main([*TINY, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize(
    ("name", "content", "needles"),
    [
        ("c.jsonl", b"", ["c.jsonl is empty"]),
        ("c.jsonl", bytes(range(128, 191)) + b"\0", ["is binary data, not JSON lines", "valid: JSON lines"]),
        ("c.jsonl", gzip.compress(_lines(GOOD)), ["is gzip-compressed; decompress it first"]),
        ("c.jsonl", json.dumps(GOOD).encode(), ["is a JSON array, not JSON lines", "jq -c"]),
        ("c.json", b"just some prose\nover two lines\n", ["is plain text, not JSON lines"]),
        ("c.txt", b"just some prose\n", ["c.txt has .txt, not a supported format", "Parquet"]),
        ("c.jsonl", b"PAR1" + b"\0" * 64, ["is a Parquet file named as JSON lines"]),
        ("c.parquet", b"PAR1 truncated", ["c.parquet is a truncated or corrupt Parquet file"]),
        ("c.jsonl.gz", gzip.compress(_lines(GOOD)), ["is compressed; decompress it first"]),
        ("c.jsonl", b'{"text": "one", \n{"text": "two"}\n', ["c.jsonl line 1: malformed JSON"]),
        ("c.jsonl", b'{"text": "\xff\xfe"}\n', ["c.jsonl line 1: invalid UTF-8"]),
    ],
)
def test_each_kind_of_file_gets_its_own_message(
    name: str, content: bytes, needles: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / name).write_bytes(content)
    _refused(["--data", str(tmp_path / name)], capsys, "error: --data: ", *needles)


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + _lines(GOOD))
    from training.options.train import parse_args

    parse_args([*TINY, "--data", str(path), "--output-dir", str(tmp_path / "run")])
    seg = plan_segments([{"uri": str(path), "size": path.stat().st_size, "mtime_ns": 0}], 1 << 20)[0]
    assert [t for b in _segment_texts(seg, "text") for t in b] == [r["text"] for r in GOOD]


def test_a_later_bad_file_is_named_by_the_task_that_reads_it(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(_lines(GOOD))
    (tmp_path / "b.jsonl").write_bytes(gzip.compress(_lines(GOOD)))
    (tmp_path / "c.jsonl").write_bytes(b"")  # empty: no records, nothing lost
    files, ignored = corpus_listing(str(tmp_path))
    assert [Path(f).name for f in files] == ["a.jsonl", "b.jsonl", "c.jsonl"] and ignored == []
    items = [{"uri": f, "size": Path(f).stat().st_size, "mtime_ns": 0} for f in files]
    segs = plan_segments(items, 1 << 20)
    cfg = Settings(seq_len=16, text_field="text", shape="tiny", model="", segment_bytes=1 << 20)
    assert write_segment(segs[0], cfg, str(tmp_path / "0.bin"))["documents"] == len(GOOD)
    assert write_segment(segs[2], cfg, str(tmp_path / "2.bin"))["documents"] == 0
    with pytest.raises(DataError, match=r"b\.jsonl is gzip-compressed"):
        write_segment(segs[1], cfg, str(tmp_path / "1.bin"))


def test_other_files_in_a_folder_are_counted_not_hidden(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(_lines(GOOD))
    (tmp_path / "README.md").write_text("about the corpus")
    assert [Path(f).name for f in corpus_listing(str(tmp_path))[1]] == ["README.md"]


BAD: list[Any] = [
    {"title": "no text"},
    {"text": None},
    {"text": 42},
    {"text": ["a"]},
    b"{not json",
    b"[1, 2]",
]
REASONS = ["no field 'text'", "'text' is null", "'text' is a number, not a string",
           "'text' is a list, not a string", "malformed JSON", "a JSON list, not an object"]  # fmt: skip


def _segment(tmp: Path, records: list[Any], fraction: float) -> tuple[Any, Settings]:
    path = tmp / "c.jsonl"
    path.write_bytes(_lines(records))
    seg = plan_segments([{"uri": str(path), "size": path.stat().st_size, "mtime_ns": 0}], 1 << 20)[0]
    return seg, Settings(16, "text", "tiny", "", 1 << 20, fraction)


@pytest.mark.parametrize(("bad", "reason"), list(zip(BAD, REASONS, strict=True)))
def test_strict_by_default_the_first_bad_record_is_named(tmp_path: Path, bad: Any, reason: str) -> None:
    seg, cfg = _segment(tmp_path, [*GOOD[:3], bad, *GOOD[3:]], 0.0)
    with pytest.raises(DataError) as err:
        write_segment(seg, cfg, str(tmp_path / "0.bin"))
    msg = str(err.value)
    assert msg.startswith(f"{seg.uri} line 4: {reason}") and "--max-skipped-fraction" in msg, msg


def test_with_a_threshold_bad_records_are_skipped_and_counted(tmp_path: Path) -> None:
    seg, cfg = _segment(tmp_path, [*GOOD, *BAD], 0.5)
    counts = write_segment(seg, cfg, str(tmp_path / "0.bin"))
    skipped = json.loads(counts["skipped"])
    assert counts["documents"] == len(GOOD) and skipped["records"] == len(BAD)
    assert sum(skipped["reasons"].values()) == len(BAD) and skipped["reasons"]["malformed JSON"] == 1
    assert skipped["first"] == {"uri": seg.uri, "reason": "no field 'text'",
                                "offset": len(_lines(GOOD))}  # fmt: skip


def test_parquet_nulls_are_rows_and_a_non_string_column_is_refused(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [r["text"] for r in GOOD]
    pq.write_table(
        pa.table({"text": [*texts[:4], None, *texts[4:]]}), tmp_path / "a.parquet", row_group_size=2
    )
    item = {"uri": str(tmp_path / "a.parquet"), "size": 0, "mtime_ns": 0}
    segs = plan_segments([item], 1)
    cfg = Settings(16, "text", "tiny", "", 1)
    with pytest.raises(DataError, match=r"a\.parquet row 4: 'text' is null"):
        for i, s in enumerate(segs):
            write_segment(s, cfg, str(tmp_path / f"{i}.bin"))
    pq.write_table(pa.table({"text": [1, 2, 3]}), tmp_path / "b.parquet")
    seg = plan_segments([{"uri": str(tmp_path / "b.parquet"), "size": 0, "mtime_ns": 0}], 1)[0]
    with pytest.raises(DataError, match="column 'text' is int64, not a string column"):
        write_segment(seg, cfg, str(tmp_path / "b.bin"))


def test_a_truncated_parquet_file_is_named(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [r["text"] for r in GOOD]}), tmp_path / "a.parquet")
    data = (tmp_path / "a.parquet").read_bytes()
    (tmp_path / "a.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"a\.parquet is a truncated or corrupt Parquet file"):
        plan_segments([{"uri": str(tmp_path / "a.parquet"), "size": 0, "mtime_ns": 0}], 1)


def test_an_unreadable_subfolder_is_refused_not_skipped(tmp_path: Path) -> None:
    """As a user without permission on the subfolder (Path.rglob would skip it without a word)."""
    base = tmp_path / "corpus"
    (base / "locked").mkdir(parents=True)
    (base / "a.jsonl").write_bytes(_lines(GOOD))
    (base / "locked" / "b.jsonl").write_bytes(_lines(GOOD))
    (base / "locked").chmod(0o700 if os.geteuid() == 0 else 0)  # root's: nobody cannot enter

    def listing() -> str:
        try:
            corpus_listing(str(base))
        except OptionError as exc:
            return str(exc)
        return "listed without an error"

    message = as_unprivileged(listing, base)
    (base / "locked").chmod(0o700)
    assert message == f"--data: cannot read folder {base / 'locked'}: Permission denied"


def test_the_threshold_is_a_share(capsys: pytest.CaptureFixture[str]) -> None:
    from training.run.prepare import main as prepare_main

    assert prepare_main(["--data", "x", "--out", "y", "--max-skipped-fraction", "1.5"]) == 2
    assert "--max-skipped-fraction: a share of the records" in capsys.readouterr().err
    with pytest.raises(OptionError):
        from training.options.train import check_skipped_fraction

        check_skipped_fraction(-0.1)

"""A data set checked before any GPU is asked for: `python -m training.prepare --check` (and
`raytrain data check`, which runs it with a job's settings).

Every record is read and rendered exactly as the preparation would (the same segments, the same
tokenizer and chat template, the same write functions with an output that keeps nothing), so the
check refuses what the preparation, and so training, would refuse: a malformed or unusable record
(named by file and line), more skipped records than --max-skipped-fraction allows, more
conversations dropped as too long than --max-dropped-fraction allows, no block at all. It prints
the records' token lengths (min, percentiles, max), how many are longer than --seq-len (truncated or
dropped), the tokens, target tokens and blocks one epoch holds. In-process, without Ray: one core
reads a few MB/s of chat records, so a corpus of GBs is checked where it lies, with the cluster's
preparation job (`prepare_data`) or as a CPU job."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from training.common.errors import INPUT_ERROR_EXIT, DataError, InputError
from training.methods import sft
from training.options.data import check_data_path, check_skipped_fraction, resolve_data_format
from training.options.types import OptionError, location_option
from training.run.prepare import (
    DEFAULT_SEGMENT_MB,
    Settings,
    _check_shares,
    _tally,
    build_parser,
    check_inputs,
    plan_segments,
    write_segment,
)

PERCENTILES = (50, 90, 99)


def check(
    data: str,
    *,
    seq_len: int,
    text_field: str = "text",
    shape: str = "tiny",
    model: str = "",
    segment_mb: float = DEFAULT_SEGMENT_MB,
    max_skipped_fraction: float = 0.0,
    data_format: str = "text",
    too_long: str = "drop",
    max_dropped_fraction: float = sft.DEFAULT_MAX_DROPPED,
    log: Any = print,
) -> dict[str, Any]:
    """The report of `data` as the preparation would find it; raises what it would raise."""
    chat = data_format == "chat"
    settings = Settings(seq_len, text_field, shape, model, max(1, int(segment_mb * 2**20)),
                        max_skipped_fraction=max_skipped_fraction, data_format=data_format,
                        too_long=too_long)  # fmt: skip
    tokenizer, inputs, ignored = check_inputs(data, settings, log)
    write = sft.write_segment if chat else write_segment
    counts: list[dict[str, Any]] = []
    lengths: list[int] = []
    for seg in plan_segments(inputs, settings.segment_bytes):
        try:
            counts.append(write(seg, settings, None, lengths))
        except sft.RecordError as exc:  # an input error, as the preparation's tasks report it
            raise DataError(str(exc)) from None
    docs, skipped = _tally(data, counts, max_skipped_fraction)
    blocks = sum(int(r["blocks"]) for r in counts)
    report: dict[str, Any] = {
        "data": data,
        "format": data_format,
        "tokenizer": tokenizer["name"],
        "files": len(inputs),
        "ignored_files": len(ignored),
        "seq_len": seq_len,
        "records": docs + int(skipped["records"]),
        "used": docs,
        "skipped": skipped,
        "tokens": int(sum(lengths)),
        "lengths": _lengths(lengths),
        "longer_than_seq_len": sum(1 for n in lengths if n > seq_len),
        "blocks": blocks,
        "block_tokens": blocks * seq_len,
    }
    if chat:
        report.update(sft.manifest_counts(counts, too_long))
        report["documents"] = docs
        _lines(report, log)
        _check_shares(data, report, max_skipped_fraction, max_dropped_fraction)
    else:
        report["dropped_tokens"] = sum(int(r["dropped_tokens"]) for r in counts)
        _lines(report, log)
    if blocks == 0:
        what = "no conversation fits in" if chat else "fewer tokens per segment than"
        raise DataError(f"{data}: {what} --seq-len {seq_len} tokens: nothing to train on")
    return report


def _lengths(lengths: list[int]) -> dict[str, int]:
    if not lengths:
        return {}
    arr = np.asarray(lengths)
    out = {"min": int(arr.min())}
    out.update({f"p{p}": int(np.percentile(arr, p, method="higher")) for p in PERCENTILES})
    out["max"] = int(arr.max())
    return out


def _lines(r: dict[str, Any], log: Any) -> None:
    unit = "conversations" if r["format"] == "chat" else "documents"
    log(f"[check] {r['data']}: {r['files']} files, {r['records']} records, {r['format']} data, "
        f"tokenizer of {r['tokenizer']}")  # fmt: skip
    if r["lengths"]:
        spread = ", ".join(f"{k} {v:,}" for k, v in r["lengths"].items())
        log(f"[check] tokens per {unit[:-1]}: {spread}; {r['tokens']:,} tokens in all")
    if r["skipped"]["records"]:
        reasons = ", ".join(f"{n} {why}" for why, n in r["skipped"]["reasons"].items())
        first = r["skipped"]["first"]["at"]
        log(f"[check] skipped {r['skipped']['records']} records ({reasons}); first: {first}")
    if r["format"] == "chat":
        share = r["too_long"] / max(1, r["used"] + r["dropped_too_long"])
        log(f"[check] longer than --seq-len {r['seq_len']}: {r['too_long']} ({share:.1%}): {r['truncated']} "
            f"truncated, {r['dropped_too_long']} dropped (--too-long {r['too_long_policy']})")  # fmt: skip
        log(f"[check] one epoch: {r['blocks']:,} blocks of {r['seq_len']} tokens, {r['used']} "
            f"conversations, {r['target_tokens']:,} target tokens, {r['pad_tokens']:,} padding")  # fmt: skip
    else:
        tails = r["dropped_tokens"]
        log(f"[check] one epoch: {r['blocks']:,} blocks of {r['seq_len']} tokens ({tails:,} tokens of "
            f"segment tails left out); {r['longer_than_seq_len']} documents span blocks")  # fmt: skip


def main(argv: list[str]) -> int:
    """`python -m training.prepare --check ...`: the preparation's flags, nothing written. Exit 0
    when training would accept the data, 2 for a bad option, 4 for bad data (one line each)."""
    args = build_parser().parse_args(argv)
    try:
        if args.seq_len <= 0 or args.segment_mb <= 0:
            raise OptionError("--seq-len and --segment-mb: must be > 0")
        if args.out is not None:
            raise OptionError("--out: --check writes nothing; drop --out (or --check to prepare)")
        check_skipped_fraction(args.max_skipped_fraction)
        data = location_option("--data", args.data)
        data_format = resolve_data_format(args.data_format, check_data_path(data), args.text_field)
        check(data, seq_len=args.seq_len, text_field=args.text_field, shape=args.shape, model=args.model,
              segment_mb=args.segment_mb, max_skipped_fraction=args.max_skipped_fraction,
              data_format=data_format, too_long=args.too_long,
              max_dropped_fraction=args.max_dropped_fraction)  # fmt: skip
    except OptionError as exc:
        print(f"python -m training.prepare --check: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except InputError as exc:
        print(f"python -m training.prepare --check: error: {exc}", file=sys.stderr)
        return INPUT_ERROR_EXIT
    print("[check] ok: training would accept this data", flush=True)
    return 0

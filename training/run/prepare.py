"""Tokenize and pack a jsonl/parquet corpus once, in parallel on the Ray cluster, into token shards.

`python -m training.prepare --data CORPUS --out LOCATION` (local paths or any pyarrow URI, s3://
on the cluster). The corpus is cut into segments that depend only on the input files: byte ranges
of about --segment-mb of a jsonl file (a record belongs to the segment its line starts in), or
consecutive row groups of a parquet file. Each segment is one Ray Data task on any node's CPUs: it
reads its range, tokenizes, appends EOS after every document, cuts the stream into seq_len blocks
(dropping the segment's last partial block, at most seq_len - 1 tokens) and writes one shard
straight to the output. The driver handles only file listings, parquet footers and one small row of
counts per segment, so its memory does not grow with the corpus, and nothing of the corpus passes
through the object store. The manifest is written last (shards.write_manifest).

The result is a pure function of the input files, the tokenizer and the settings, whatever the
cluster's size: their fingerprint (file sizes and modification times, the tokenizer's vocabulary,
seq_len, the text field, the segment size) is recorded, and a run whose fingerprint matches the
manifest already there does nothing.

Chat records (`messages`, or `prompt`/`completion`: training/methods/sft.py) are rendered with the
tokenizer's chat template and packed whole into blocks, with a flags file beside each shard that
marks the assistant's tokens (the only ones the loss is taken on) and each conversation's start.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from training.common.errors import INPUT_ERROR_EXIT, DataError, InputError
from training.data import corpus, shards
from training.data.batches import ByteTokenizer, load_tokenizer
from training.methods import sft
from training.options.data import (
    check_data_path,
    check_skipped_fraction,
    check_text_field,
    corpus_listing,
    data_files,
    resolve_data_format,
)
from training.options.model import DEFAULT_MODEL, SHAPES
from training.options.types import OptionError, location_option

DEFAULT_SEGMENT_MB = 64
DOCS_PER_CALL = 512  # documents per tokenizer call: bounds a task's Python objects, not its input


@dataclass(frozen=True)
class Segment:
    index: int
    uri: str  # the input file
    parquet: bool
    start: int  # jsonl: byte range [start, end); parquet: row groups [start, end)
    end: int


@dataclass(frozen=True)
class Settings:
    seq_len: int
    text_field: str
    shape: str
    model: str
    segment_bytes: int
    # Share of the records that may be skipped (missing/null/non-string text, malformed lines)
    # before preparation fails; 0: the first one fails it, naming its file and line.
    max_skipped_fraction: float = 0.0
    data_format: str = "text"  # "text" (text_field) or "chat" (training/methods/sft.py)
    too_long: str = "drop"  # chat: a conversation longer than seq_len is dropped or truncated


def tokenizer_identity(shape: str, model: str) -> dict[str, Any]:
    """What decides the token ids: name, vocabulary size, EOS id and a hash of the vocabulary."""
    tok = load_tokenizer(shape, model)
    if isinstance(tok, ByteTokenizer):
        return {"name": "byte", "vocab_size": tok.vocab_size, "eos_token_id": tok.eos_token_id,
                "sha256": hashlib.sha256(b"utf-8 bytes + eos 256").hexdigest()}  # fmt: skip
    if tok.eos_token_id is None:
        raise OptionError(f"--model: the tokenizer of {model!r} has no EOS token to separate documents")
    backend = getattr(tok, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tok.get_vocab().items()))
    return {"name": model, "vocab_size": len(tok), "eos_token_id": int(tok.eos_token_id),
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}  # fmt: skip


def list_inputs(data: str) -> list[dict[str, Any]]:
    """The corpus files with their size and modification time (what the fingerprint covers)."""
    out = []
    for uri in data_files(data):
        fs, path = shards.filesystem(uri)
        info = fs.get_file_info(path)
        mtime = info.mtime_ns if info.mtime_ns is not None else None
        out.append({"uri": uri, "size": int(info.size or 0), "mtime_ns": mtime})
    return out


def fingerprint(inputs: list[dict[str, Any]], tokenizer: dict[str, Any], settings: Settings) -> str:
    key = {"format": shards.FORMAT, "inputs": inputs, "tokenizer": tokenizer,
           "seq_len": settings.seq_len, "text_field": settings.text_field,
           "segment_bytes": settings.segment_bytes}  # fmt: skip
    if settings.data_format == "chat":
        key.update(format=shards.CHAT_FORMAT, text_field=None, too_long=settings.too_long)
    else:  # documents with their BOS and flags: data prepared as FORMAT is prepared again
        key.update(format=shards.TEXT_FORMAT)
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()


def plan_segments(inputs: list[dict[str, Any]], segment_bytes: int) -> list[Segment]:
    """Segments in corpus order (sorted file names, then position in the file)."""
    import pyarrow.parquet as pq

    segments: list[Segment] = []
    for item in inputs:
        uri, size = item["uri"], item["size"]
        if uri.endswith(".parquet"):
            fs, path = shards.filesystem(uri)
            try:
                with fs.open_input_file(path) as f:
                    meta = pq.read_metadata(f)  # the footer only
            except Exception as exc:
                corpus.check_kind(uri)  # a better name for what it is, when there is one
                raise DataError(f"{uri} is a truncated or corrupt Parquet file ({exc})") from None
            first, acc = 0, 0
            for rg in range(meta.num_row_groups):
                acc += meta.row_group(rg).total_byte_size
                if acc >= segment_bytes or rg == meta.num_row_groups - 1:
                    segments.append(Segment(len(segments), uri, True, first, rg + 1))
                    first, acc = rg + 1, 0
        else:
            for start in range(0, max(size, 1), segment_bytes):
                segments.append(Segment(len(segments), uri, False, start, min(start + segment_bytes, size)))
    return segments


def _segment_texts(seg: Segment, field: str, skipped: corpus.Skipped | None = None) -> Iterator[list[str]]:
    """The segment's strings in `field`, in order, DOCS_PER_CALL at a time. Records without one
    are counted in `skipped` (training.data.corpus), with the first one's position."""
    import pyarrow.parquet as pq

    skipped = skipped if skipped is not None else corpus.Skipped()
    fs, path = shards.filesystem(seg.uri)
    with fs.open_input_file(path) as f:
        size = f.size()
        if seg.parquet:
            try:
                pf = pq.ParquetFile(f)
                corpus.check_parquet_column(seg.uri, pf.schema_arrow, field)
                row = sum(pf.metadata.row_group(i).num_rows for i in range(seg.start))
                rgs = list(range(seg.start, seg.end))
                for batch in pf.iter_batches(DOCS_PER_CALL, row_groups=rgs, columns=[field]):
                    yield list(corpus.parquet_texts(batch.column(0), row, seg.uri, field, skipped))
                    row += batch.num_rows
            except DataError:
                raise
            except Exception as exc:
                raise DataError(
                    f"{seg.uri} row groups {seg.start}-{seg.end - 1}: cannot read ({exc}): a truncated "
                    "or corrupt Parquet file"
                ) from None
            return
        if size == 0:
            return  # an empty file: no records, nothing lost (prepare fails if every file is)
        if seg.start == 0:  # what the file is, once per file
            problem = corpus.kind_problem(seg.uri, bytes(f.read_at(min(corpus.HEAD_BYTES, size), 0)), size)
            if problem:
                raise DataError(f"{seg.uri} {problem}")
        begin = corpus.line_start_at_or_after(f, seg.start, size)
        stop = corpus.line_start_at_or_after(f, seg.end, size) if seg.end < size else size
        if stop <= begin:
            return
        raw = bytes(f.read_at(stop - begin, begin))
    texts: list[str] = []
    for text in corpus.jsonl_texts(raw, begin, seg.uri, field, skipped):
        texts.append(text)
        if len(texts) == DOCS_PER_CALL:
            yield texts
            texts = []
    if texts:
        yield texts


def _strict(skipped: corpus.Skipped, settings: Settings) -> None:
    """With no skipping allowed, the first skipped record ends the preparation, named."""
    if skipped.records and settings.max_skipped_fraction == 0 and skipped.first is not None:
        raise DataError(
            f"{corpus.describe(skipped.first)}: {skipped.first['reason']}; every record must be a JSON "
            f"object with a string {settings.text_field!r} (--max-skipped-fraction lets a share of "
            "such records be skipped and counted)"
        )


def _encode(tok: Any, texts: list[str]) -> list[np.ndarray]:
    if isinstance(tok, ByteTokenizer):
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
    return [np.asarray(ids, dtype=np.int64) for ids in tok(texts, add_special_tokens=False)["input_ids"]]


_TOKENIZERS: dict[tuple[str, str], Any] = {}


def bos_id(tok: Any) -> int | None:
    """The BOS id the tokenizer puts in front of a text (Gemma, Llama 3, Mistral: their models are
    trained with it, Gemma's "requires" it), None where it adds none (Qwen, the byte tokenizer). By
    what the tokenizer does (`add_special_tokens`), not by whether it names a BOS: Qwen2's names none,
    and others name one they never add."""
    bos = getattr(tok, "bos_token_id", None)
    if bos is None or isinstance(tok, ByteTokenizer):
        return None
    ids = tok("a", add_special_tokens=True)["input_ids"]
    return int(bos) if ids and ids[0] == bos else None


def document_parts(ids: np.ndarray, bos: int | None, eos: int) -> tuple[np.ndarray, np.ndarray]:
    """One document's tokens (BOS, its ids, EOS) and flags: FLAG_START on its first token, which is
    predicted from nothing of its own, FLAG_TARGET on the rest (training/data/shards.py TEXT_FORMAT)."""
    head = [] if bos is None else [bos]
    tokens = np.concatenate([np.asarray(head, dtype=shards.DTYPE), ids.astype(shards.DTYPE, copy=False),
                             np.asarray([eos], dtype=shards.DTYPE)])  # fmt: skip
    flags = np.full(len(tokens), shards.FLAG_TARGET, dtype=np.uint8)
    flags[0] = shards.FLAG_START
    return tokens, flags


def write_segment(
    seg: Segment, settings: Settings, out: str | None, lengths: list[int] | None = None
) -> dict[str, Any]:
    """Tokenize one segment and write its shard and flags (None: count only); returns the counts
    for the manifest. `lengths` gets each document's token count."""
    key = (settings.shape, settings.model)
    tok = _TOKENIZERS.get(key) or _TOKENIZERS.setdefault(key, load_tokenizer(*key))
    eos, bos = int(tok.eos_token_id), bos_id(tok)
    seq = settings.seq_len
    carry = np.zeros(0, dtype=shards.DTYPE)
    carry_flags = np.zeros(0, dtype=np.uint8)
    docs = blocks = 0
    top = 0  # the largest token id written: the manifest's bound for the vocabulary check
    skipped = corpus.Skipped()
    with sft.output(out) as sink, sft.output(out, shards.FLAGS_SUFFIX) as flag_sink:
        for texts in _segment_texts(seg, settings.text_field, skipped):
            _strict(skipped, settings)
            parts, flag_parts = [carry], [carry_flags]
            for ids in _encode(tok, texts):
                tokens, flags = document_parts(ids, bos, eos)
                parts.append(tokens)
                flag_parts.append(flags)
                if lengths is not None:
                    lengths.append(len(ids))
            docs += len(texts)
            stream, flag_stream = np.concatenate(parts), np.concatenate(flag_parts)
            full = len(stream) // seq * seq
            if full:
                sink.write(stream[:full].tobytes())
                flag_sink.write(flag_stream[:full].tobytes())
                blocks += full // seq
                top = max(top, int(stream[:full].max()))
            carry, carry_flags = stream[full:], flag_stream[full:]
    _strict(skipped, settings)
    return {"index": seg.index, "blocks": blocks, "documents": docs, "dropped_tokens": len(carry),
            "skipped": json.dumps(skipped.to_dict()),
            "bytes": blocks * seq * shards.TOKEN_BYTES, "max_token": top}  # fmt: skip


def _write_segments(batch: dict[str, Any], *, settings: dict[str, Any], shard_dir: str) -> dict[str, Any]:
    """Ray Data map_batches function: one call per segment (batch_size=1)."""
    s = Settings(**settings)
    write = sft.write_segment if s.data_format == "chat" else write_segment
    rows = []
    for i in range(len(batch["index"])):
        seg = Segment(**{k: _py(batch[k][i]) for k in ("index", "uri", "parquet", "start", "end")})
        try:
            row = {**write(seg, s, shards.join(shard_dir, shard_name(seg.index))), "error": ""}
        except (InputError, sft.RecordError) as exc:
            # Returned, not raised: Ray Data wraps a UDF's exception in UserCodeException, and its
            # chained cause does not survive the trip to the driver (pickling drops __cause__).
            row = {"index": seg.index, "blocks": 0, "documents": 0, "dropped_tokens": 0, "bytes": 0,
                   "max_token": 0, "skipped": "", "error": str(exc)}  # fmt: skip
        rows.append(row)
    return {k: np.array([r[k] for r in rows]) for k in rows[0]}


def _py(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def shard_name(index: int) -> str:
    return f"{index:05d}.bin"


def check_inputs(data: str, settings: Settings, log: Any) -> tuple[dict[str, Any], list[Any], list[str]]:
    """What preparing (or checking) `data` needs first: its files and format checked, the
    tokenizer loaded; returns the tokenizer's identity, the inputs and the files left out."""
    files = check_data_path(data)
    chat = settings.data_format == "chat"
    if not chat:
        check_text_field(files, settings.text_field)
    ignored = corpus_listing(data)[1]
    if ignored:
        log(f"[prepare] ignoring {len(ignored)} files that are not {'/'.join(corpus.JSONL_SUFFIXES)}/"
            f"{corpus.PARQUET_SUFFIX} (first: {ignored[0]})")  # fmt: skip
    model = settings.model
    try:
        tokenizer = sft.tokenizer_identity(model) if chat else tokenizer_identity(settings.shape, model)
    except (OptionError, sft.TemplateError) as exc:  # one line of their own, naming --model
        raise OptionError(str(exc)) from None
    except Exception as exc:
        raise OptionError(f"--model: cannot load the tokenizer of {model!r}: {exc}") from None
    return tokenizer, list_inputs(data), ignored


def _check_cluster_can_reach(data: str, out: str) -> None:
    """Local paths exist on this machine only: fine for a local Ray, not for tasks on other nodes."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    local = [name for name, loc in (("--data", data), ("--out", out)) if not shards.is_remote(loc)]
    if len(alive) > 1 and local:
        raise OptionError(
            f"{local[0]}: a local path is only on this node, and this Ray cluster has {len(alive)} "
            "nodes whose tasks must read and write it: use s3:// (or another shared URI)"
        )


def prepare(
    data: str,
    out: str,
    *,
    seq_len: int,
    text_field: str = "text",
    shape: str = "tiny",
    model: str = "",
    segment_mb: float = DEFAULT_SEGMENT_MB,
    max_skipped_fraction: float = 0.0,
    log: Any = print,
    data_format: str = "text",
    too_long: str = "drop",
    max_dropped_fraction: float = sft.DEFAULT_MAX_DROPPED,
) -> dict[str, Any]:
    """Prepare `data` into `out` unless a manifest of the same fingerprint is there; returns it.

    Needs Ray initialised (ray.init or a cluster address). Errors are OptionError with one line.
    """
    import ray.data

    chat = data_format == "chat"
    settings = Settings(seq_len, text_field, shape, model, max(1, int(segment_mb * 2**20)),
                        max_skipped_fraction=max_skipped_fraction, data_format=data_format,
                        too_long=too_long)  # fmt: skip
    tokenizer, inputs, ignored = check_inputs(data, settings, log)
    fp = fingerprint(inputs, tokenizer, settings)
    try:
        existing = shards.read_manifest(out)
    except shards.ShardError:
        existing = None
    if existing is not None and existing.get("fingerprint") == fp:
        # Prepared under looser thresholds?
        _check_shares(data, existing, max_skipped_fraction, max_dropped_fraction if chat else 1.0)
        log(f"[prepare] {out}: up to date ({existing['blocks']} blocks of {seq_len} tokens); nothing to do")
        return existing

    _check_cluster_can_reach(data, out)
    t0 = time.time()
    segments = plan_segments(inputs, settings.segment_bytes)
    shard_dir = f"shards-{fp[:16]}"
    fs, root = shards.filesystem(shards.join(out, shard_dir))
    try:
        fs.create_dir(root, recursive=True)
        log(f"[prepare] {len(inputs)} files, {len(segments)} segments -> {out}")
        # One block per segment, so Ray Data runs the segments as parallel tasks on any node's CPUs;
        # the rows are only the segments' coordinates, and what comes back is one row of counts each.
        items = ray.data.from_items([asdict(s) for s in segments], override_num_blocks=len(segments))
        write: Any = _write_segments
        ds = items.map_batches(
            write,
            batch_size=1,
            fn_kwargs={"settings": asdict(settings), "shard_dir": shards.join(out, shard_dir)},
            num_cpus=1,
        )
        counts = _take_all(ds)
        if [int(r["index"]) for r in counts] != list(range(len(segments))):
            raise RuntimeError(f"[prepare] {len(counts)} of {len(segments)} segments reported back")
        shard_rows: list[dict[str, Any]] = [
            {"name": f"{shard_dir}/{shard_name(int(r['index']))}", "blocks": int(r["blocks"]),
             "bytes": int(r["bytes"]), "documents": int(r["documents"]), "max_token": int(r["max_token"])}
            for r in counts
        ]  # fmt: skip
        n_blocks = sum(s["blocks"] for s in shard_rows)
        docs, summary = _tally(data, counts, max_skipped_fraction)
        if n_blocks == 0 and chat:
            raise OptionError(f"--data: no conversation of {data} fits in --seq-len {seq_len} tokens")
        if n_blocks == 0:
            raise OptionError(f"--data: {data} holds fewer than --seq-len {seq_len} tokens per segment")
        manifest: dict[str, Any] = {
            "format": shards.CHAT_FORMAT if chat else shards.TEXT_FORMAT,
            "dtype": "uint32",
            "byte_order": "little",
            "seq_len": seq_len,
            "fingerprint": fp,
            "tokenizer": tokenizer,
            "text_field": text_field,
            "segment_bytes": settings.segment_bytes,
            "inputs": inputs,
            "documents": docs,
            "skipped": summary,
            "ignored_files": {"count": len(ignored), "first": ignored[0] if ignored else None},
            "blocks": n_blocks,
            "tokens": n_blocks * seq_len,
            "dropped_tokens": sum(int(r["dropped_tokens"]) for r in counts),
            "bytes": sum(s["bytes"] for s in shard_rows),
            "shards": shard_rows,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if chat:
            manifest.update(sft.manifest_counts(counts, too_long))
            log(sft.counts_line(manifest))
            sft.check_dropped(data, manifest, max_dropped_fraction)
        manifest["checksum"] = shards.manifest_checksum(manifest)  # what write_manifest records
        uri = shards.write_manifest(out, manifest)
    except BaseException:
        _remove_unlisted(fs, root, out, shard_dir, log)
        raise
    if summary["records"]:
        reasons = ", ".join(f"{n} {why}" for why, n in summary["reasons"].items())
        log(f"[prepare] skipped {summary['records']} of {summary['of_records']} records ({reasons}); "
            f"first: {summary['first']['at']}")  # fmt: skip
    log(
        f"[prepare] wrote {n_blocks} blocks ({manifest['tokens']:,} tokens, {manifest['documents']} "
        f"documents) in {len(shard_rows)} shards; manifest {uri} ({time.time() - t0:.1f} s)"
    )
    return manifest


def _remove_unlisted(fs: Any, root: str, out: str, shard_dir: str, log: Any) -> None:
    """After a failed preparation: remove the shards it wrote, unless the manifest now in `out`
    names them (an identical preparation that finished meanwhile). Never trusted without a
    manifest anyway; this keeps a refused input from leaving files behind."""
    try:
        current = shards.read_manifest(out)
    except shards.ShardError:
        current = None
    if current and any(str(s.get("name", "")).startswith(f"{shard_dir}/") for s in current["shards"]):
        return
    try:
        fs.delete_dir(root)
    except Exception as exc:  # the failure being raised matters more than this one
        log(f"[prepare] could not remove the partial shards under {root}: {exc}")


def _take_all(ds: Any) -> list[dict[str, Any]]:
    """The segments' rows of counts, in order. The first segment that reports an input error
    stops the preparation: leaving the iterator shuts the streaming executor down."""
    rows = []
    for row in ds.iter_rows():
        if row["error"]:
            raise DataError(str(row["error"]))
        rows.append(row)
    return sorted(rows, key=lambda r: int(r["index"]))


def _tally(data: str, counts: list[dict[str, Any]], allowed: float) -> tuple[int, dict[str, Any]]:
    """Documents used and the skipped records' summary, checked against --max-skipped-fraction."""
    skipped = corpus.Skipped()
    for r in counts:
        skipped.merge(json.loads(str(r["skipped"])))
    summary = skipped.to_dict()
    if skipped.first is not None:  # the file's line number, computed once, for the first only
        summary["first"]["at"] = corpus.describe(skipped.first)
    docs = sum(int(r["documents"]) for r in counts)
    summary["of_records"] = docs + skipped.records
    _check_skipped(data, {"skipped": summary}, allowed)
    if docs == 0:
        raise DataError(f"{data}: no records (its files are empty)")
    return docs, summary


def _check_shares(data: str, manifest: dict[str, Any], skipped: float, dropped: float) -> None:
    """A manifest's skipped records and dropped conversations against the thresholds."""
    _check_skipped(data, manifest, skipped)
    sft.check_dropped(data, manifest, dropped)


def _check_skipped(data: str, manifest: dict[str, Any], allowed: float) -> None:
    """More records skipped than --max-skipped-fraction allows: an error naming the first."""
    info = manifest.get("skipped") or {}
    n, total = int(info.get("records", 0)), int(info.get("of_records", 0))
    if n and n > allowed * total:
        first = info.get("first") or {}
        raise DataError(
            f"{data}: {n} of {total} records ({n / total:.2%}) were skipped as unusable, more than "
            f"--max-skipped-fraction {allowed:g} allows; first: {first.get('at')}: {first.get('reason')}"
        )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.prepare",
        description="Tokenize and pack a jsonl/parquet corpus into token shards, in parallel on Ray. "
        "A second run over unchanged input does nothing.",
        allow_abbrev=False,
    )
    p.add_argument("--data", required=True, help="a .jsonl/.parquet file or folder, local or s3://")
    p.add_argument(
        "--out", help="where the shards and manifest.json go (dir or s3://); required but with --check"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="read and render every record as preparing would, print the token lengths, what is too "
        "long, truncated or dropped, and the tokens and blocks of an epoch, and refuse what preparing "
        "would refuse; writes nothing, needs no Ray (training/run/data_check.py)",
    )
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per block (the training --seq-len)")
    p.add_argument("--text-field", default="text")
    p.add_argument(
        "--data-format",
        choices=("auto", "text", "chat"),
        default="auto",
        help="text: --text-field of each record; chat: 'messages' or 'prompt'/'completion' records, "
        "rendered with the tokenizer's chat template, loss on the assistant's tokens; auto: by the "
        "first record's fields",
    )
    p.add_argument(
        "--too-long",
        choices=sft.TOO_LONG,
        default="drop",
        help="chat: a conversation longer than --seq-len is dropped or truncated (counted either way)",
    )
    p.add_argument(
        "--max-dropped-fraction",
        type=float,
        default=sft.DEFAULT_MAX_DROPPED,
        metavar="F",
        help="chat: share of conversations (0 <= F <= 1) that may be dropped as longer than --seq-len "
        "before preparation stops, saying so (1: never)",
    )
    p.add_argument("--shape", choices=SHAPES, default="qwen2.5-1.5b", help="tiny: byte-level tokenizer")
    p.add_argument("--model", default=DEFAULT_MODEL, help="whose tokenizer (HF id, dir or s3:// prefix)")
    p.add_argument(
        "--segment-mb", type=float, default=DEFAULT_SEGMENT_MB, help="input MiB per task and shard"
    )
    p.add_argument(
        "--max-skipped-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="share of records (0 <= F < 1) that may lack a string text field or be malformed, "
        "skipped and counted; default 0: the first one is an error naming its file and line",
    )
    p.add_argument("--address", help="Ray cluster address ('auto' on the cluster); none = local Ray")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    owned = False
    try:
        if args.seq_len <= 0 or args.segment_mb <= 0:
            raise OptionError("--seq-len and --segment-mb: must be > 0")
        check_skipped_fraction(args.max_skipped_fraction)
        args.data = location_option("--data", args.data)
        if args.out is None or args.check:
            raise OptionError(
                "--out: where the shards go is required (or --check alone, to check the data only)"
            )
        args.out = location_option("--out", args.out, output=True)
        from training.run.ray_session import init_ray_at

        data_format = resolve_data_format(args.data_format, check_data_path(args.data), args.text_field)
        import ray

        # Shut down below only a Ray this call started (a caller's own session stays).
        owned = not ray.is_initialized()
        init_ray_at(args.address)
        prepare(args.data, args.out, seq_len=args.seq_len, text_field=args.text_field,
                shape=args.shape, model=args.model, segment_mb=args.segment_mb,
                max_skipped_fraction=args.max_skipped_fraction,
                data_format=data_format, too_long=args.too_long,
                max_dropped_fraction=args.max_dropped_fraction)  # fmt: skip
    except OptionError as exc:
        print(f"python -m training.prepare: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except InputError as exc:
        print(f"python -m training.prepare: error: {exc}", file=sys.stderr)
        return INPUT_ERROR_EXIT
    finally:
        if owned:
            sys.modules["ray"].shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

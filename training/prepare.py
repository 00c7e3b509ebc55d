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

from training import shards
from training.data import ByteTokenizer, load_tokenizer
from training.options import OptionError, check_data_path, check_text_field, data_files

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
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()


def plan_segments(inputs: list[dict[str, Any]], segment_bytes: int) -> list[Segment]:
    """Segments in corpus order (sorted file names, then position in the file)."""
    import pyarrow.parquet as pq

    segments: list[Segment] = []
    for item in inputs:
        uri, size = item["uri"], item["size"]
        if uri.endswith(".parquet"):
            fs, path = shards.filesystem(uri)
            with fs.open_input_file(path) as f:
                meta = pq.read_metadata(f)  # the footer only
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


def _line_start_at_or_after(f: Any, pos: int, size: int) -> int:
    """The first offset >= pos where a line starts (0, or just after a newline); size if none."""
    if pos <= 0:
        return 0
    at, chunk = pos - 1, 1 << 16
    while at < size:
        buf = f.read_at(min(chunk, size - at), at)
        hit = bytes(buf).find(b"\n")
        if hit >= 0:
            return at + hit + 1
        at += len(buf)
    return size


def _segment_texts(seg: Segment, field: str) -> Iterator[list[Any]]:
    """The segment's values of `field`, in order, DOCS_PER_CALL at a time."""
    import pyarrow as pa
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    fs, path = shards.filesystem(seg.uri)
    with fs.open_input_file(path) as f:
        if seg.parquet:
            pf = pq.ParquetFile(f)
            rgs = list(range(seg.start, seg.end))
            for batch in pf.iter_batches(DOCS_PER_CALL, row_groups=rgs, columns=[field]):
                yield batch.column(0).to_pylist()
            return
        size = f.size()
        begin = _line_start_at_or_after(f, seg.start, size)
        stop = _line_start_at_or_after(f, seg.end, size) if seg.end < size else size
        if stop <= begin:
            return
        raw = f.read_at(stop - begin, begin)
    if bytes(raw[-1:]) != b"\n":
        raw = pa.py_buffer(bytes(raw) + b"\n")
    table = pj.read_json(pa.BufferReader(raw))
    if field not in table.column_names:
        raise ValueError(f"{seg.uri}: no field {field!r} in the records at bytes {begin}-{stop}")
    column = table.column(field)
    for at in range(0, len(column), DOCS_PER_CALL):
        yield column.slice(at, DOCS_PER_CALL).to_pylist()


def _encode(tok: Any, texts: list[Any]) -> list[np.ndarray]:
    texts = [t if isinstance(t, str) else "" for t in texts]  # nulls and non-text values: empty
    if isinstance(tok, ByteTokenizer):
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
    return [np.asarray(ids, dtype=np.int64) for ids in tok(texts, add_special_tokens=False)["input_ids"]]


_TOKENIZERS: dict[tuple[str, str], Any] = {}


def write_segment(seg: Segment, settings: Settings, out: str) -> dict[str, Any]:
    """Tokenize one segment and write its shard; returns the counts for the manifest."""
    key = (settings.shape, settings.model)
    tok = _TOKENIZERS.get(key) or _TOKENIZERS.setdefault(key, load_tokenizer(*key))
    eos = np.array([tok.eos_token_id], dtype=shards.DTYPE)
    seq = settings.seq_len
    fs, path = shards.filesystem(out)
    carry = np.zeros(0, dtype=shards.DTYPE)
    docs = blocks = 0
    with fs.open_output_stream(path) as sink:
        for texts in _segment_texts(seg, settings.text_field):
            parts = [carry]
            for ids in _encode(tok, texts):
                parts += [ids.astype(shards.DTYPE, copy=False), eos]
            docs += len(texts)
            stream = np.concatenate(parts)
            full = len(stream) // seq * seq
            if full:
                sink.write(stream[:full].tobytes())
                blocks += full // seq
            carry = stream[full:]
    return {"index": seg.index, "blocks": blocks, "documents": docs, "dropped_tokens": len(carry),
            "bytes": blocks * seq * shards.TOKEN_BYTES}  # fmt: skip


def _write_segments(batch: dict[str, Any], *, settings: dict[str, Any], shard_dir: str) -> dict[str, Any]:
    """Ray Data map_batches function: one call per segment (batch_size=1)."""
    s = Settings(**settings)
    rows = []
    for i in range(len(batch["index"])):
        seg = Segment(**{k: _py(batch[k][i]) for k in ("index", "uri", "parquet", "start", "end")})
        rows.append(write_segment(seg, s, shards.join(shard_dir, shard_name(seg.index))))
    return {k: np.array([r[k] for r in rows]) for k in rows[0]}


def _py(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def shard_name(index: int) -> str:
    return f"{index:05d}.bin"


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
    log: Any = print,
) -> dict[str, Any]:
    """Prepare `data` into `out` unless a manifest of the same fingerprint is there; returns it.

    Needs Ray initialised (ray.init or a cluster address). Errors are OptionError with one line.
    """
    import ray.data

    files = check_data_path(data)
    check_text_field(files[0], text_field)
    settings = Settings(seq_len, text_field, shape, model, max(1, int(segment_mb * 2**20)))
    try:
        tokenizer = tokenizer_identity(shape, model)
    except OptionError:
        raise
    except Exception as exc:
        raise OptionError(f"--model: cannot load the tokenizer of {model!r}: {exc}") from None
    inputs = list_inputs(data)
    fp = fingerprint(inputs, tokenizer, settings)
    try:
        existing = shards.read_manifest(out)
    except shards.ShardError:
        existing = None
    if existing is not None and existing.get("fingerprint") == fp:
        log(f"[prepare] {out}: up to date ({existing['blocks']} blocks of {seq_len} tokens); nothing to do")
        return existing

    _check_cluster_can_reach(data, out)
    t0 = time.time()
    segments = plan_segments(inputs, settings.segment_bytes)
    shard_dir = f"shards-{fp[:16]}"
    fs, root = shards.filesystem(shards.join(out, shard_dir))
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
    counts = sorted(ds.take_all(), key=lambda r: int(r["index"]))
    if [int(r["index"]) for r in counts] != list(range(len(segments))):
        raise RuntimeError(f"[prepare] {len(counts)} of {len(segments)} segments reported back")
    shard_rows: list[dict[str, Any]] = [
        {"name": f"{shard_dir}/{shard_name(int(r['index']))}", "blocks": int(r["blocks"]),
         "bytes": int(r["bytes"]), "documents": int(r["documents"])}
        for r in counts
    ]  # fmt: skip
    n_blocks = sum(s["blocks"] for s in shard_rows)
    if n_blocks == 0:
        raise OptionError(f"--data: {data} holds fewer than --seq-len {seq_len} tokens per segment")
    manifest: dict[str, Any] = {
        "format": shards.FORMAT,
        "dtype": "uint32",
        "byte_order": "little",
        "seq_len": seq_len,
        "fingerprint": fp,
        "tokenizer": tokenizer,
        "text_field": text_field,
        "segment_bytes": settings.segment_bytes,
        "inputs": inputs,
        "documents": sum(int(r["documents"]) for r in counts),
        "blocks": n_blocks,
        "tokens": n_blocks * seq_len,
        "dropped_tokens": sum(int(r["dropped_tokens"]) for r in counts),
        "bytes": sum(s["bytes"] for s in shard_rows),
        "shards": shard_rows,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    uri = shards.write_manifest(out, manifest)
    log(
        f"[prepare] wrote {n_blocks} blocks ({manifest['tokens']:,} tokens, {manifest['documents']} "
        f"documents) in {len(shard_rows)} shards; manifest {uri} ({time.time() - t0:.1f} s)"
    )
    return manifest


def build_parser() -> argparse.ArgumentParser:
    from training.options import DEFAULT_MODEL, SHAPES

    p = argparse.ArgumentParser(
        prog="python -m training.prepare",
        description="Tokenize and pack a jsonl/parquet corpus into token shards, in parallel on Ray. "
        "A second run over unchanged input does nothing.",
        allow_abbrev=False,
    )
    p.add_argument("--data", required=True, help="a .jsonl/.parquet file or folder, local or s3://")
    p.add_argument("--out", required=True, help="where the shards and manifest.json go (dir or s3://)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per block (the training --seq-len)")
    p.add_argument("--text-field", default="text")
    p.add_argument("--shape", choices=SHAPES, default="qwen2.5-1.5b", help="tiny: byte-level tokenizer")
    p.add_argument("--model", default=DEFAULT_MODEL, help="whose tokenizer (HF id, dir or s3:// prefix)")
    p.add_argument(
        "--segment-mb", type=float, default=DEFAULT_SEGMENT_MB, help="input MiB per task and shard"
    )
    p.add_argument("--address", help="Ray cluster address ('auto' on the cluster); none = local Ray")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.seq_len <= 0 or args.segment_mb <= 0:
            raise OptionError("--seq-len and --segment-mb: must be > 0")
        from training.ray_session import init_ray_at

        init_ray_at(args.address)
        prepare(args.data, args.out, seq_len=args.seq_len, text_field=args.text_field,
                shape=args.shape, model=args.model, segment_mb=args.segment_mb)  # fmt: skip
    except OptionError as exc:
        print(f"python -m training.prepare: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    finally:
        if "ray" in sys.modules:
            sys.modules["ray"].shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Corpus files as preparation reads them: what a file is, and its records, every one either used
or counted as skipped with its reason and position.

Valid input (FORMATS): JSON lines — one JSON object per line, UTF-8 (a leading byte-order mark is
accepted), the text in a string field — or Parquet with a string column. Each other kind of file
gets its own message: empty, compressed (gzip, zstd, bzip2, xz, zip), a JSON array, Parquet named
.jsonl, plain text, binary data.

Records are parsed one line at a time with the json module (not pyarrow's block reader, whose
errors name neither the file nor the line, and which cannot tell a missing field from a null or
accept a non-string value in one record). Tokenizing the same text costs far more than parsing it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from training.common.errors import DataError

FORMATS = (
    "JSON lines (.jsonl/.json: one JSON object per line, UTF-8) or Parquet (.parquet) with a string column"
)
JSONL_SUFFIXES = (".jsonl", ".json")
PARQUET_SUFFIX = ".parquet"
_BOM = b"\xef\xbb\xbf"
_COMPRESSED = {
    b"\x1f\x8b": "gzip",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"PK\x03\x04": "zip",
}
_COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd", ".bz2", ".xz", ".zip")
HEAD_BYTES = 4096


def kind_problem(name: str, head: bytes, size: int) -> str | None:
    """Why a file (its name, first bytes and size) is not a corpus file we read, or None."""
    lower = name.lower()
    codec = next((c for magic, c in _COMPRESSED.items() if head.startswith(magic)), None)
    if codec or lower.endswith(_COMPRESSED_SUFFIXES):
        return f"is {codec + '-' if codec else ''}compressed; decompress it first (valid: {FORMATS})"
    if lower.endswith(PARQUET_SUFFIX):
        if not size:
            return "is empty"
        return None if size >= 12 and head.startswith(b"PAR1") else "is not a Parquet file (no PAR1 magic)"
    if not lower.endswith(JSONL_SUFFIXES):
        base = lower.rsplit("/", 1)[-1]
        suffix = "." + base.rsplit(".", 1)[1] if "." in base else "no suffix"
        return f"has {suffix}, not a supported format (valid: {FORMATS})"
    if head.startswith(b"PAR1"):
        return "is a Parquet file named as JSON lines: rename it .parquet"
    return _jsonl_problem(head[len(_BOM) :] if head.startswith(_BOM) else head, size)


def _jsonl_problem(body: bytes, size: int) -> str | None:
    """Why the first bytes of a .jsonl file (after any byte-order mark) are not JSON lines."""
    stripped = body.lstrip()
    if not stripped:
        return None if size > HEAD_BYTES else "is empty"  # whitespace only so far: checked per line
    if stripped[:1] == b"{":
        return None
    if stripped[:1] == b"[":
        return (
            "is a JSON array, not JSON lines: write one object per line (e.g. `jq -c '.[]' FILE`); "
            f"valid: {FORMATS}"
        )
    try:
        body.decode("utf-8")
        binary = b"\x00" in body
    except UnicodeDecodeError as exc:
        binary = exc.start < len(body) - 4  # not just a character cut at the end of the head
    if binary:
        return f"is binary data, not JSON lines (valid: {FORMATS})"
    return (
        "is plain text, not JSON lines: each line must be a JSON object like "
        f'{{"text": "..."}} (valid: {FORMATS})'
    )


def open_head(uri: str) -> tuple[bytes, int]:
    """The first HEAD_BYTES of a file and its size."""
    from training.data import shards

    fs, path = shards.filesystem(uri)
    with fs.open_input_file(path) as f:
        size = f.size()
        return bytes(f.read_at(min(HEAD_BYTES, size), 0)), size


def check_kind(uri: str) -> None:
    head, size = open_head(uri)
    problem = kind_problem(uri, head, size)
    if problem:
        raise DataError(f"{uri} {problem}")


def first_record_keys(uri: str) -> list[str] | None:
    """Field names of the first record (the Parquet schema's columns), for the --text-field check;
    None for an empty JSON lines file (no records, nothing lost)."""
    from training.data import shards

    head, size = open_head(uri)
    if not head.strip(b" \t\r\n" + _BOM) and size <= HEAD_BYTES and not uri.endswith(PARQUET_SUFFIX):
        return None
    check_kind(uri)
    fs, path = shards.filesystem(uri)
    if uri.endswith(PARQUET_SUFFIX):
        import pyarrow.parquet as pq

        with fs.open_input_file(path) as f:
            try:
                return list(pq.read_schema(f).names)
            except Exception as exc:
                raise DataError(f"{uri} is a truncated or corrupt Parquet file: {_one_line(exc)}") from None
    with fs.open_input_stream(path) as f:
        head = bytes(f.read(1 << 20))
    if head.startswith(_BOM):
        head = head[len(_BOM) :]
    for number, line in enumerate(head.split(b"\n"), 1):
        if line.strip():
            value, reason = parse_line(line)
            if reason:
                raise DataError(f"{uri} line {number}: {reason}")
            return list(value)
    return None


def parse_line(line: bytes) -> tuple[Any, str | None]:
    """(the JSON object, None), or (None, why the line is not one)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"invalid UTF-8 at byte {exc.start} of the line"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"malformed JSON ({exc.msg} at column {exc.colno})"
    except ValueError as exc:  # e.g. an integer too long to convert
        return None, f"malformed JSON ({exc})"
    if not isinstance(value, dict):
        return None, f"a JSON {type(value).__name__}, not an object"
    return value, None


def field_problem(record: dict[str, Any], name: str) -> str | None:
    if name not in record:
        return f"no field {name!r}"
    value = record[name]
    if value is None:
        return f"{name!r} is null"
    if not isinstance(value, str):
        kind = {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}
        return f"{name!r} is {kind.get(type(value), type(value).__name__)}, not a string"
    return None


@dataclass
class Skipped:
    """Records not used, by reason, and where the first one is (a jsonl byte offset or a row)."""

    records: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    first: dict[str, Any] | None = None

    def add(self, reason: str, uri: str, **where: int) -> None:
        self.records += 1
        key = reason.split(" (", 1)[0]  # "malformed JSON (Expecting ...)" counts as "malformed JSON"
        self.reasons[key] = self.reasons.get(key, 0) + 1
        if self.first is None:
            self.first = {"uri": uri, "reason": reason, **where}

    def merge(self, other: dict[str, Any]) -> None:
        self.records += int(other["records"])
        for k, n in other["reasons"].items():
            self.reasons[k] = self.reasons.get(k, 0) + int(n)
        if self.first is None and other.get("first"):
            self.first = dict(other["first"])

    def to_dict(self) -> dict[str, Any]:
        return {"records": self.records, "reasons": dict(sorted(self.reasons.items())), "first": self.first}


def line_start_at_or_after(f: Any, pos: int, size: int) -> int:
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


def line_number(uri: str, offset: int) -> int:
    """1-based line of the byte at `offset`: counts the newlines before it (only on the error path)."""
    from training.data import shards

    fs, path = shards.filesystem(uri)
    count, at, chunk = 0, 0, 1 << 22
    with fs.open_input_file(path) as f:
        while at < offset:
            n = min(chunk, offset - at)
            count += bytes(f.read_at(n, at)).count(b"\n")
            at += n
    return count + 1


def describe(first: dict[str, Any]) -> str:
    """`FILE line N` or `FILE row N` of a Skipped.first record."""
    if "offset" in first:
        return f"{first['uri']} line {line_number(first['uri'], int(first['offset']))}"
    return f"{first['uri']} row {first['row']}"


def jsonl_texts(raw: bytes, begin: int, uri: str, name: str, skipped: Skipped) -> Iterator[str]:
    """The `name` strings of the lines in raw (the file's bytes from offset `begin`, whole lines)."""
    at = 0
    if begin == 0 and raw.startswith(_BOM):
        at = len(_BOM)
    end = len(raw)
    while at < end:
        nl = raw.find(b"\n", at)
        stop = end if nl < 0 else nl
        line = raw[at:stop]
        if line.strip():  # blank lines separate nothing and hold no record
            value, reason = parse_line(line)
            if reason is None:
                reason = field_problem(value, name)
            if reason is None:
                yield value[name]
            else:
                skipped.add(reason, uri, offset=begin + at)
        at = stop + 1


def parquet_texts(column: Any, first_row: int, uri: str, name: str, skipped: Skipped) -> Iterator[str]:
    """The strings of one batch's column; nulls are skipped records (`first_row`: the file's row
    number of the batch's first row)."""
    for i, value in enumerate(column.to_pylist()):
        if value is None:
            skipped.add(f"{name!r} is null", uri, row=first_row + i)
        else:
            yield value


def check_parquet_column(uri: str, schema: Any, name: str) -> None:
    """The text column is there and holds strings (a Parquet column has one type for every row)."""
    import pyarrow as pa

    if name not in schema.names:
        raise DataError(f"{uri} has no column {name!r} (has {schema.names}); set --text-field")
    kind = schema.field(name).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataError(f"{uri}: column {name!r} is {kind}, not a string column")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]

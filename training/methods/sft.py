"""Chat (instruction) data: records rendered with the tokenizer's own chat template, the loss on the
assistant's tokens only, conversations packed whole into blocks.

Records (jsonl lines or parquet rows) hold either `messages`, a list of {"role", "content"} turns
as Hugging Face chat data is written, or `prompt` and `completion` (strings: one user turn and one
assistant turn; or lists of turns; the prompt's turns are context, never trained, as in TRL). A
turn may carry what the model's template renders besides its content (Qwen3's
`reasoning_content`, `tool_calls`, `tool` turns with `tool_call_id`/`name`) and a `train` (or
axolotl's `weight` 0/1) flag: false, context only; a record may carry `tools` (the function
definitions apply_chat_template writes into the prompt). Each is rendered with
`tokenizer.apply_chat_template`, so the model is trained on exactly the format it is later
prompted with; a conversation whose template writes history otherwise than the answers were
generated (Qwen3) becomes one example per such answer (training/chat/template.py).

Which tokens are the assistant's: training/chat/template.py (its answers' tokens through the
template's end-of-turn token, so the model learns to stop; a record whose answers cannot be
located exactly is refused, saying why and what to do).

Packing (training.data.shards CHAT_FORMAT): conversations go whole into seq_len blocks in input order; a
conversation that does not fit in the rest of a block starts the next one, the rest is padding
(no target, its own segment). Position ids restart at every conversation (FLAG_START), which
transformers turns into a block-diagonal causal mask (training/methods/loss.py), so a conversation's loss
is the same packed as alone. Longer than seq_len: dropped (default) or truncated to seq_len, and
counted in the manifest either way.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from training.chat.template import ChatRenderer, RecordError, TemplateError
from training.common.errors import DataError
from training.data import corpus, shards

__all__ = ["ChatRenderer", "RecordError", "TemplateError"]  # where callers have always found them

FIELDS = ("messages", "conversations", "prompt", "completion", "tools")
TOO_LONG = ("drop", "truncate")
# ShareGPT's speakers (`from`) as chat-template roles: the names of FastChat's ShareGPT data and of
# LLaMA-Factory's sharegpt format (data/README.md there: human, gpt, system, observation for a tool's
# result). Its function_call turns hold a JSON call, not text: they need tool-call conversion.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "system": "system", "observation": "tool",
                  "tool": "tool"}  # fmt: skip


def chat_fields(names: list[str]) -> bool:
    """Whether records with these keys/columns are chat records."""
    return "messages" in names or "conversations" in names or ("prompt" in names and "completion" in names)


def _content(value: Any, where: str) -> str:
    """A turn's text: a string, or OpenAI's content parts ([{"type": "text", "text": ...}], joined
    by newlines). Any other part (image_url, input_audio, file) is refused: these models read text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        texts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
                continue
            raise RecordError(
                f"{where}[{i}]: a {kind or type(part).__name__!r} content part; only text parts "
                '({"type": "text", "text": ...}) are read: convert the others to text or drop the record'
            )
        return "\n".join(texts)
    raise RecordError(f"{where}: text or a list of text parts expected, got {type(value).__name__}")


def _turns(value: Any, where: str, field: str, context: bool = False) -> list[dict[str, Any]]:
    """The turns of `value`, each a dict for the template: role, content (text; null or absent only
    beside tool_calls), the other fields as written (training/chat/template.py checks that the
    template renders them), and `train` (false: context, not trained) from a turn's `train` or
    `weight` (axolotl's per-message convention; 0 or 1). `context`: every turn untrained (TRL
    trains a record's completion, never its prompt)."""
    if not isinstance(value, list) or not value:
        raise RecordError(
            f"{where}: field {field!r}: a non-empty list of {{'role', 'content'}} turns expected"
        )
    turns = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict):
            raise RecordError(f"{where}: field {field}[{i}]: a {{'role', 'content'}} object expected")
        if "role" not in turn and "from" in turn:  # ShareGPT: {"from": "human", "value": "..."}
            shared = _sharegpt_turn(turn, f"{where}: field {field}[{i}]")
            turns.append({**shared, "train": False} if context else shared)
            continue
        role, content = turn.get("role"), turn.get("content")
        if not isinstance(role, str) or not role:
            raise RecordError(f"{where}: field {field}[{i}].role: a role name expected, got {role!r}")
        if content is None and turn.get("tool_calls"):
            content = ""  # an answer that only calls tools (OpenAI's format writes null)
        if not isinstance(content, str):
            content = _content(content, f"{where}: field {field}[{i}].content")
        out = {k: v for k, v in turn.items() if k not in ("train", "weight") and v is not None}
        out["role"], out["content"] = role, content
        train = _train_flag(turn, where, f"{field}[{i}]")
        if train is not None and role != "assistant":
            if train:
                raise RecordError(
                    f"{where}: field {field}[{i}]: a {role!r} turn marked trained; only assistant turns "
                    "are trained (drop the flag)"
                )
        elif context or train is False:
            out["train"] = False
        turns.append(out)
    return turns


def _train_flag(turn: dict[str, Any], where: str, at: str) -> bool | None:
    """A turn's `train` (true/false) or `weight` (0/1, axolotl's), None when neither is given."""
    flags = []
    if turn.get("train") is not None:
        if not isinstance(turn["train"], bool):
            raise RecordError(f"{where}: field {at}.train: true or false expected, got {turn['train']!r}")
        flags.append(turn["train"])
    if turn.get("weight") is not None:
        weight = turn["weight"]
        if isinstance(weight, bool) or weight not in (0, 1):
            raise RecordError(
                f"{where}: field {at}.weight: 0 (context, not trained) or 1 (trained) expected, "
                f"got {weight!r}"
            )
        flags.append(bool(weight))
    if len(set(flags)) > 1:
        raise RecordError(f"{where}: field {at}: train and weight disagree; give one of them")
    return flags[0] if flags else None


def _sharegpt_turn(turn: dict[str, Any], where: str) -> dict[str, str]:
    speaker = turn.get("from")
    role = SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
    if role is None:
        known = ", ".join(SHAREGPT_ROLES)
        raise RecordError(
            f"{where}.from: {speaker!r} is no ShareGPT speaker this reads ({known}); convert the turn to "
            '{"role": ..., "content": ...} (tool calls: an assistant turn with the call as text)'
        )
    return {"role": role, "content": _content(turn.get("value"), f"{where}.value")}


def conversation(record: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """The record's turns: `messages` (or ShareGPT's `conversations`: from/value turns, or
    role/content ones), or `prompt` + `completion` (strings or lists of turns; the prompt's turns
    are context, as TRL trains the completion only). Contents may be OpenAI's lists of text parts."""
    if record.get("messages") is not None or record.get("conversations") is not None:
        field = "messages" if record.get("messages") is not None else "conversations"
        turns = _turns(record[field], where, field)
    elif record.get("prompt") is not None and record.get("completion") is not None:
        prompt, completion = record["prompt"], record["completion"]
        head = (
            [{"role": "user", "content": prompt}]
            if isinstance(prompt, str)
            else _turns(prompt, where, "prompt", context=True)
        )
        tail = (
            [{"role": "assistant", "content": completion}]
            if isinstance(completion, str)
            else _turns(completion, where, "completion")
        )
        turns, field = head + tail, "completion"
    else:
        raise RecordError(
            f"{where}: no 'messages' (or ShareGPT 'conversations') field and no 'prompt' and "
            "'completion' fields"
        )
    if not any(t["role"] == "assistant" for t in turns):
        raise RecordError(f"{where}: field {field!r}: no turn with role 'assistant' (nothing to train on)")
    if not any(t["role"] == "assistant" for t in turns if t.get("train", True)):
        raise RecordError(
            f"{where}: field {field!r}: every assistant turn is context (train: false or weight: 0), "
            "nothing to train on; flag the answers to learn as trained"
        )
    return turns


def record_tools(record: dict[str, Any], where: str) -> list[Any] | None:
    """The record's `tools` (function definitions the template writes into the prompt, as
    apply_chat_template's tools= takes them), or None."""
    tools = record.get("tools")
    if tools is None:
        return None
    if isinstance(tools, str):  # a JSON column, as some data sets store it
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise RecordError(
                f"{where}: field 'tools': malformed JSON ({exc.msg} at column {exc.colno})"
            ) from None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RecordError(f"{where}: field 'tools': a list of tool (function) definitions expected")
    return tools or None


_TOKENIZERS: dict[str, Any] = {}


def load_chat_tokenizer(model: str) -> Any:
    """The --model's tokenizer (chat data always uses a real one, whatever --shape)."""
    tok = _TOKENIZERS.get(model)
    if tok is None:
        from transformers import AutoTokenizer

        from training.model.build import local_model_dir

        tok = _TOKENIZERS.setdefault(
            model, AutoTokenizer.from_pretrained(local_model_dir(model, weights=False))
        )
    return tok


def tokenizer_identity(model: str) -> dict[str, Any]:
    """What decides a chat record's tokens and mask: the vocabulary and the chat template."""
    tok = load_chat_tokenizer(model)
    renderer = ChatRenderer(tok, model)
    backend = getattr(tok, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(sorted(tok.get_vocab().items()))
    template = json.dumps(tok.chat_template, sort_keys=True)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    if pad is None:
        raise ValueError(
            f"--model: the tokenizer of {model!r} has neither a pad nor an EOS token to pad blocks"
        )
    return {"name": model, "vocab_size": len(tok), "eos_token_id": tok.eos_token_id, "pad_token_id": int(pad),
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "chat_template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
            "assistant_mask": renderer.method, "end_of_turn": renderer.end_ids}  # fmt: skip


def segment_records(seg: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) of a segment in order; `where` names the file and the record. A malformed
    line is a RecordError naming its file and line."""
    for where, _, record in _records(seg, None):
        yield where, record


def name_line(message: str) -> str:
    """A message about `FILE: line at byte N` as `FILE line L`: the line number a user's editor
    shows, counted only here, on the error path (reading the file up to the byte)."""
    m = _AT_BYTE.match(message)
    if m is None:
        return message
    return f"{m['uri']} line {corpus.line_number(m['uri'], int(m['offset']))}{message[m.end() :]}"


_AT_BYTE = re.compile(r"^(?P<uri>.+?): line at byte (?P<offset>\d+)")


def _records(
    seg: Any, skipped: corpus.Skipped | None
) -> Iterator[tuple[str, dict[str, int], dict[str, Any]]]:
    """(where, position, record) of a segment in order; a malformed line is counted in `skipped`
    (with its position), or, without it, a RecordError naming the line."""
    import pyarrow.parquet as pq

    fs, path = shards.filesystem(seg.uri)
    with fs.open_input_file(path) as f:
        if seg.parquet:
            pf = pq.ParquetFile(f)
            columns = [c for c in FIELDS if c in pf.schema_arrow.names]
            row = sum(pf.metadata.row_group(rg).num_rows for rg in range(seg.start))
            for batch in pf.iter_batches(512, row_groups=list(range(seg.start, seg.end)), columns=columns):
                for record in batch.to_pylist():
                    yield f"{seg.uri}: row {row}", {"row": row}, record
                    row += 1
            return
        size = f.size()
        begin = corpus.line_start_at_or_after(f, seg.start, size)
        stop = corpus.line_start_at_or_after(f, seg.end, size) if seg.end < size else size
        raw = bytes(f.read_at(stop - begin, begin)) if stop > begin else b""
    at = 0
    while at < len(raw):
        end = raw.find(b"\n", at)
        end = len(raw) if end < 0 else end
        line = raw[at:end]
        where, pos = f"{seg.uri}: line at byte {begin + at}", {"offset": begin + at}
        at = end + 1
        if not line.strip():
            continue
        reason = None
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:  # worded as the text path words it (corpus.py)
            reason = f"malformed JSON ({exc.msg} at column {exc.colno})"
        except ValueError as exc:  # invalid UTF-8
            reason = f"malformed JSON ({exc})"
        else:
            if not isinstance(record, dict):
                reason = "not a JSON object"
        if reason is None:
            yield where, pos, record
        elif skipped is not None:
            skipped.add(reason, seg.uri, **pos)
        else:
            raise RecordError(name_line(f"{where}: {reason}"))


class _Discard:
    """An output stream that keeps nothing: a check renders and counts without writing shards."""

    def __enter__(self) -> _Discard:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def write(self, data: bytes) -> None:
        return None


class _Packer:
    """Whole conversations into seq_len blocks, written to the tokens and flags streams."""

    def __init__(self, seq_len: int, pad: int, tokens: Any, flags: Any) -> None:
        self.seq, self.pad = seq_len, pad
        self.out_tokens, self.out_flags = tokens, flags
        self.tokens = np.full(seq_len, pad, dtype=shards.DTYPE)
        self.flags = np.zeros(seq_len, dtype=np.uint8)
        self.fill = self.blocks = self.pad_tokens = 0

    def add(self, ids: np.ndarray, target: np.ndarray) -> None:
        if self.fill + len(ids) > self.seq:
            self.flush()
        at, n = self.fill, len(ids)
        self.tokens[at : at + n] = ids
        self.flags[at : at + n] = np.where(target, shards.FLAG_TARGET, 0)
        self.flags[at] = shards.FLAG_START  # its first token: predicted from nothing of its own
        self.fill += n

    def flush(self) -> None:
        if not self.fill:
            return
        if self.fill < self.seq:  # padding: no target, a segment of its own
            self.tokens[self.fill :] = self.pad
            self.flags[self.fill :] = 0
            self.flags[self.fill] = shards.FLAG_START
            self.pad_tokens += self.seq - self.fill
        self.out_tokens.write(self.tokens.tobytes())
        self.out_flags.write(self.flags.tobytes())
        self.blocks += 1
        self.fill = 0


def write_segment(
    seg: Any, settings: Any, out: str | None, lengths: list[int] | None = None
) -> dict[str, Any]:
    """Render, pack and write one segment's conversations (tokens at `out`, flags beside it; None:
    counted only). `lengths` gets each conversation's rendered length, before any truncation. With
    --max-skipped-fraction above 0 a bad record is counted (the preparation checks the share), else
    it is an error naming its file and line."""
    tok = load_chat_tokenizer(settings.model)
    renderer = ChatRenderer(tok, settings.model)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    seq = settings.seq_len
    skipped = corpus.Skipped()
    lenient = getattr(settings, "max_skipped_fraction", 0.0) > 0
    kept = too_long = truncated = targets = 0
    with output(out) as tokens_out, output(out, shards.FLAGS_SUFFIX) as flags_out:
        packer = _Packer(seq, int(pad), tokens_out, flags_out)
        top = 0  # the largest token id written: the manifest's bound for the vocabulary check
        for where, pos, record in _records(seg, skipped if lenient else None):
            try:
                turns, tools = conversation(record, where), record_tools(record, where)
                examples = list(renderer.examples(turns, where, tools=tools))
            except RecordError as exc:
                if not lenient:
                    raise RecordError(name_line(str(exc))) from None
                skipped.add(str(exc).removeprefix(f"{where}: "), seg.uri, **pos)
                continue
            for example_ids, example_target in examples:
                ids, target = example_ids, example_target
                if lengths is not None:
                    lengths.append(len(ids))
                if len(ids) > seq:
                    too_long += 1
                    if settings.too_long == "drop":
                        continue
                    ids, target = ids[:seq], target[:seq]
                    target[0] = False
                    if not target.any():  # cut before its first answer: nothing left to learn
                        continue
                    truncated += 1
                target[0] = False
                packer.add(ids, target)
                top = max(top, int(ids.max()))
                kept += 1
                targets += int(target.sum())
        packer.flush()
    if packer.pad_tokens:
        top = max(top, int(pad))
    # The keys of the text path's rows (training/run/prepare.py), so both kinds are tallied alike.
    return {"index": seg.index, "blocks": packer.blocks, "documents": kept, "dropped_tokens": 0,
            "bytes": packer.blocks * seq * shards.TOKEN_BYTES, "too_long": too_long,
            "truncated": truncated, "pad_tokens": packer.pad_tokens, "target_tokens": targets,
            "max_token": top, "skipped": json.dumps(skipped.to_dict())}  # fmt: skip


def output(out: str | None, suffix: str = "") -> Any:
    """An output stream at `out` (plus `suffix`), or one that keeps nothing (None: a check)."""
    if out is None:
        return _Discard()
    fs, path = shards.filesystem(out + suffix)
    return fs.open_output_stream(path)


def manifest_counts(counts: list[dict[str, Any]], too_long: str) -> dict[str, Any]:
    """The manifest's chat fields from the segments' counts (write_segment)."""
    keys = ("too_long", "truncated", "pad_tokens", "target_tokens")
    totals = {k: sum(int(r[k]) for r in counts) for k in keys}
    return {**totals, "data_format": "chat", "too_long_policy": too_long, "text_field": None,
            "dropped_too_long": totals["too_long"] - totals["truncated"]}  # fmt: skip


# Conversations dropped as longer than --seq-len, as a share of the usable ones, above which
# preparation stops: most of a data set silently left out is a wrong --seq-len, not a choice.
DEFAULT_MAX_DROPPED = 0.1


def check_dropped(data: str, m: dict[str, Any], allowed: float) -> None:
    """More conversations dropped as too long than --max-dropped-fraction allows: a DataError
    saying what to change (`m`: the manifest's chat counts and documents)."""
    dropped = int(m.get("dropped_too_long") or 0)
    total = int(m.get("documents") or 0) + dropped
    if dropped and dropped > allowed * total:
        raise DataError(
            f"{data}: {dropped} of {total} conversations ({dropped / total:.0%}) are longer than --seq-len "
            f"{m['seq_len']} and would be dropped, more than --max-dropped-fraction {allowed:g} allows: "
            "raise --seq-len, use --too-long truncate, or raise --max-dropped-fraction"
        )


def counts_line(m: dict[str, Any]) -> str:
    return (
        f"[prepare] chat: {m['documents']} examples, {m['target_tokens']:,} target tokens, "
        f"{m['too_long']} longer than --seq-len {m['seq_len']} ({m['truncated']} truncated, "
        f"{m['dropped_too_long']} dropped), {m['pad_tokens']:,} padding tokens"
    )

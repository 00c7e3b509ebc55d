"""Chat (instruction) data: records rendered with the tokenizer's own chat template, the loss on the
assistant's tokens only, conversations packed whole into blocks.

Records (jsonl lines or parquet rows) hold either `messages`, a list of {"role", "content"} turns
as Hugging Face chat data is written, or `prompt` and `completion` (strings: one user turn and one
assistant turn; or lists of turns). Each is rendered with `tokenizer.apply_chat_template`, so the
model is trained on exactly the format it is later prompted with.

Which tokens are the assistant's:
- a template with `{% generation %}` markers: transformers' own `return_assistant_tokens_mask`;
- otherwise (Qwen2.5's and most shipped templates have none) by rendering prefixes: the text of
  turns 0..i-1 with the generation prompt, and of turns 0..i, bound assistant turn i's characters;
  the tokens overlapping those characters are its tokens (the rule transformers applies to the
  spans of generation markers). Each prefix must render as a prefix of the next, or the record is
  refused with a message saying to add generation markers: nothing is guessed.
An assistant turn's targets are its content and the template's end-of-turn text (`<|im_end|>`
for ChatML), so the model learns to stop.

Packing (training.shards CHAT_FORMAT): conversations go whole into seq_len blocks in input order; a
conversation that does not fit in the rest of a block starts the next one, the rest is padding
(no target, its own segment). Position ids restart at every conversation (FLAG_START), which
transformers turns into a block-diagonal causal mask (training/loss.py), so a conversation's loss
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

from training import corpus, shards

FIELDS = ("messages", "prompt", "completion")
TOO_LONG = ("drop", "truncate")
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


class RecordError(ValueError):
    """A record that cannot be used; the message names the file, the record and the field."""


def chat_fields(names: list[str]) -> bool:
    """Whether records with these keys/columns are chat records."""
    return "messages" in names or ("prompt" in names and "completion" in names)


def _turns(value: Any, where: str, field: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise RecordError(
            f"{where}: field {field!r}: a non-empty list of {{'role', 'content'}} turns expected"
        )
    turns = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict):
            raise RecordError(f"{where}: field {field}[{i}]: a {{'role', 'content'}} object expected")
        role, content = turn.get("role"), turn.get("content")
        if not isinstance(role, str) or not role:
            raise RecordError(f"{where}: field {field}[{i}].role: a role name expected, got {role!r}")
        if not isinstance(content, str):
            raise RecordError(
                f"{where}: field {field}[{i}].content: text expected, got {type(content).__name__}"
            )
        turns.append({"role": role, "content": content})
    return turns


def conversation(record: dict[str, Any], where: str) -> list[dict[str, str]]:
    """The record's turns: `messages`, or `prompt` + `completion` (strings or lists of turns)."""
    if record.get("messages") is not None:
        turns = _turns(record["messages"], where, "messages")
        field = "messages"
    elif record.get("prompt") is not None and record.get("completion") is not None:
        prompt, completion = record["prompt"], record["completion"]
        head = (
            [{"role": "user", "content": prompt}]
            if isinstance(prompt, str)
            else _turns(prompt, where, "prompt")
        )
        tail = (
            [{"role": "assistant", "content": completion}]
            if isinstance(completion, str)
            else _turns(completion, where, "completion")
        )
        turns, field = head + tail, "completion"
    else:
        raise RecordError(f"{where}: no 'messages' field and no 'prompt' and 'completion' fields")
    if not any(t["role"] == "assistant" for t in turns):
        raise RecordError(f"{where}: field {field!r}: no turn with role 'assistant' (nothing to train on)")
    return turns


class ChatRenderer:
    """Token ids and the assistant mask of a conversation, by the tokenizer's chat template."""

    def __init__(self, tokenizer: Any, name: str = "") -> None:
        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, dict):  # several named templates: the default one renders chats
            template = template.get("default")
        if not isinstance(template, str) or not template:
            raise ValueError(f"--model: the tokenizer of {name!r} has no chat template (chat data needs one)")
        self.tok = tokenizer
        self.generation_tags = bool(_GENERATION_TAG.search(template))
        self.method = "generation-markers" if self.generation_tags else "rendered-prefixes"

    def _text(self, turns: list[dict[str, str]], where: str, generation_prompt: bool = False) -> str:
        try:
            text = self.tok.apply_chat_template(
                turns, tokenize=False, add_generation_prompt=generation_prompt
            )
        except Exception as exc:  # jinja's TemplateError, raise_exception() of the template
            raise RecordError(f"{where}: field 'messages': the chat template refuses it: {exc}") from None
        return str(text)

    def render(self, turns: list[dict[str, str]], where: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64 [n], target bool [n])."""
        spans: list[tuple[int, int]] = []
        prev = ""
        for i, turn in enumerate(turns):
            cur = self._text(turns[: i + 1], where)
            # A role the template does not know renders nothing of its turn; as the first turn it
            # may still add the template's default system text, so the turn's own content is looked
            # for in what it added (templates may trim it).
            content = turn["content"].strip()
            if cur == prev or (content and content not in cur[len(prev) :]):
                raise RecordError(
                    f"{where}: field messages[{i}].role: the chat template renders nothing for role "
                    f"{turn['role']!r} (a role it does not know)"
                )
            if not cur.startswith(prev):
                raise RecordError(self._unstable(where, i))
            if turn["role"] == "assistant":
                head = self._text(turns[:i], where, generation_prompt=True) if i else prev
                if not (head.startswith(prev) and cur.startswith(head)):
                    raise RecordError(self._unstable(where, i))
                spans.append((len(head), len(cur)))
            prev = cur
        if self.generation_tags:
            out = self.tok.apply_chat_template(
                turns, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            ids = np.asarray(out["input_ids"], dtype=np.int64)
            target = np.asarray(out["assistant_masks"], dtype=bool)
        else:
            enc = self.tok(prev, add_special_tokens=False, return_offsets_mapping=True)
            ids = np.asarray(enc["input_ids"], dtype=np.int64)
            target = np.zeros(len(ids), dtype=bool)
            at = 0  # spans and offsets are both in order: one pass
            for j, (start, end) in enumerate(enc["offset_mapping"]):
                while at < len(spans) and start >= spans[at][1]:
                    at += 1
                if at == len(spans):
                    break
                if end > spans[at][0]:
                    target[j] = True
        if not target.any():
            raise RecordError(f"{where}: field 'messages': the chat template marks no assistant token")
        return ids, target

    @staticmethod
    def _unstable(where: str, i: int) -> str:
        return (
            f"{where}: field messages[{i}]: the chat template renders the conversation up to this turn "
            "differently from the whole, so its assistant tokens cannot be located; use a template "
            "with {% generation %} markers"
        )


_TOKENIZERS: dict[str, Any] = {}


def load_chat_tokenizer(model: str) -> Any:
    """The --model's tokenizer (chat data always uses a real one, whatever --shape)."""
    tok = _TOKENIZERS.get(model)
    if tok is None:
        from transformers import AutoTokenizer

        from training.model import local_model_dir

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
            "assistant_mask": renderer.method}  # fmt: skip


def segment_records(seg: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, record) of a segment in order; `where` names the file and the record."""
    import pyarrow.parquet as pq

    fs, path = shards.filesystem(seg.uri)
    with fs.open_input_file(path) as f:
        if seg.parquet:
            pf = pq.ParquetFile(f)
            columns = [c for c in FIELDS if c in pf.schema_arrow.names]
            row = sum(pf.metadata.row_group(rg).num_rows for rg in range(seg.start))
            for batch in pf.iter_batches(512, row_groups=list(range(seg.start, seg.end)), columns=columns):
                for record in batch.to_pylist():
                    yield f"{seg.uri}: row {row}", record
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
        where = f"{seg.uri}: line at byte {begin + at}"
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:  # worded as the text path words it (corpus.py)
                raise RecordError(f"{where}: malformed JSON ({exc.msg} at column {exc.colno})") from None
            except ValueError as exc:  # invalid UTF-8
                raise RecordError(f"{where}: malformed JSON ({exc})") from None
            if not isinstance(record, dict):
                raise RecordError(f"{where}: not a JSON object")
            yield where, record
        at = end + 1


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


def write_segment(seg: Any, settings: Any, out: str) -> dict[str, Any]:
    """Render, pack and write one segment's conversations (tokens at `out`, flags beside it)."""
    tok = load_chat_tokenizer(settings.model)
    renderer = ChatRenderer(tok, settings.model)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    seq = settings.seq_len
    fs, path = shards.filesystem(out)
    _, flags_path = shards.filesystem(out + shards.FLAGS_SUFFIX)
    kept = too_long = truncated = targets = 0
    with fs.open_output_stream(path) as tokens_out, fs.open_output_stream(flags_path) as flags_out:
        packer = _Packer(seq, int(pad), tokens_out, flags_out)
        top = 0  # the largest token id written: the manifest's bound for the vocabulary check
        for where, record in segment_records(seg):
            ids, target = renderer.render(conversation(record, where), where)
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
    # "skipped": chat records are used or refused (RecordError), never skipped; the keys of the
    # text path's rows (training/prepare.py), so both kinds of rows are tallied alike.
    return {"index": seg.index, "blocks": packer.blocks, "documents": kept, "dropped_tokens": 0,
            "bytes": packer.blocks * seq * shards.TOKEN_BYTES, "too_long": too_long,
            "truncated": truncated, "pad_tokens": packer.pad_tokens, "target_tokens": targets,
            "max_token": top, "skipped": json.dumps(corpus.Skipped().to_dict())}  # fmt: skip


def manifest_counts(counts: list[dict[str, Any]], too_long: str) -> dict[str, Any]:
    """The manifest's chat fields from the segments' counts (write_segment)."""
    keys = ("too_long", "truncated", "pad_tokens", "target_tokens")
    totals = {k: sum(int(r[k]) for r in counts) for k in keys}
    return {**totals, "data_format": "chat", "too_long_policy": too_long, "text_field": None,
            "dropped_too_long": totals["too_long"] - totals["truncated"]}  # fmt: skip


def counts_line(m: dict[str, Any]) -> str:
    return (
        f"[prepare] chat: {m['documents']} conversations, {m['target_tokens']:,} target tokens, "
        f"{m['too_long']} longer than --seq-len {m['seq_len']} ({m['truncated']} truncated, "
        f"{m['dropped_too_long']} dropped), {m['pad_tokens']:,} padding tokens"
    )

"""Which tokens of a chat-rendered conversation are the assistant's, by the tokenizer's own chat
template; and which token ends an answer (what generation stops at). torch-free.

The mask (ChatRenderer.render) covers each answer from the end of its generation prompt through
the template's end-of-turn token, nothing the template writes after that token (ChatML's "\\n"):
what the model generates when prompted, up to the token generation stops at.

- A template with `{% generation %}` markers: transformers' `return_assistant_tokens_mask`.
- Otherwise (most published templates: Qwen2.5/3, Llama 3.x, Mistral, Gemma 2/3) by rendering:
  for answer i, `head` = turns 0..i-1 with the generation prompt, `cur` = turns 0..i, and `full`
  = the whole conversation (the text trained on). Answer i is full[len(head):len(cur)] when head
  is a prefix of cur and cur a prefix of full: then the text before the answer is exactly the
  prompt the template writes at inference, and the answer exactly what it renders for it. A turn
  that renders nothing on its own is fine (Gemma 3 folds the system turn into the first user
  turn); a template that rewrites earlier text once later turns follow is refused, naming the
  turn and what to do (Qwen3 drops an earlier answer's <think> block; Mistral writes the system
  text only before the last user turn). Nothing is guessed.
- Every non-assistant turn must appear in `full` (a probe stands in for its content), or the
  record is refused: a role the template ignores would train an answer without its question.
The tokens overlapping an answer's characters are its tokens (the rule transformers applies to
the spans of generation markers).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
# Stands in for a turn's content; no template trims or rewrites it, and no text holds it.
_PROBE = "\ufdd0turn{}\ufdd0"
_MARKERS_HINT = "use a template with {% generation %} markers"


class RecordError(ValueError):
    """A record that cannot be used; the message names the file, the record and the field."""


class TemplateError(ValueError):
    """A tokenizer whose chat template cannot train a chat model; the message names --model."""


def _template(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one renders chats
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def end_of_turn_tokens(tokenizer: Any) -> list[int]:
    """The token ids the tokenizer's chat template ends an assistant turn with.

    Contract: the first special or added token the template writes after an answer's content
    (<|im_end|> for Qwen's ChatML, <|eot_id|> for Llama 3.x, </s> for Mistral, <end_of_turn> for
    Gemma 2/3), as a one-element list. It is what generation must stop at: a model fine-tuned
    here is trained to emit it (it is inside the loss mask), so an exported
    generation_config.json's eos_token_id must include it. It may differ from the tokenizer's
    eos_token (Gemma's is <eos>). Raises ValueError, naming why, when the tokenizer has no chat
    template, the template cannot render a user turn and an answer, or writes no such token
    after the answer (a model trained on it would not learn to stop).
    """
    if _template(tokenizer) is None:
        raise ValueError("the tokenizer has no chat template")
    answer = _PROBE.format("answer")
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": answer}]
    try:
        text = str(tokenizer.apply_chat_template(turns, tokenize=False))
    except Exception as exc:  # jinja's TemplateError, raise_exception() of the template
        raise ValueError(f"the chat template cannot render a user turn and an answer: {exc}") from None
    at = text.rfind(answer)
    if at < 0:
        raise ValueError("the chat template renders nothing of an answer's content")
    tail = text[at + len(answer) :]
    special = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    special.update(getattr(tokenizer, "all_special_ids", []) or [])
    for i in tokenizer(tail, add_special_tokens=False)["input_ids"]:
        if int(i) in special:
            return [int(i)]
    raise ValueError(
        f"the chat template ends an answer with {tail!r}, no special token: a model trained on it "
        "would not learn where to stop; use a template that closes assistant turns with the "
        "tokenizer's EOS or an end-of-turn token"
    )


class ChatRenderer:
    """Token ids and the assistant mask of a conversation, by the tokenizer's chat template."""

    def __init__(self, tokenizer: Any, name: str = "") -> None:
        template = _template(tokenizer)
        if template is None:
            raise TemplateError(
                f"--model: the tokenizer of {name!r} has no chat template (chat data needs one)"
            )
        try:
            self.end_ids = end_of_turn_tokens(tokenizer)
        except ValueError as exc:
            raise TemplateError(f"--model: the tokenizer of {name!r}: {exc}") from None
        self.tok = tokenizer
        self.generation_tags = bool(_GENERATION_TAG.search(template))
        self.method = "generation-markers" if self.generation_tags else "rendered-prefixes"
        self.end_text = tokenizer.convert_ids_to_tokens(self.end_ids[0])

    def _text(self, turns: list[dict[str, str]], where: str, generation_prompt: bool = False) -> str:
        try:
            text = self.tok.apply_chat_template(
                turns, tokenize=False, add_generation_prompt=generation_prompt
            )
        except Exception as exc:  # jinja's TemplateError, raise_exception() of the template
            raise RecordError(
                f"{where}: field 'messages': the chat template refuses it: {exc}; write the record "
                "as the model's template expects it (e.g. user and assistant turns alternating, and "
                "no system turn where it supports none: that text at the start of the first user turn)"
            ) from None
        return str(text)

    def _check_roles(self, turns: list[dict[str, str]], where: str) -> None:
        """Every turn but the answers must show in the rendered conversation."""
        probed = [
            t if t["role"] == "assistant" else {**t, "content": _PROBE.format(i)} for i, t in enumerate(turns)
        ]
        text = self._text(probed, where)
        for i, turn in enumerate(turns):
            if turn["role"] == "assistant" or _PROBE.format(i) in text:
                continue
            if turn["role"] == "system":
                raise RecordError(
                    f"{where}: field messages[{i}].role: the chat template renders nothing of this "
                    "'system' turn in this conversation (Mistral's templates drop it, or write it only "
                    "before a final user turn); put its text at the start of the first user turn"
                )
            raise RecordError(
                f"{where}: field messages[{i}].role: the chat template renders nothing for role "
                f"{turn['role']!r} (a role it does not know)"
            )

    def _spans(self, turns: list[dict[str, str]], full: str, where: str) -> list[tuple[int, int, int]]:
        """(turn, first char, end char) of each answer in `full`, by rendered prefixes."""
        spans: list[tuple[int, int, int]] = []
        for i, turn in enumerate(turns):
            if turn["role"] != "assistant":
                continue
            if i == 0:
                try:
                    head = str(self.tok.apply_chat_template([], tokenize=False, add_generation_prompt=True))
                except Exception:
                    raise RecordError(
                        f"{where}: field messages[0]: an answer with no turn before it, which the chat "
                        "template cannot render on its own; start the conversation with a user turn"
                    ) from None
            else:
                head = self._text(turns[:i], where, generation_prompt=True)
            cur = self._text(turns[: i + 1], where)
            if not cur.startswith(head) or (spans and len(head) < spans[-1][2]):
                raise RecordError(
                    f"{where}: field messages[{i}]: the chat template renders the turns before this "
                    "answer differently once the answer follows (Mistral's, for one, writes the system "
                    "text only before the last user turn), so the answer's prompt cannot be located; "
                    f"put the system text in the first user turn, or {_MARKERS_HINT}"
                )
            if not full.startswith(cur):
                raise RecordError(
                    f"{where}: field messages[{i}]: the chat template renders this answer differently "
                    "once later turns follow (Qwen3's drops the <think> block of an answer before the "
                    "last user turn), so the text trained would not be what the model generates there; give "
                    f"each answer its own record (the turns before it and the answer), or {_MARKERS_HINT}"
                )
            spans.append((i, len(head), len(cur)))
        return spans

    def render(self, turns: list[dict[str, str]], where: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64 [n], target bool [n]): the template's tokens of the whole conversation and
        its answers' tokens through their end-of-turn token."""
        self._check_roles(turns, where)
        if self.generation_tags:
            out = self.tok.apply_chat_template(
                turns, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            ids = np.asarray(out["input_ids"], dtype=np.int64)
            target = np.asarray(out["assistant_masks"], dtype=bool)
            edges = np.flatnonzero(np.diff(np.concatenate(([0], target.astype(np.int8), [0]))))
            runs: list[tuple[int | None, int, int]] = [
                (None, int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)
            ]
        else:
            full = self._text(turns, where)
            spans = self._spans(turns, full, where)
            enc = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
            ids = np.asarray(enc["input_ids"], dtype=np.int64)
            target = np.zeros(len(ids), dtype=bool)
            first = np.full(len(spans), len(ids))
            last = np.zeros(len(spans), dtype=np.int64)
            at = 0  # spans and offsets are both in order: one pass
            for j, (start, end) in enumerate(enc["offset_mapping"]):
                while at < len(spans) and start >= spans[at][2]:
                    at += 1
                if at == len(spans):
                    break
                if end > spans[at][1]:
                    first[at], last[at] = min(first[at], j), j + 1
            runs = [(i, int(a), int(b)) for (i, _, _), a, b in zip(spans, first, last, strict=True)]
            for _, a, b in runs:
                target[a:b] = True
        for i, a, b in runs:  # each answer ends at its end-of-turn token: generation stops there
            ends = np.flatnonzero(np.isin(ids[a:b], self.end_ids))
            if not len(ends):
                field = f"field messages[{i}]" if i is not None else "field 'messages'"
                raise RecordError(
                    f"{where}: {field}: the chat template's text of this answer does not include its "
                    f"end-of-turn token {self.end_text!r}, so the model would not learn to stop"
                    + ("" if i is not None else "; put it inside the {% generation %} block")
                )
            target[a + int(ends[-1]) + 1 : b] = False
        if not target.any():
            raise RecordError(f"{where}: field 'messages': the chat template marks no assistant token")
        return ids, target

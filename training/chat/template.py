"""Which tokens of a chat-rendered conversation are the assistant's, by the tokenizer's own chat
template; and which token ends an answer (what generation stops at). torch-free.

The mask (ChatRenderer.examples) covers each trained answer from the end of its generation prompt
through the template's end-of-turn token, nothing the template writes after that token (ChatML's
"\\n"): what the model generates when prompted, up to the token generation stops at.

- A template with `{% generation %}` markers: transformers' `return_assistant_tokens_mask`.
- Otherwise (most published templates: Qwen2.5/3, Llama 3.x, Mistral, Gemma 2/3) by rendering:
  for answer i, `head` = turns 0..i-1 with the generation prompt, `cur` = turns 0..i. Answer i is
  cur[len(head):] when head is a prefix of cur: then the text before the answer is exactly the
  prompt the template writes at inference, and the answer exactly what it renders for it. A turn
  that renders nothing on its own is fine (Gemma 3 folds the system turn into the first user
  turn); a template that writes the turns before an answer differently once the answer follows is
  refused, naming the turn and what to do (Mistral writes the system text only before the last
  user turn). Nothing is guessed.
- One conversation, several examples where the template rewrites history: the last trained answer's
  conversation (turns 0..i) is one example, holding every earlier trained answer that it renders as
  that answer's own `cur` (its text a prefix of the example's). An answer rendered otherwise once
  later turns follow (Qwen3 drops an earlier answer's reasoning once a user turn follows) gets an
  example of its own, ending with it: each answer is trained as the template renders it when the
  model generates it, reasoning included, the history before it as context, as Qwen3's model
  card says the history is written at inference (earlier answers without their thinking).
  A conversation of N such answers costs up to N examples, its history repeated as context, not
  trained. Turns after the last trained answer are not rendered (nothing there is trained).
- Per-turn flags (axolotl's per-message `train` / `weight` convention, read by
  training/methods/sft.py into `train`): an answer with train false is context, not trained.
- Fields other than role and content (Qwen3's `reasoning_content`, `tool_calls`, a record's
  `tools`) go to the template as they are, and must show in its text (probes stand in for their
  strings), or the record is refused naming the field: a field the template drops would be
  trained as if absent. `name` and `tool_call_id` are identifiers the template may use.
- Every non-assistant turn must appear in the text (a probe stands in for its content), or the
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

    def _text(self, turns: list[dict[str, Any]], where: str, generation_prompt: bool = False,
              tools: Any = None) -> str:  # fmt: skip
        try:
            text = self.tok.apply_chat_template(
                turns, tokenize=False, add_generation_prompt=generation_prompt, tools=tools
            )
        except Exception as exc:  # jinja's TemplateError, raise_exception() of the template
            raise RecordError(
                f"{where}: field 'messages': the chat template refuses it: {' '.join(str(exc).split())}; "
                "write the record as the model's template expects it (e.g. user and assistant turns "
                "alternating, and no system turn where it supports none: that text at the start of the "
                "first user turn)"
            ) from None
        return str(text)

    def _check_roles(self, turns: list[dict[str, Any]], where: str, tools: Any) -> None:
        """Every turn but the answers must show in the rendered conversation."""
        probed = [
            t if t["role"] == "assistant" else {**t, "content": _PROBE.format(i)} for i, t in enumerate(turns)
        ]
        text = self._text(probed, where, tools=tools)
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

    def _check_fields(self, turns: list[dict[str, Any]], where: str, tools: Any) -> None:
        """Every field that carries text besides role and content (reasoning, tool calls, the
        record's tools) shows in the template's text of the conversation up to its turn."""
        for i, turn in enumerate(turns):
            for field in sorted(set(turn) - _PLAIN_FIELDS):
                probed, probes = _probed(turn[field], f"{i}.{field}")
                if not probes:
                    continue
                text = self._text([*turns[:i], {**turn, field: probed}], where, tools=tools)
                if not all(p in text for p in probes):
                    raise RecordError(
                        f"{where}: field messages[{i}].{field}: the chat template renders "
                        f"{'only part' if any(p in text for p in probes) else 'nothing'} of it, so it "
                        f"would not be trained; {_FIELD_ADVICE.get(field, 'drop the field')}"
                    )
        if tools:
            probed, probes = _probed(tools, "tools")
            text = self._text(turns, where, tools=probed)
            if probes and not all(p in text for p in probes):
                raise RecordError(
                    f"{where}: field 'tools': the chat template renders nothing of the tools; "
                    f"{_FIELD_ADVICE['tools']}"
                )

    def _span(self, turns: list[dict[str, Any]], i: int, where: str, tools: Any) -> tuple[int, str]:
        """(where answer i starts, the text through answer i) as the template renders them when the
        model generates answer i."""
        if i == 0:
            try:
                head = str(self.tok.apply_chat_template([], tokenize=False, add_generation_prompt=True,
                                                        tools=tools))  # fmt: skip
            except Exception:
                raise RecordError(
                    f"{where}: field messages[0]: an answer with no turn before it, which the chat "
                    "template cannot render on its own; start the conversation with a user turn"
                ) from None
        else:
            head = self._text(turns[:i], where, generation_prompt=True, tools=tools)
        cur = self._text(turns[: i + 1], where, tools=tools)
        if not cur.startswith(head):
            raise RecordError(
                f"{where}: field messages[{i}]: the chat template renders the turns before this "
                "answer differently once the answer follows (Mistral's, for one, writes the system "
                "text only before the last user turn), so the answer's prompt cannot be located; "
                f"put the system text in the first user turn, or {_MARKERS_HINT}"
            )
        return len(head), cur

    def examples(
        self, turns: list[dict[str, Any]], where: str, tools: Any = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """[(ids int64 [n], target bool [n])]: the examples that train each answer (train not false)
        as the template renders it when generated, through its end-of-turn token; in order."""
        trained = [i for i, t in enumerate(turns) if t["role"] == "assistant" and t.get("train", True)]
        if not trained:
            raise RecordError(
                f"{where}: field 'messages': no assistant turn to train (every one is train: false)"
            )
        turns = [{k: v for k, v in t.items() if k != "train"} for t in turns]
        self._check_roles(turns, where, tools)
        self._check_fields(turns, where, tools)
        if self.generation_tags:
            return [self._marked(turns, trained, where, tools)]
        spans = {i: self._span(turns, i, where, tools) for i in trained}
        out: list[tuple[np.ndarray, np.ndarray]] = []
        left = list(trained)
        while left:
            full = spans[left[-1]][1]  # the conversation through the last answer left to train
            ends = 0
            covered = []
            for i in left:
                start, cur = spans[i]
                if full.startswith(cur) and start >= ends:
                    covered.append(i)
                    ends = len(cur)
            out.append(self._tokens(full, [(i, spans[i][0], len(spans[i][1])) for i in covered], where))
            left = [i for i in left if i not in covered]
        return out[::-1]

    def render(
        self, turns: list[dict[str, Any]], where: str, tools: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The one example of a conversation whose answers the template renders alike in the whole
        conversation (examples() for any conversation)."""
        found = self.examples(turns, where, tools)
        if len(found) != 1:
            raise RecordError(f"{where}: field 'messages': trains as {len(found)} examples (examples())")
        return found[0]

    def _marked(self, turns: list[dict[str, Any]], trained: list[int], where: str,
                tools: Any) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """The template's {% generation %} blocks, one per answer; untrained answers' cleared."""
        out = self.tok.apply_chat_template(
            turns, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, tools=tools
        )
        ids = np.asarray(out["input_ids"], dtype=np.int64)
        target = np.asarray(out["assistant_masks"], dtype=bool)
        edges = np.flatnonzero(np.diff(np.concatenate(([0], target.astype(np.int8), [0]))))
        runs = [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]
        answers = [i for i, t in enumerate(turns) if t["role"] == "assistant"]
        if len(trained) < len(answers):
            if len(runs) != len(answers):
                raise RecordError(
                    f"{where}: field 'messages': per-turn train flags need one {{% generation %}} block "
                    f"per answer; the template marks {len(runs)} for {len(answers)} answers"
                )
            for i, (a, b) in zip(answers, runs, strict=True):
                target[a:b] = i in trained
            runs = [r for i, r in zip(answers, runs, strict=True) if i in trained]
        self._end_each(ids, target, [(None, a, b) for a, b in runs], where)
        return ids, target

    def _tokens(
        self, full: str, spans: list[tuple[int, int, int]], where: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """The text's tokens and the mask of its answers' characters (turn, first char, end char)."""
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
        runs: list[tuple[int | None, int, int]] = [
            (i, int(a), int(b)) for (i, _, _), a, b in zip(spans, first, last, strict=True)
        ]
        for _, a, b in runs:
            target[a:b] = True
        self._end_each(ids, target, runs, where)
        return ids, target

    def _end_each(self, ids: np.ndarray, target: np.ndarray, runs: list[tuple[int | None, int, int]],
                  where: str) -> None:  # fmt: skip
        """Each answer ends at its end-of-turn token (generation stops there): nothing after it."""
        for i, a, b in runs:
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


# Turn fields that are not text to train, or that _check_roles checks.
_PLAIN_FIELDS = {"role", "content", "name", "tool_call_id"}
_FIELD_ADVICE = {
    "reasoning_content": "this model's template has no place for reasoning (Qwen3's has): drop the "
    "field, or write the reasoning into content if the model should learn to say it",
    "tool_calls": "this model's template renders no tool calls (Qwen2.5/3, Llama 3.1+ and Mistral's "
    "do; Llama 3.1 one call per turn): drop the turn or use such a model",
    "tools": "this model's template renders no tool definitions: drop the field or use a model whose "
    "template does (Qwen2.5/3, Llama 3.1+, Mistral)",
}


def _probed(value: Any, key: str) -> tuple[Any, list[str]]:
    """`value` with each non-empty string inside it replaced by a probe (ASCII: tojson keeps it
    as is), and the probes."""
    probes: list[str] = []

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            if not v:
                return v
            probes.append(f"@@probe-{key}-{len(probes)}@@")
            return probes[-1]
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):  # a call's "type" and "id" are identifiers, not text a template writes
            return {k: x if k in ("type", "id") else walk(x) for k, x in v.items()}
        return v

    return walk(value), probes

"""Turn fields besides role and content, rendered by the family's own template as at inference
(issue 50, items 6 and 7): Qwen3's reasoning (`reasoning_content`, or `<think>` in content) is
trained, multi-turn included, each answer as the template writes it when the model generates it;
tool calls and tool turns likewise; a field the template cannot render is refused naming it; a
per-turn train flag makes an answer context. Records go through training/methods/sft.py's reader,
as preparation reads them, and the families' published templates (bench/family_tokenizers.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from bench.family_tokenizers import family_tokenizer
from training.chat.template import ChatRenderer, RecordError
from training.methods.sft import conversation, record_tools

WHERE = "chats.jsonl: line at byte 42"
Q1, Q2 = {"role": "user", "content": "What is 2+3?"}, {"role": "user", "content": "Reverse abc"}
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
REASONED = {"role": "assistant", "content": "5", "reasoning_content": "2+3"}
NO_REASONING = r"messages\[1\]\.reasoning_content: the chat template renders nothing of it"


def _answers(family: str, record: dict[str, Any]) -> list[tuple[str, str]]:
    """[(prompt text, answer text)] of every trained answer, in order, over the record's examples."""
    tok = family_tokenizer(family)
    turns = conversation(record, WHERE)
    out = []
    for ids, target in ChatRenderer(tok, family).examples(turns, WHERE, tools=record_tools(record, WHERE)):
        edges = np.flatnonzero(np.diff(np.concatenate(([0], target.astype(np.int8), [0]))))
        for a, b in zip(edges[::2], edges[1::2], strict=True):
            out.append((tok.decode(ids[:a].tolist()), tok.decode(ids[a:b].tolist())))
    return out


def _prompt(family: str, turns: list[dict[str, Any]], tools: Any = None) -> str:
    return str(family_tokenizer(family).apply_chat_template(turns, tokenize=False, add_generation_prompt=True,
                                                            tools=tools))  # fmt: skip


def test_qwen3_reasoning_content_is_trained_inside_its_think_block() -> None:
    record = {"messages": [Q1, {"role": "assistant", "content": "5", "reasoning_content": "2 plus 3"}]}
    assert _answers("qwen3", record) == [
        (_prompt("qwen3", [Q1]), "<think>\n2 plus 3\n</think>\n\n5<|im_end|>")
    ]


@pytest.mark.parametrize("form", ["reasoning_content", "think in content"])
def test_qwen3_multi_turn_reasoning_trains_each_answer_as_generated(form: str) -> None:
    """Qwen3's template drops an earlier answer's reasoning once a user turn follows: the first
    answer is trained in an example of its own, with its reasoning; the second sees the first as
    the template writes history (no reasoning), as context."""

    def answer(text: str, why: str) -> dict[str, str]:
        if form == "reasoning_content":
            return {"role": "assistant", "content": text, "reasoning_content": why}
        return {"role": "assistant", "content": f"<think>\n{why}\n</think>\n\n{text}"}

    record = {"messages": [Q1, answer("5", "2 plus 3"), Q2, answer("cba", "backwards")]}
    first, second = _answers("qwen3", record)
    assert first == (_prompt("qwen3", [Q1]), "<think>\n2 plus 3\n</think>\n\n5<|im_end|>")
    assert second[1] == "<think>\nbackwards\n</think>\n\ncba<|im_end|>"
    assert second[0] == _prompt("qwen3", conversation(record, WHERE)[:3])
    assert "<|im_start|>assistant\n5<|im_end|>" in second[0] and "2 plus 3" not in second[0]


def test_qwen3_tool_calls_and_tool_turns_are_trained_as_the_template_writes_them() -> None:
    record = {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "sunny, 21 degrees", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "Sunny, 21 degrees."},
    ]}  # fmt: skip
    (p1, call), (p2, reply) = _answers("qwen3", record)
    turns = conversation(record, WHERE)
    assert (
        p1 == _prompt("qwen3", turns[:1], TOOLS) and '"name": "get_weather"' in p1
    )  # the tools, in the system turn
    assert call == (
        '<think>\n\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "\n</tool_call><|im_end|>"
    )
    assert (
        p2 == _prompt("qwen3", turns[:3], TOOLS)
        and "<tool_response>\nsunny, 21 degrees\n</tool_response>" in p2
    )
    assert reply == "<think>\n\n</think>\n\nSunny, 21 degrees.<|im_end|>"


@pytest.mark.parametrize("family", ["qwen2.5-instruct", "llama-3.1-instruct"])
def test_tool_calls_are_trained_where_the_template_renders_them(family: str) -> None:
    record = {"messages": [Q1, {"role": "assistant", "content": "", "tool_calls": [CALL]}]}
    ((_, call),) = _answers(family, record)
    assert "get_weather" in call and "Paris" in call


@pytest.mark.parametrize(
    ("family", "record", "field"),
    [
        ("qwen2.5-instruct", {"messages": [Q1, REASONED]}, NO_REASONING),
        ("llama-3.1-instruct", {"messages": [Q1, REASONED]}, NO_REASONING),
        ("gemma-3", {"messages": [Q1, {"role": "assistant", "content": "", "tool_calls": [CALL]}]},
         r"messages\[1\]\.tool_calls: the chat template renders nothing of it"),
        ("gemma-2", {"tools": TOOLS, "messages": [Q1, {"role": "assistant", "content": "5"}]},
         r"'tools': the chat template renders nothing of the tools"),
        ("qwen3", {"messages": [Q1, {"role": "assistant", "content": "5", "mood": "happy"}]},
         r"messages\[1\]\.mood: the chat template renders nothing of it, so it would not be trained; "
         r"drop the field"),
    ],
)  # fmt: skip
def test_a_field_the_template_cannot_render_is_refused_naming_it_and_the_line(
    family: str, record: dict[str, Any], field: str
) -> None:
    with pytest.raises(RecordError, match=rf"^{WHERE}: field {field}") as err:
        _answers(family, record)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("flag", [{"train": False}, {"weight": 0}])
@pytest.mark.parametrize("family", ["qwen2.5-instruct", "qwen3", "llama-3.1-instruct", "gemma-3"])
def test_an_answer_flagged_as_context_is_not_trained(family: str, flag: dict[str, Any]) -> None:
    record = {"messages": [Q1, {"role": "assistant", "content": "5", **flag}, Q2,
                           {"role": "assistant", "content": "cba"}]}  # fmt: skip
    ((prompt, answer),) = _answers(family, record)  # one example: only the last answer trains
    assert "cba" in answer and "5" not in answer
    assert prompt == _prompt(family, conversation(record, WHERE)[:3])


def test_prompt_and_completion_train_the_completion_only_as_trl_does() -> None:
    record = {"prompt": [Q1, {"role": "assistant", "content": "5"}, Q2],
              "completion": [{"role": "assistant", "content": "cba"}]}  # fmt: skip
    ((prompt, answer),) = _answers("qwen2.5-instruct", record)
    assert answer == "cba<|im_end|>" and "<|im_start|>assistant\n5<|im_end|>" in prompt


@pytest.mark.parametrize(
    ("turn", "match"),
    [
        ({"role": "user", "content": "hi", "train": True}, r"messages\[0\]: a 'user' turn marked trained"),
        ({"role": "assistant", "content": "x", "weight": 0.5}, r"messages\[0\]\.weight: 0 \(context"),
        ({"role": "assistant", "content": "x", "train": "no"}, r"messages\[0\]\.train: true or false"),
        (
            {"role": "assistant", "content": "x", "train": True, "weight": 0},
            r"messages\[0\]: train and weight disagree",
        ),
    ],
)
def test_bad_train_flags_are_one_line_naming_the_turn(turn: dict[str, Any], match: str) -> None:
    with pytest.raises(RecordError, match=rf"^{WHERE}: field {match}"):
        conversation({"messages": [turn, {"role": "assistant", "content": "y"}]}, WHERE)


def test_a_record_whose_answers_are_all_context_is_refused() -> None:
    with pytest.raises(RecordError, match="every assistant turn is context"):
        conversation({"messages": [Q1, {"role": "assistant", "content": "5", "train": False}]}, WHERE)


def test_with_generation_markers_a_context_answers_block_is_cleared() -> None:
    """A template with {% generation %} markers (transformers' assistant mask): the flagged
    answer's marked block is not trained, the other one is."""
    from bench import chat_tokenizer

    tok = chat_tokenizer.build(["What is 2+3? 5 Reverse abc cba"], generation_tags=True)
    renderer = ChatRenderer(tok)
    assert renderer.method == "generation-markers"
    record = {"messages": [Q1, {"role": "assistant", "content": "5", "weight": 0}, Q2,
                           {"role": "assistant", "content": "cba"}]}  # fmt: skip
    ((ids, target),) = renderer.examples(conversation(record, WHERE), WHERE)
    assert tok.decode(ids[target].tolist()) == "cba<|im_end|>"

"""The published chat templates of the common families (tests/fixtures/chat_templates, with their
sources) rendered through training/chat/template.py: exact assistant masks, each answer through
its family's end-of-turn token, or a refusal naming the record, the cause and what to do.

The tokenizers are built here (byte-level BPE with each family's control tokens added as special
tokens; nothing downloaded): the mask depends on the template's text and the tokens' character
offsets, not on the family's vocabulary."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import chat_tokenizer
from training.chat.template import ChatRenderer, RecordError, end_of_turn_tokens

TEMPLATES = Path(__file__).resolve().parents[2] / "fixtures" / "chat_templates"
QWEN = {
    "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "eos": "<|im_end|>",
    "pad": "<|endoftext|>",
}
LLAMA = {
    "special": [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|python_tag|>",
    ],
    "bos": "<|begin_of_text|>",
    "eos": "<|eot_id|>",
}
MISTRAL = {
    "special": [
        "<unk>",
        "<s>",
        "</s>",
        "[INST]",
        "[/INST]",
        "[TOOL_CALLS]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
    ],
    "bos": "<s>",
    "eos": "</s>",
}
GEMMA = {"special": ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>"],
         "bos": "<bos>", "eos": "<eos>", "pad": "<pad>"}  # fmt: skip
# template file: (special tokens, the end-of-turn token, how the template writes answer A)
FAMILIES: dict[str, tuple[dict[str, Any], str, str]] = {
    "qwen2.5-7b-instruct": (QWEN, "<|im_end|>", "{}<|im_end|>"),
    # Qwen3 writes an empty think block into the last answer (and into a generation prompt with thinking off).
    "qwen3-0.6b": (QWEN, "<|im_end|>", "<think>\n\n</think>\n\n{}<|im_end|>"),
    "llama-3.1-8b-instruct": (LLAMA, "<|eot_id|>", "{}<|eot_id|>"),
    "llama-3.2-3b-instruct": (LLAMA, "<|eot_id|>", "{}<|eot_id|>"),
    "mistral-7b-instruct-v0.3": (MISTRAL, "</s>", " {} </s>"),
    "mistral-nemo-instruct-2407": (MISTRAL, "</s>", "{}</s>"),
    "gemma-2-2b-it": (GEMMA, "<end_of_turn>", "{}<end_of_turn>"),
    "gemma-3-270m-it": (GEMMA, "<end_of_turn>", "{}<end_of_turn>"),
}  # fmt: skip
SYSTEM = [{"role": "system", "content": "Answer briefly."}]
FIRST = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"}]
SECOND = [{"role": "user", "content": "Reverse abc"}, {"role": "assistant", "content": "cba"}]
CASES = {
    "single": FIRST,
    "system": SYSTEM + FIRST,
    "multi": FIRST + SECOND,
    "multi+system": SYSTEM + FIRST + SECOND,
}
WHERE = "chats.jsonl: line at byte 42"
SYSTEM_DROPPED = (
    r"^chats.jsonl: line at byte 42: field messages\[0\].role: the chat template renders nothing of this "
    r"'system' turn in this conversation \(Mistral's templates drop it, .*\); "
    r"put its text at the start of the first user turn$"
)
GEMMA2_SYSTEM = (
    r"^chats.jsonl: line at byte 42: field 'messages': the chat template refuses it: "
    r"System role not supported; write the record as the model's template expects it"
)
REFUSED = {
    **{(name, case): SYSTEM_DROPPED for name in ("mistral-7b-instruct-v0.3", "mistral-nemo-instruct-2407")
       for case in ("system", "multi+system")},
    **{("gemma-2-2b-it", case): GEMMA2_SYSTEM for case in ("system", "multi+system")},
}  # fmt: skip


@cache
def family_tokenizer(name: str) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokens = FAMILIES[name][0]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=tokens["special"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(["What is 2+3? Answer briefly. Reverse abc cba"], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=tokens.get("bos"),
        eos_token=tokens["eos"],
        pad_token=tokens.get("pad"),
        chat_template=(TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"),
    )


def _runs(ids: np.ndarray, target: np.ndarray) -> list[tuple[int, int]]:
    edges = np.flatnonzero(np.diff(np.concatenate(([0], target.astype(np.int8), [0]))))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_masks_exactly_its_answers_through_the_end_of_turn_token(name: str, case: str) -> None:
    tok = family_tokenizer(name)
    turns = CASES[case]
    renderer = ChatRenderer(tok, name)
    assert renderer.method == "rendered-prefixes"  # none of them has {% generation %} markers
    if (name, case) in REFUSED:
        with pytest.raises(RecordError, match=REFUSED[name, case]):
            renderer.examples(turns, WHERE)
        return
    examples = renderer.examples(turns, WHERE)
    answers = [i for i, t in enumerate(turns) if t["role"] == "assistant"]
    # Qwen3 writes an earlier answer otherwise once a user turn follows: each answer its own example.
    assert len(examples) == (len(answers) if name == "qwen3-0.6b" else 1)
    end_id = tok.convert_tokens_to_ids(FAMILIES[name][1])
    found = []
    for ids, target in examples:
        runs = _runs(ids, target)
        last = answers[len(found) + len(runs) - 1]
        # The ids are the template's own tokens of the conversation through its last answer.
        assert (
            ids.tolist()
            == tok.apply_chat_template(turns[: last + 1], tokenize=True, return_dict=True)["input_ids"]
        )
        for a, b in runs:
            i = answers[len(found)]
            # Masked: the answer as the template writes it when generating it, through the end of turn.
            assert tok.decode(ids[a:b].tolist()) == FAMILIES[name][2].format(turns[i]["content"])
            assert ids[b - 1] == end_id
            # Before it: exactly the prompt the template writes for generating this answer.
            prompt = tok.apply_chat_template(turns[:i], tokenize=False, add_generation_prompt=True)
            assert tok.decode(ids[:a].tolist()) == prompt
            found.append(i)
    assert found == answers


def test_gemma3_folds_the_system_turn_into_the_first_user_turn() -> None:
    tok = family_tokenizer("gemma-3-270m-it")
    turns = CASES["system"]
    assert tok.apply_chat_template(turns[:1], tokenize=False) == "<bos>"  # nothing of its own
    ids, target = ChatRenderer(tok).render(turns, WHERE)
    (a, _b), = _runs(ids, target)  # fmt: skip
    assert tok.decode(ids[:a].tolist()) == (
        "<bos><start_of_turn>user\nAnswer briefly.\n\nWhat is 2+3?<end_of_turn>\n<start_of_turn>model\n"
    )


def test_qwen3_single_answers_keep_their_reasoning_in_the_mask() -> None:
    tok = family_tokenizer("qwen3-0.6b")
    turns = [FIRST[0], {"role": "assistant", "content": "<think>\n2 plus 3\n</think>\n\n5"}]
    ids, target = ChatRenderer(tok).render(turns, WHERE)
    assert [tok.decode(ids[a:b].tolist()) for a, b in _runs(ids, target)] == [
        "<think>\n2 plus 3\n</think>\n\n5<|im_end|>"
    ]


@pytest.mark.parametrize("name", ["mistral-nemo-instruct-2407", "gemma-2-2b-it", "gemma-3-270m-it"])
def test_roles_out_of_order_are_refused_with_what_to_do(name: str) -> None:
    turns = [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "c"},
    ]
    with pytest.raises(
        RecordError,
        match=r"^chats.jsonl: line at byte 42: field 'messages': the chat template refuses it: .*roles must "
        r"alternate user/assistant.*; write the record as the model's template expects it \(e.g. user and "
        r"assistant turns alternating",
    ):
        ChatRenderer(family_tokenizer(name)).render(turns, WHERE)


@pytest.mark.parametrize("name", FAMILIES)
def test_end_of_turn_tokens_name_what_generation_stops_at(name: str) -> None:
    tok = family_tokenizer(name)
    assert end_of_turn_tokens(tok) == [tok.convert_tokens_to_ids(FAMILIES[name][1])]
    if name.startswith("gemma"):  # not the EOS token: exports must add it to eos_token_id
        assert tok.eos_token_id not in end_of_turn_tokens(tok)


def test_a_template_that_ends_answers_with_no_special_token_is_refused() -> None:
    tok = chat_tokenizer.build(["Hi there"])
    tok.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    with pytest.raises(
        ValueError,
        match=r"^--model: the tokenizer of 'm': the chat template ends an answer with '\\n', no special "
        r"token: a model trained on it would not learn where to stop",
    ):
        ChatRenderer(tok, "m")


def test_generation_markers_must_include_the_end_of_turn_token() -> None:
    tok = chat_tokenizer.build(["Hi there"], generation_tags=True)
    tok.chat_template = tok.chat_template.replace(
        "{% generation %}{{- message.content + '<|im_end|>\\n' }}{% endgeneration %}",
        "{% generation %}{{- message.content }}{% endgeneration %}{{- '<|im_end|>\\n' }}",
    )
    assert "{% endgeneration %}{{- '<|im_end|>" in tok.chat_template
    with pytest.raises(
        RecordError,
        match=r"field 'messages': the chat template's text of this answer does not include its "
        r"end-of-turn token '<\|im_end\|>'.*inside the \{% generation %\} block",
    ):
        ChatRenderer(tok).render(FIRST, WHERE)


def test_qwen3_with_generation_markers_is_not_held_to_rendered_prefixes() -> None:
    """With markers the template says itself which tokens are the answers (here, to keep the edit
    small, only each answer's <|im_end|>): a conversation whose earlier answers it rewrites is then
    used as the markers say, not refused."""
    from transformers import PreTrainedTokenizerFast

    template = (TEMPLATES / "qwen3-0.6b.jinja").read_text(encoding="utf-8")
    tok = family_tokenizer("qwen3-0.6b")
    tool_branch = '\n    {%- elif message.role == "tool" %}'
    tagged = template.replace(
        "{{- '<|im_end|>\\n' }}" + tool_branch,
        "{% generation %}{{- '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}" + tool_branch,
    )
    assert tagged != template
    tok2 = PreTrainedTokenizerFast(
        tokenizer_object=tok.backend_tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=tagged,
    )
    renderer = ChatRenderer(tok2)
    assert renderer.method == "generation-markers"
    ids, target = renderer.render(CASES["multi"], WHERE)
    assert [tok.decode(ids[a:b].tolist()) for a, b in _runs(ids, target)] == ["<|im_end|>", "<|im_end|>"]


def test_prepare_refuses_such_a_template_in_one_line_naming_model(tmp_path: Path) -> None:
    """Before any record is read or any Ray task starts (exit 2 on the CLI)."""
    from training.options.train import OptionError
    from training.run.prepare import prepare

    tok = chat_tokenizer.build(["Hi there"])
    tok.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    tok.save_pretrained(tmp_path / "tok")
    data = tmp_path / "chats.jsonl"
    data.write_text('{"prompt": "Hi", "completion": "Hello"}\n')
    with pytest.raises(OptionError) as err:
        prepare(str(data), str(tmp_path / "out"), seq_len=64, shape="tiny", model=str(tmp_path / "tok"),
                data_format="chat", log=lambda _: None)  # fmt: skip
    assert str(err.value).startswith(
        f"--model: the tokenizer of '{tmp_path / 'tok'}': the chat template ends an answer with '\\n', "
        "no special token"
    )


def test_mistral_nemo_moving_the_system_text_to_a_final_user_turn_is_refused() -> None:
    """Ending with a user turn, the system text is written (before that turn), so the answer before
    it was trained without the system text its inference prompt holds."""
    turns = [*SYSTEM, *FIRST, {"role": "user", "content": "And 3+4?"}]
    with pytest.raises(
        RecordError,
        match=r"^chats.jsonl: line at byte 42: field messages\[2\]: the chat template renders the turns "
        r"before this answer differently once the answer follows .*; put the system text in the first user "
        r"turn",
    ):
        ChatRenderer(family_tokenizer("mistral-nemo-instruct-2407")).render(turns, WHERE)

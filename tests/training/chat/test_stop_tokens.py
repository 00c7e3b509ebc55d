"""An exported chat model stops after its answer (issue 41, item 2): generation_config.json lists
every token that ends a turn or a text, so a base tokenizer whose EOS (<|endoftext|>) is not the
template's end-of-turn (<|im_end|>) still stops greedy generation; config.json names the
architecture vLLM loads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import chat_tokenizer
from bench.family_tokenizers import RELEASES, family_tokenizer
from training.chat.stop_tokens import end_of_turn_ids, stop_token_ids
from training.checkpoint import dcp as checkpoint
from training.export.command import export

TURN = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "2+3?"},
    {"role": "assistant", "content": "5"},
]


def _ids(tok: Any, turns: list[dict[str, str]], **kw: Any) -> list[int]:
    return list(tok.encode(tok.apply_chat_template(turns, tokenize=False, **kw), add_special_tokens=False))


@pytest.fixture(scope="module")
def base_tok_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A base model's tokenizer: EOS <|endoftext|>; its chat template ends turns with <|im_end|>."""
    tok = chat_tokenizer.build(["What is 2+3? 5", chat_tokenizer.DEFAULT_SYSTEM] * 20)
    tok.eos_token = "<|endoftext|>"
    out = tmp_path_factory.mktemp("base-tok")
    tok.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def tok(base_tok_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_tok_dir)


def test_the_end_of_turn_token_comes_first_then_the_eos(tok: Any) -> None:
    im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert tok.eos_token_id == endoftext != im_end
    assert end_of_turn_ids(tok) == [im_end]
    # Declared ids the tokenizer lacks (a shape's default config) are left out; repeats too.
    assert stop_token_ids(tok, [endoftext, 999_999], None, im_end) == [im_end, endoftext]
    tok_without = type(tok).from_pretrained(tok.name_or_path)
    tok_without.chat_template = None
    assert stop_token_ids(tok_without) == [endoftext]


def test_greedy_generation_of_an_exported_chat_model_stops_after_its_answer(
    single_rank_group: None, base_tok_dir: str, tok: Any, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from training.model.build import build_model

    # A tiny model that has learnt the conversation, followed by another turn (never by <|endoftext|>).
    model = build_model("random", "tiny", "", seed=0)
    ids = torch.tensor([_ids(tok, TURN) * 2])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(120):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    ckpt = tmp_path / "ckpt"
    ref = {"init": "random", "shape": "tiny", "model": base_tok_dir}
    checkpoint.save(str(ckpt), model, optimizer, step=120, position=0, extra={"model_ref": ref})
    out = tmp_path / "model"
    export(str(ckpt), str(out), log=lambda _: None)

    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    exported = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    prompt = torch.tensor([_ids(tok, TURN[:2], add_generation_prompt=True)])
    new = exported.generate(prompt, max_new_tokens=24, do_sample=False)[0, prompt.shape[1] :].tolist()
    assert tok.decode(new) == "5<|im_end|>", tok.decode(new)
    # What the export wrote before: the tokenizer's EOS alone. The model talks on past its answer.
    on = exported.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=tok.eos_token_id)
    talk = tok.decode(on[0, prompt.shape[1] :])
    assert talk.startswith("5<|im_end|>") and len(on[0]) - prompt.shape[1] == 24, talk


@pytest.mark.parametrize("family", list(RELEASES))
def test_every_familys_end_of_turn_stops_generation_wherever_its_id_lies(family: str) -> None:
    """Tokenizers laid out as the releases are (bench/family_tokenizers.py): Qwen's <|im_end|>
    and Llama 3's <|eot_id|> are added tokens above the tokenizer's vocab_size, Mistral's </s> and
    Gemma's <end_of_turn> inside it; the base releases' EOS is not the end of turn."""
    tok = family_tokenizer(family)
    spec = RELEASES[family]
    end, eos = tok.convert_tokens_to_ids([spec.end_of_turn, spec.eos])
    assert (end >= tok.vocab_size) == spec.above_vocab
    assert end_of_turn_ids(tok) == [end]
    assert stop_token_ids(tok) == ([end, eos] if end != eos else [end])
    assert stop_token_ids(tok, eos, [end, len(tok)]) == stop_token_ids(
        tok
    )  # an id past the tokenizer: left out

"""LoRA on chat data is refused when a token that ends the answers has an untrained embedding (a
Llama 3 base release's <|eot_id|>): the adapters train no embedding, so the model would never learn
to stop. Checked on a real model and tokenizer, and through the trainer's own model building."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from bench import chat_tokenizer
from training.chat.template import end_of_turn_tokens
from training.common.errors import InputError
from training.model.build import shape_config
from training.model.lora import check_end_of_turn_trained, untrained_tokens


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    folder = tmp_path_factory.mktemp("base")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(shape_config("tiny"))
    tok = chat_tokenizer.build(["hello world"] * 10)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder), tok


def _with_zero_rows(folder: str, token_ids: list[int]) -> Any:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    with torch.no_grad():
        for t in token_ids:
            model.get_input_embeddings().weight[t] = 0
    return model


def test_an_untrained_end_of_turn_row_is_refused_naming_model_and_token(base: tuple[str, Any]) -> None:
    folder, tok = base
    ends = end_of_turn_tokens(tok)
    assert ends
    model = _with_zero_rows(folder, ends[:1])
    assert untrained_tokens(model, ends) == ends[:1]
    with pytest.raises(InputError) as err:
        check_end_of_turn_trained(model, tok, folder)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(
        f"--model: {folder}'s embedding or output row of {tok.convert_ids_to_tokens(ends[0])!r}"
    )
    assert "instruct release" in text and "no --lora-rank" in text


def test_trained_rows_pass_and_only_the_answers_end_tokens_count(base: tuple[str, Any]) -> None:
    folder, tok = base
    ends = set(end_of_turn_tokens(tok))
    other = next(t for t in range(tok.vocab_size) if t not in ends)
    check_end_of_turn_trained(_with_zero_rows(folder, []), tok, folder)  # nothing untrained
    check_end_of_turn_trained(_with_zero_rows(folder, [other]), tok, folder)  # not an answer's end


def test_the_trainer_checks_before_it_adds_adapters_for_chat_data_only(
    base: tuple[str, Any], tmp_path: Any
) -> None:
    """Trainer._build_model: pretrained weights with LoRA on chat data is checked; text data (no
    chat template ends its answers) is not."""
    from training.options.train import parse_args
    from training.run.trainer import Trainer

    folder, tok = base
    zeroed = tmp_path / "zeroed"
    _with_zero_rows(folder, end_of_turn_tokens(tok)).save_pretrained(zeroed)
    tok.save_pretrained(zeroed)
    opts = parse_args(
        ["--init", "pretrained", "--model", str(zeroed), "--data", "random", "--seq-len", "32",
         "--micro-batch-size", "1", "--num-workers", "1", "--steps", "1", "--lora-rank", "4"]
    )  # fmt: skip
    trainer: Any = object.__new__(Trainer)
    trainer.on_gpu, trainer.device, trainer.world = False, torch.device("cpu"), 1
    trainer.opts = dataclasses.replace(opts, data_format="chat")
    with pytest.raises(InputError, match="never learn to stop"):
        trainer._build_model(1)
    pytest.importorskip("peft")  # the text run goes on to add the adapters
    trainer.opts = dataclasses.replace(opts, data_format="text")
    model = trainer._build_model(1)
    assert any(".lora_" in name for name, _ in model.named_parameters())


def test_the_guard_checks_the_templates_end_of_turn_not_the_eos(tmp_path: Any) -> None:
    """A Llama 3.1 base release: EOS <|end_of_text|> (trained: it ends every pretraining document),
    end of turn <|eot_id|> (untrained), both added above the tokenizer's vocab_size
    (bench/family_tokenizers.py)."""
    from bench.family_tokenizers import save_family_tokenizer

    tok = save_family_tokenizer("llama-3.1-base", tmp_path)
    cfg = shape_config("tiny")
    cfg.vocab_size = 320  # more rows than the tokenizer's ids, as Llama 3's 128,256
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    eot, eos = tok.convert_tokens_to_ids(["<|eot_id|>", "<|end_of_text|>"])
    assert eot >= tok.vocab_size and eos != eot
    with pytest.raises(InputError, match=r"embedding or output row of '<\|eot_id\|>'"):
        check_end_of_turn_trained(_with_zero_rows(str(tmp_path), [eot]), tok, str(tmp_path))
    check_end_of_turn_trained(_with_zero_rows(str(tmp_path), [eos]), tok, str(tmp_path))  # EOS: not checked


@pytest.fixture(scope="module")
def untied_llama() -> tuple[Any, Any]:
    """Llama 3.1 8B's shape (untied: an lm_head of its own), narrowed, with a tokenizer that has the
    release's ids: base EOS <|end_of_text|> 128001, end of turn <|eot_id|> 128009."""
    from bench import family_tokenizers
    from training.model.shapes import narrowed

    fields = narrowed("llama-3.1-8b")
    assert fields["tie_word_embeddings"] is False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(shape_config(fields))
    return model, family_tokenizers.build("llama-3.1-8b", fields["vocab_size"])


def test_an_untied_models_untrained_output_row_is_refused(untied_llama: tuple[Any, Any]) -> None:
    model, tok = untied_llama
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    assert end_of_turn_tokens(tok) == [eot] and tok.eos_token_id != eot
    saved = model.lm_head.weight[eot].detach().clone()
    with torch.no_grad():
        model.lm_head.weight[eot] = 0  # the embedding row stays trained: only the head cannot emit it
    try:
        assert untrained_tokens(model, [eot]) == [eot]
        with pytest.raises(InputError, match=r"embedding or output row of '<\|eot_id\|>'"):
            check_end_of_turn_trained(model, tok, "meta-llama/Llama-3.1-8B")
    finally:
        with torch.no_grad():
            model.lm_head.weight[eot] = saved


def test_the_guard_reads_the_end_of_turn_token_not_the_eos(untied_llama: tuple[Any, Any]) -> None:
    model, tok = untied_llama
    eos, eot = tok.eos_token_id, tok.convert_tokens_to_ids("<|eot_id|>")
    with torch.no_grad():
        model.get_input_embeddings().weight[eos] = 0
        model.lm_head.weight[eos] = 0
    check_end_of_turn_trained(model, tok, "meta-llama/Llama-3.1-8B")  # the EOS ends no answer here
    with torch.no_grad():
        model.get_input_embeddings().weight[eot] = 0
    with pytest.raises(InputError, match="<\\|eot_id\\|>"):
        check_end_of_turn_trained(model, tok, "meta-llama/Llama-3.1-8B")

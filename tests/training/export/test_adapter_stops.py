"""A LoRA adapter on a base release stops at the chat template's end of turn when served (issue 50,
item 4): the base names <|endoftext|> (Qwen2.5-*B, Qwen3-*-Base) or <|end_of_text|> (Llama 3.x) its
EOS, the template ends every trained answer with <|im_end|> / <|eot_id|>, and nothing in the base's
folder says so. The adapter folder carries a generation_config.json listing the end of turn first
and a tokenizer naming it its EOS (training/export/lora.py, _serving_files, says who reads which).

Proved with peft's own loading and transformers' own stopping criterion, on a base laid out as
Qwen2.5-1.5B is (its control tokens added above the tokenizer's vocab_size), and for every family's
layout (bench/family_tokenizers.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.family_tokenizers import RELEASES, save_family_tokenizer
from training.checkpoint import dcp as checkpoint
from training.export.command import export
from training.model.lora_spec import LoraSpec

pytestmark = pytest.mark.dev_packages  # peft (tests/training/model/test_lora.py says why)

TURN = [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"}]
SPEC = LoraSpec(rank=8, alpha=16, dropout=0.0)
VOCAB = 320  # the model's rows: more than the tokenizer's ids, as Qwen's 151,936 for 151,665


def _base(folder: Path, family: str) -> Any:
    """A tiny pretrained-like base with family's tokenizer and a base release's generation
    config (eos_token_id the tokenizer's EOS only, as Qwen2.5-1.5B's generation_config.json)."""
    from transformers import AutoModelForCausalLM

    from training.model.build import shape_config

    tok = save_family_tokenizer(family, folder)
    cfg = shape_config("tiny")
    cfg.vocab_size = VOCAB
    cfg.eos_token_id = cfg.bos_token_id = tok.eos_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(folder)
    return tok


@pytest.fixture(scope="module")
def trained(single_rank_group: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """(base folder, LoRA checkpoint, tokenizer) of one optimizer step of adapters on a
    Qwen2.5-base-like model (what the export writes depends on the base's files, not on what
    the adapters learnt)."""
    from transformers import AutoModelForCausalLM

    from training.model.lora import apply_lora

    tmp = tmp_path_factory.mktemp("adapter-stops")
    base = tmp / "base"
    tok = _base(base, "qwen2.5-base")
    model = apply_lora(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), SPEC)
    ids = torch.tensor([tok.apply_chat_template(TURN, tokenize=True, return_dict=True)["input_ids"]])
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    ckpt = tmp / "ckpt"
    lora = {"rank": SPEC.rank, "alpha": SPEC.alpha, "dropout": SPEC.dropout, "targets": list(SPEC.targets)}
    ref = {"init": "pretrained", "shape": "", "model": str(base), "lora": lora}
    checkpoint.save(str(ckpt), model, optimizer, step=1, position=0, extra={"model_ref": ref})
    return base, ckpt, tok


def test_a_served_adapter_stops_at_the_end_of_turn_with_its_folders_files(
    trained: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    base, ckpt, tok = trained
    out = tmp_path / "adapter"
    export(str(ckpt), str(out), log=lambda _: None)
    im_end, endoftext = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert im_end >= tok.vocab_size  # above the tokenizer's vocab_size, as in Qwen2.5
    assert tok.eos_token_id == endoftext  # the base release's EOS
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [im_end, endoftext]
    # vLLM with --tokenizer ADAPTER (and earlier releases, a LoRA request's own tokenizer) stops
    # at the tokenizer's EOS: the end of turn. Its chat template is the base's, unchanged.
    served = AutoTokenizer.from_pretrained(out)
    assert (served.eos_token, served.eos_token_id) == ("<|im_end|>", im_end)
    assert served.chat_template == tok.chat_template and served.pad_token == tok.pad_token

    # peft keeps the base's generation config (EOS <|endoftext|> alone: the adapter talks on past
    # its answer); the folder's is what generate() is given, and it stops at <|im_end|>.
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(out)).eval()
    assert model.generation_config.eos_token_id == endoftext
    gen = GenerationConfig.from_pretrained(out)
    # generate() stops a sequence by transformers' EosTokenCriteria over generation_config.eos_token_id.
    from transformers.generation.stopping_criteria import EosTokenCriteria

    ids = torch.tensor([[1, 2, im_end]])  # an answer that has just ended its turn
    assert EosTokenCriteria(gen.eos_token_id)(ids, None).all()
    assert not EosTokenCriteria(model.generation_config.eos_token_id)(ids, None).any()


@pytest.mark.parametrize("family", ["qwen3-base", "llama-3.1-base", "gemma-2", "mistral-v0.3"])
def test_each_familys_adapter_lists_its_end_of_turn_first_then_the_bases_eos(
    trained: tuple[Path, Path, Any], tmp_path: Path, family: str
) -> None:
    """The same adapters exported onto bases of the same shape with each family's tokenizer."""
    from transformers import AutoTokenizer

    _, ckpt, _ = trained
    base = tmp_path / "base"
    tok = _base(base, family)
    out = tmp_path / "adapter"
    export(str(ckpt), str(out), model=str(base), log=lambda _: None)
    end, eos = tok.convert_tokens_to_ids([RELEASES[family].end_of_turn, RELEASES[family].eos])
    stops = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    assert stops == ([end, eos] if end != eos else end)
    assert AutoTokenizer.from_pretrained(out).eos_token == RELEASES[family].end_of_turn

"""Weight decay as the field applies it: 0.0 by default, and when set never on biases or norm gains
(Gemma 2's four norms per layer, Qwen3's q/k norms, Qwen2's attention biases), while matrices,
embeddings and LoRA's A and B are decayed as transformers' Trainer decays them."""

from __future__ import annotations

import re

import pytest

from training.model.build import build_model
from training.model.lora import apply_lora
from training.model.lora_spec import LoraSpec
from training.model.shapes import narrowed
from training.options.train import parse_args
from training.run.optimizer import build_optimizer, param_groups

# transformers' Trainer.get_decay_parameter_names: the names it never decays.
HF_NO_DECAY = re.compile(r"bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.)")


def test_weight_decay_defaults_to_zero() -> None:
    assert parse_args(["--shape", "tiny", "--data", "random"]).weight_decay == 0.0
    assert parse_args(["--shape", "tiny", "--data", "random", "--weight-decay", "0.1"]).weight_decay == 0.1


@pytest.mark.parametrize("name", ["gemma-2-2b", "gemma-3-4b", "qwen2.5-1.5b", "qwen3-4b", "llama-3.2-3b"])
def test_no_decay_on_biases_or_norm_gains_as_transformers_trainer(name: str) -> None:
    model = build_model("random", narrowed(name), "", seed=0)
    decay, rest = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
    ids = {id(p): n for n, p in model.named_parameters()}
    no_decay = {ids[id(p)] for p in rest["params"]}
    assert no_decay == {n for n in ids.values() if HF_NO_DECAY.search(n)}
    assert any("embed_tokens" in ids[id(p)] for p in decay["params"])
    if name.startswith("qwen2"):
        assert any(n.endswith("q_proj.bias") for n in no_decay)
    if name.startswith("gemma-2"):
        assert any("pre_feedforward_layernorm" in n for n in no_decay)


# peft: in the image it travels in the code asset (tests/training/test_vendored.py), not in .venv-image.
@pytest.mark.dev_packages
def test_lora_decays_its_adapters_and_nothing_frozen() -> None:
    model = build_model("random", narrowed("qwen3-4b"), "", seed=0)
    apply_lora(model, LoraSpec(rank=4, alpha=8, targets=("q_proj", "down_proj")))
    groups = param_groups(model, 0.05)
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.05  # A and B: matrices, no norm trained
    names = {n for n, p in model.named_parameters() if any(p is q for q in groups[0]["params"])}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.05, fused=False)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(names)

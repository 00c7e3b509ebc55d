"""The attention implementation per family: Gemma 2 soft-caps its attention logits, which SDPA
cannot (transformers 5.24 refuses sdpa for Gemma 2; 5.13 ignored the cap), so it trains with eager
attention, whose scores are capped; the other families keep SDPA. Built from the families' real
configs (training/model/configs/), narrowed."""

from __future__ import annotations

import pytest
import torch

from training.model.build import attention_implementation, build_model, shape_config
from training.model.shapes import CATALOGUE, narrowed

FAMILIES = ["gemma-2-2b", "gemma-3-4b", "qwen2.5-1.5b", "qwen3-4b", "llama-3.2-3b", "mistral-7b-v0.3"]


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_only_a_model_that_soft_caps_attention_leaves_sdpa(name: str) -> None:
    cfg = shape_config(name)
    capped = bool(getattr(cfg, "attn_logit_softcapping", None))
    assert capped == name.startswith("gemma-2")
    assert attention_implementation(cfg) == ("eager" if capped else "sdpa")


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_builds_and_its_attention_honours_its_soft_cap(name: str) -> None:
    model = build_model("random", narrowed(name), "", seed=0)
    cfg = model.config
    assert cfg._attn_implementation == attention_implementation(cfg)
    ids = torch.randint(0, 1000, (1, 48))
    with torch.no_grad():
        out = model(input_ids=ids).logits
    if not getattr(cfg, "attn_logit_softcapping", None):
        return
    # A cap so large that it does nothing, and a tiny one: the scores are capped, so the logits move.
    for layer in model.model.layers:
        layer.self_attn.attn_logit_softcapping = 1e-3
    with torch.no_grad():
        capped = model(input_ids=ids).logits
    assert not torch.allclose(out, capped, atol=1e-4)

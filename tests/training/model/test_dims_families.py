"""The sizing's parameter count (training/model/dims.py) against the model transformers builds, for
every family's real config narrowed, with and without tie_word_embeddings written: a config that
leaves it out gets its class's default (Gemma: tied, the embedding counted once; Llama, Mistral,
Qwen: an lm_head of its own, counted beside the embedding)."""

from __future__ import annotations

import pytest

from training.model.build import build_model
from training.model.dims import Dims
from training.model.shapes import narrowed
from training.sizing.flops import count_params

FAMILIES = ["gemma-2-2b", "gemma-3-4b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen3-4b", "qwen3-8b", "llama-3.1-8b",
            "llama-3.2-3b", "mistral-7b-v0.3"]  # fmt: skip


@pytest.mark.parametrize("written", [True, False])
@pytest.mark.parametrize("name", FAMILIES)
def test_the_parameter_count_is_the_built_models(name: str, written: bool) -> None:
    fields = narrowed(name, hidden=64, heads=2)
    if not written:
        fields.pop("tie_word_embeddings")
    model = build_model("random", fields, "", seed=0)
    dims = Dims.from_config(fields)
    assert dims.tied == bool(model.config.tie_word_embeddings)
    assert dims.params == count_params(model)

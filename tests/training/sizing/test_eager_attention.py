"""The memory plan counts what eager attention keeps for a soft-capped model (Gemma 2 trains with
eager attention: SDPA has no soft-cap): each layer's [heads, seq, seq] probabilities, which SDPA never
keeps. At 4,096 tokens that is more than the rest of a Gemma 2 layer's activations."""

from __future__ import annotations

import dataclasses

import pytest

from training.model.dims import Dims
from training.sizing.memory_plan import BF16, plan


def test_only_soft_capped_families_keep_attention_probabilities() -> None:
    assert Dims.of("gemma-2-2b").attn_softcap and Dims.of("gemma-2-9b").attn_softcap
    for name in ("gemma-3-4b", "qwen2.5-7b", "qwen3-8b", "llama-3.1-8b", "mistral-7b-v0.3"):
        assert not Dims.of(name).attn_softcap, name


@pytest.mark.parametrize("seq_len", [1024, 4096])
def test_gemma_2s_plan_holds_its_attention_probabilities(seq_len: int) -> None:
    dims = Dims.of("gemma-2-2b")
    capped = plan(dims, seq_len=seq_len, micro_batch=2)
    as_sdpa = plan(dataclasses.replace(dims, attn_softcap=False), seq_len=seq_len, micro_batch=2)
    probabilities = BF16 * 2 * seq_len * 3 * dims.heads * seq_len * dims.layers

    def activations(job: object) -> int:
        return next(t.bytes for t in job.moments["loss"] if t.name == "activations")  # type: ignore[attr-defined]

    assert activations(capped) - activations(as_sdpa) == probabilities
    if seq_len == 4096:  # more than the rest of the layers' activations: an OOM if left out
        assert probabilities > activations(as_sdpa)

"""The chunk rule for Liger's fused loss, against Liger's own formula."""

from __future__ import annotations

import pytest

from training.sizing.loss_chunks import chunk_mem_const, chunk_tokens
from training.sizing.memory_plan import Dims

QWEN = Dims.of("qwen2.5-1.5b")


def test_liger_default_runs_about_64_chunks_for_a_152k_vocabulary() -> None:
    # 32 tokens per chunk at 1 x 2048, 512 at 16 x 2048: ~64 passes over the lm_head weight either way.
    assert chunk_tokens(2048, QWEN.vocab, QWEN.hidden) == 32
    assert chunk_tokens(32768, QWEN.vocab, QWEN.hidden) == 512


@pytest.mark.parametrize(("tokens", "want"), [(2048, 2048), (4096, 4096), (16384, 4096), (32768, 4096)])
def test_mem_const_gives_chunks_of_the_asked_size(tokens: int, want: int) -> None:
    c = chunk_mem_const(tokens, QWEN.vocab, QWEN.hidden, 4096)
    assert chunk_tokens(tokens, QWEN.vocab, QWEN.hidden, c) == want


def test_zero_keeps_liger_default() -> None:
    assert chunk_mem_const(2048, QWEN.vocab, QWEN.hidden, 0) == 1

"""Data: packing, deterministic order, and the split of each global batch across workers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.data.batches import (
    EOS_BYTE,
    Batches,
    ByteTokenizer,
    pack,
    random_sequences,
    rank_slice,
    sequence_indices,
)
from training.options.train import SAMPLE_DATA


def test_byte_tokenizer_round_trip() -> None:
    tok = ByteTokenizer()
    text = "Grüße, 世界"
    assert bytes(tok.encode(text)).decode("utf-8") == text
    assert max(tok.encode(text)) < EOS_BYTE < tok.vocab_size


def test_pack_joins_documents_with_eos_and_drops_the_tail() -> None:
    blocks = pack([[1, 2, 3], [4, 5], [6, 7, 8, 9]], seq_len=4, eos=0)
    assert blocks.tolist() == [[1, 2, 3, 0], [4, 5, 0, 6], [7, 8, 9, 0]]
    assert pack([[1]], seq_len=4, eos=0).shape == (0, 4)
    assert pack([], seq_len=4, eos=0).shape == (0, 4)


@given(n_blocks=st.integers(1, 40), seed=st.integers(0, 2**31), epochs=st.integers(1, 3))
@settings(max_examples=40, deadline=None)
def test_each_epoch_is_a_permutation(n_blocks: int, seed: int, epochs: int) -> None:
    order = sequence_indices(0, n_blocks * epochs, n_blocks, seed)
    for e in range(epochs):
        assert sorted(order[e * n_blocks : (e + 1) * n_blocks]) == list(range(n_blocks))
    assert order == sequence_indices(0, n_blocks * epochs, n_blocks, seed)  # same seed, same order
    # Reading from the middle gives the same sequence as reading from the start.
    mid = n_blocks * epochs // 2
    assert sequence_indices(mid, len(order) - mid, n_blocks, seed) == order[mid:]


def test_seed_changes_order() -> None:
    assert sequence_indices(0, 50, 50, 1) != sequence_indices(0, 50, 50, 2)


@given(
    micro=st.integers(1, 4),
    accum=st.integers(1, 4),
    world=st.integers(1, 8),
    position=st.integers(0, 1000),
)
def test_ranks_split_the_global_batch_exactly(micro: int, accum: int, world: int, position: int) -> None:
    seen = []
    for rank in range(world):
        for mb in range(accum):
            first = rank_slice(position, micro, world, rank, mb)
            seen += list(range(first, first + micro))
    assert sorted(seen) == list(range(position, position + micro * accum * world))


def _global_batch(blocks: np.ndarray | None, world: int, micro: int, accum: int, position: int):
    rows = []
    for rank in range(world):
        # Every id of the test blocks (0 .. 37 x 16) is inside the vocabulary the reader checks.
        b = Batches(blocks, seq_len=16, vocab=1024, seed=3, micro=micro, accum=accum, world=world, rank=rank)
        rows += [r.tolist() for mb in range(accum) for r in b.micro_batch(position, mb)]
    return sorted(rows)


@pytest.mark.parametrize("real", [False, True])
def test_global_batch_independent_of_worker_count(real: bool) -> None:
    """What a resumed run on another worker count relies on: the same sequences per step."""
    blocks = np.arange(37 * 16, dtype=np.int32).reshape(37, 16) if real else None
    one = _global_batch(blocks, world=1, micro=2, accum=4, position=40)
    two = _global_batch(blocks, world=2, micro=2, accum=2, position=40)
    four = _global_batch(blocks, world=4, micro=1, accum=2, position=40)
    assert one == two == four
    assert one != _global_batch(blocks, world=1, micro=2, accum=4, position=48)


def test_random_sequences_depend_on_index_only() -> None:
    a = random_sequences(10, 4, 8, 100, seed=7)
    b = random_sequences(12, 2, 8, 100, seed=7)
    assert torch.equal(a[2:], b)
    assert not torch.equal(a, random_sequences(10, 4, 8, 100, seed=8))
    assert int(a.max()) < 100


def test_bundled_sample_is_small_and_usable() -> None:
    size = SAMPLE_DATA.stat().st_size
    assert 5_000 < size < 300_000
    docs = [json.loads(line)["text"] for line in SAMPLE_DATA.read_text().splitlines()]
    assert len(docs) >= 10 and all(d.strip() for d in docs)

"""Training data: random token ids, or token blocks prepared by training.run.prepare (training.data.shards).

The data position is the number of sequences consumed so far across all ranks. Sequence i of the
run is a pure function of (seed, i), so a resumed run, or one on a different worker count, sees the
same global batches in the same order.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

EOS_BYTE = 256  # the byte tokenizer's end-of-document id; ids 0-255 are raw UTF-8 bytes
Parts = tuple[torch.Tensor, torch.Tensor | None]  # token ids, and chat data's per-token flags


class ByteTokenizer:
    """Offline tokenizer for the tiny preset: UTF-8 bytes, then EOS. Nothing to download."""

    vocab_size = 257
    eos_token_id = EOS_BYTE

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


def load_tokenizer(shape: str, model: str) -> Any:
    if shape == "tiny":
        return ByteTokenizer()
    from transformers import AutoTokenizer

    from training.model.build import local_model_dir

    return AutoTokenizer.from_pretrained(local_model_dir(model, weights=False))


def pack(docs: Iterable[list[int] | np.ndarray], seq_len: int, eos: int) -> np.ndarray:
    """Concatenate documents, each followed by EOS, and cut into seq_len blocks (the tail is dropped)."""
    parts: list[np.ndarray] = []
    for doc in docs:
        parts.append(np.asarray(doc, dtype=np.int32))
        parts.append(np.array([eos], dtype=np.int32))
    if not parts:
        return np.zeros((0, seq_len), dtype=np.int32)
    stream = np.concatenate(parts)
    n = len(stream) // seq_len
    return stream[: n * seq_len].reshape(n, seq_len)


@functools.lru_cache(maxsize=2)  # the current epoch and, at a boundary, the next
def _epoch_order(n_blocks: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n_blocks)


def sequence_indices(position: int, count: int, n_blocks: int, seed: int) -> list[int]:
    """Block ids for global sequences [position, position + count): a fresh shuffle each epoch."""
    out = []
    for i in range(position, position + count):
        epoch, j = divmod(i, n_blocks)
        out.append(int(_epoch_order(n_blocks, seed, epoch)[j]))
    return out


def rank_slice(position: int, micro: int, world: int, rank: int, mb: int) -> int:
    """First global sequence of micro-batch mb on this rank, for a step starting at `position`.

    A step's global batch is [position, position + micro·accum·world); micro-batch mb of every
    rank comes before micro-batch mb + 1 of any rank.
    """
    return position + (mb * world + rank) * micro


def random_sequences(first: int, count: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    """Random token ids (the infrastructure check): sequence i depends only on (seed, i)."""
    rows = []
    for i in range(first, first + count):
        g = torch.Generator().manual_seed((seed * 1_000_003 + i) % (2**63))
        rows.append(torch.randint(0, vocab, (seq_len,), generator=g, dtype=torch.long))
    return torch.stack(rows)


class BlockRange:
    """Blocks [start, stop) of prepared data, as the same interface (len, take, take_flags): the
    training part and the held-out part of --eval-fraction."""

    def __init__(self, blocks: Any, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= len(blocks):
            raise ValueError(f"blocks [{start}, {stop}) of {len(blocks)}")
        self.blocks, self.start, self.stop = blocks, start, stop
        self.has_flags = bool(getattr(blocks, "has_flags", False))

    def __len__(self) -> int:
        return self.stop - self.start

    def _shift(self, indices: Any) -> list[int]:
        out = [self.start + int(i) for i in indices]
        if any(not self.start <= i < self.stop for i in out):
            raise IndexError(f"a block outside [0, {len(self)})")
        return out

    def take(self, indices: Any) -> np.ndarray:
        return np.asarray(self.blocks.take(self._shift(indices)))

    def take_flags(self, indices: Any) -> np.ndarray:
        return np.asarray(self.blocks.take_flags(self._shift(indices)))


class Batches:
    """Micro-batches for one rank. `blocks` is None for random data, else anything with len() and
    take(indices) -> [n, seq_len] array: an in-memory array (tests) or shards.TokenBlocks.

    Which blocks a micro-batch holds is a pure function of the data position, so the next ones are
    known in advance: with `prefetch`, a background thread reads the rest of this step's and the
    whole next step's micro-batches while the GPU computes (ranged reads from S3 take tens of ms).
    """

    def __init__(
        self,
        blocks: Any,
        *,
        seq_len: int,
        vocab: int,
        seed: int,
        micro: int,
        accum: int,
        world: int,
        rank: int,
        prefetch: bool = False,
        pin: bool = False,
    ):
        self.blocks, self.seq_len, self.vocab, self.seed = blocks, seq_len, vocab, seed
        self.micro, self.accum, self.world, self.rank = micro, accum, world, rank
        self.global_batch = micro * accum * world
        self._pool = ThreadPoolExecutor(1) if prefetch and blocks is not None else None
        self._pending: dict[tuple[int, int], Future[Parts]] = {}
        # CUDA: a host-to-device copy from pageable memory first waits for the stream to drain
        # ("a stream sync is performed before the copy is initiated": CUDA API synchronization
        # behavior), so the next micro-batch's copy would wait for this one's backward. From pinned
        # memory the copy is queued and the host goes on; the background thread pins.
        self.pin = pin

    def _read(self, position: int, mb: int) -> Parts:
        first = rank_slice(position, self.micro, self.world, self.rank, mb)
        idx = sequence_indices(first, self.micro, len(self.blocks), self.seed)
        rows = self.blocks[idx] if isinstance(self.blocks, np.ndarray) else self.blocks.take(idx)
        if rows.size and int(rows.max()) >= self.vocab:
            self._out_of_vocabulary(idx, rows)
        ids = torch.from_numpy(rows.astype(np.int64))
        flags = None
        if getattr(self.blocks, "has_flags", False):
            flags = torch.from_numpy(self.blocks.take_flags(idx))
        if self.pin:
            ids = ids.pin_memory()
            flags = flags.pin_memory() if flags is not None else None
        return ids, flags

    def _out_of_vocabulary(self, idx: list[int], rows: np.ndarray) -> None:
        """An id beyond the embedding table would end in an indexing error (a device-side assert
        on CUDA) deep inside the forward: name the block instead. Checking costs one max over
        micro x seq_len integers, in the prefetch thread."""
        from training.data.shards import ShardError

        row = int(np.argmax(rows.max(axis=1) >= self.vocab))
        where = self.blocks.where(idx[row]) if hasattr(self.blocks, "where") else f"block {idx[row]}"
        raise ShardError(
            f"{getattr(self.blocks, 'location', 'data')}: {where} holds token id {int(rows[row].max())}, "
            f"beyond the model's vocabulary of {self.vocab}: a shard changed after preparation, or "
            "it was prepared with another tokenizer; prepare the data again"
        )

    def micro_batch(self, position: int, mb: int) -> torch.Tensor:
        """Token ids [micro, seq_len] for micro-batch mb of the step whose batch starts at position."""
        return self.micro_batch_parts(position, mb)[0]

    def micro_batch_parts(self, position: int, mb: int) -> Parts:
        """(token ids [micro, seq_len], their flags or None): flags (uint8, training.data.shards'
        FLAG_TARGET and FLAG_START) only for chat data, whose loss is on some tokens only."""
        if self.blocks is None:
            first = rank_slice(position, self.micro, self.world, self.rank, mb)
            return random_sequences(first, self.micro, self.seq_len, self.vocab, self.seed), None
        if self._pool is None:
            return self._read(position, mb)
        # Keys of this micro-batch and of the next accum ones (the rest of the step, the next step).
        keys = []
        pos, m = position, mb
        for _ in range(self.accum + 1):
            keys.append((pos, m))
            pos, m = (pos, m + 1) if m + 1 < self.accum else (pos + self.global_batch, 0)
        for stale in [k for k in self._pending if k not in keys]:  # after a resume: another position
            self._pending.pop(stale).cancel()
        for key in keys:
            if key not in self._pending:
                self._pending[key] = self._pool.submit(self._read, *key)
        return self._pending.pop((position, mb)).result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

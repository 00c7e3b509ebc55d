"""Training data: random token ids, or text files tokenized and packed into fixed-length blocks.

The data position is the number of sequences consumed so far across all ranks. Sequence i of the
run is a pure function of (seed, i), so a resumed run, or one on a different worker count, sees the
same global batches in the same order.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

EOS_BYTE = 256  # the byte tokenizer's end-of-document id; ids 0-255 are raw UTF-8 bytes


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

    from training.model import local_model_dir

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


class Batches:
    """Micro-batches for one rank. `blocks` is None for random data."""

    def __init__(
        self,
        blocks: np.ndarray | None,
        *,
        seq_len: int,
        vocab: int,
        seed: int,
        micro: int,
        accum: int,
        world: int,
        rank: int,
    ):
        self.blocks, self.seq_len, self.vocab, self.seed = blocks, seq_len, vocab, seed
        self.micro, self.accum, self.world, self.rank = micro, accum, world, rank
        self.global_batch = micro * accum * world

    def micro_batch(self, position: int, mb: int) -> torch.Tensor:
        """Token ids [micro, seq_len] for micro-batch mb of the step whose batch starts at position."""
        first = rank_slice(position, self.micro, self.world, self.rank, mb)
        if self.blocks is None:
            return random_sequences(first, self.micro, self.seq_len, self.vocab, self.seed)
        idx = sequence_indices(first, self.micro, len(self.blocks), self.seed)
        return torch.from_numpy(self.blocks[idx].astype(np.int64))


def _tokenize_batch(batch: Any, *, field: str, shape: str, model: str) -> dict[str, Any]:
    tok = _TOKENIZERS.get((shape, model))
    if tok is None:
        tok = _TOKENIZERS[(shape, model)] = load_tokenizer(shape, model)
    texts = [t if isinstance(t, str) else "" for t in batch[field]]
    if isinstance(tok, ByteTokenizer):
        ids = [tok.encode(t) for t in texts]
    else:
        ids = tok(texts, add_special_tokens=False)["input_ids"]
    out = np.empty(len(ids), dtype=object)  # ragged: one int32 array per document
    for i, x in enumerate(ids):
        out[i] = np.asarray(x, dtype=np.int32)
    return {"ids": out}


_TOKENIZERS: dict[tuple[str, str], Any] = {}


def _read_local(path: str, field: str, parquet: bool) -> Any:
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=[field]) if parquet else pj.read_json(path)
    return table.select([field])


def build_blocks(files: list[str], *, field: str, shape: str, model: str, seq_len: int) -> np.ndarray:
    """Read jsonl/parquet with Ray Data, tokenize in parallel, and pack in file order.

    Remote files are read by Ray Data tasks on any node. Local files exist only where the driver
    runs (the head pod, which may offer no CPUs to tasks), so the driver reads them itself and
    hands the table to Ray Data for tokenizing.
    """
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # the packed order must not depend on timing
    parquet = files[0].endswith(".parquet")
    if all("://" in f for f in files):
        ds = ray.data.read_parquet(files) if parquet else ray.data.read_json(files)
    else:
        ds = ray.data.from_arrow([_read_local(f, field, parquet) for f in files])
    tokenize: Any = _tokenize_batch
    ds = ds.select_columns([field]).map_batches(
        tokenize,
        fn_kwargs={"field": field, "shape": shape, "model": model},
        batch_format="numpy",
    )
    eos = load_tokenizer(shape, model).eos_token_id
    if eos is None:
        raise ValueError("--model: the tokenizer has no EOS token to separate documents")
    docs = (row for batch in ds.iter_batches(batch_format="numpy") for row in batch["ids"])
    return pack(docs, seq_len, int(eos))

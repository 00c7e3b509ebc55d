"""Prepared data written straight from arrays (tests and benchmarks): the manifest and shard
layout of training/data/shards.py, text format without flags, chat format with them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from training.data import shards


def write_prepared(
    location: Path, tokens: np.ndarray, flags: np.ndarray | None = None, vocab: int = 257
) -> str:
    """One shard of `tokens` [blocks, seq_len] (and their flags: chat format) under `location`."""
    (location / "shards-b").mkdir(parents=True)
    tokens.astype(shards.DTYPE).tofile(location / "shards-b" / "00000.bin")
    if flags is not None:
        flags.astype(np.uint8).tofile(location / "shards-b" / f"00000.bin{shards.FLAGS_SUFFIX}")
    rows = [{"name": "shards-b/00000.bin", "blocks": len(tokens), "bytes": tokens.size * shards.TOKEN_BYTES}]
    manifest = {"format": shards.CHAT_FORMAT if flags is not None else shards.FORMAT,
                "seq_len": int(tokens.shape[1]), "fingerprint": ("c" if flags is not None else "t") * 64,
                "blocks": len(tokens), "shards": rows,
                "tokenizer": {"name": "byte", "vocab_size": vocab}}  # fmt: skip
    shards.write_manifest(str(location), manifest)
    return str(location)


def packed_chat_flags(n_blocks: int, seq_len: int, lengths: tuple[int, int], answer_share: float,
                      seed: int = 0) -> np.ndarray:  # fmt: skip
    """Flags of blocks packed like training/methods/sft.py packs conversations: whole conversations of
    random lengths, each starting a segment, its last `answer_share` of tokens targets, the rest
    of a block padding (a segment of its own, no targets)."""
    rng = np.random.default_rng(seed)
    flags = np.zeros((n_blocks, seq_len), dtype=np.uint8)
    for row in range(n_blocks):
        at = 0
        while True:
            n = int(rng.integers(lengths[0], lengths[1] + 1))
            if at + n > seq_len:
                break
            flags[row, at] = shards.FLAG_START
            flags[row, at + n - max(1, int(answer_share * n)) : at + n] |= shards.FLAG_TARGET
            at += n
        if at < seq_len:
            flags[row, at] = shards.FLAG_START
    return flags

"""Text (non-chat) data: each document starts with the BOS its tokenizer adds (Gemma, Llama 3,
Mistral; none for Qwen), and packed documents neither attend to each other nor are predicted from the
one before (flags: training/data/shards.py TEXT_FORMAT), with the families' real configs and
tokenizers shaped like theirs (bench/family_tokenizers.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bench import family_tokenizers
from training.data import shards
from training.methods.loss import IGNORE_INDEX, labels_and_positions
from training.model.build import build_model
from training.model.shapes import SHAPES, narrowed
from training.run.prepare import Segment, Settings, bos_id, write_segment

DOCS = ["The first document.", "A second, longer document about rivers.", "Third.", "And a fourth one here."]
SEQ = 24


def _prepare(tmp: Path, family: str) -> tuple[np.ndarray, np.ndarray, object]:
    tok = family_tokenizers.build(family, SHAPES[family]["vocab_size"])
    folder = tmp / family
    tok.save_pretrained(folder)
    data = tmp / f"{family}.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS))
    seg = Segment(index=0, uri=str(data), parquet=False, start=0, end=data.stat().st_size)
    settings = Settings(
        seq_len=SEQ, text_field="text", shape=family, model=str(folder), segment_bytes=1 << 20
    )
    out = tmp / f"{family}.bin"
    counts = write_segment(seg, settings, str(out))
    tokens = np.fromfile(out, dtype=shards.DTYPE).reshape(-1, SEQ)
    flags = np.fromfile(str(out) + shards.FLAGS_SUFFIX, dtype=np.uint8).reshape(-1, SEQ)
    assert counts["blocks"] == len(tokens) == len(flags) > 1
    return tokens, flags, tok


@pytest.mark.parametrize(
    ("family", "bos"), [("gemma-2-2b", 2), ("llama-3.2-3b", 128000), ("qwen2.5-1.5b", None)]
)
def test_documents_start_with_the_bos_the_tokenizer_adds_and_are_flagged(
    tmp_path: Path, family: str, bos: int | None
) -> None:
    tokens, flags, tok = _prepare(tmp_path, family)
    assert bos_id(tok) == bos
    stream, fl = tokens.ravel(), flags.ravel()
    starts = np.flatnonzero(fl & shards.FLAG_START)
    eos = tok.eos_token_id
    assert starts[0] == 0 and len(starts) >= 3
    for s in starts:
        if bos is not None:
            assert stream[s] == bos
        if s:
            assert stream[s - 1] == eos  # the document before ends with EOS
    first = tok(DOCS[0], add_special_tokens=False)["input_ids"]
    head = [] if bos is None else [bos]
    assert stream[: len(head) + len(first) + 1].tolist() == [*head, *first, eos]
    # Every token is a target but a document's first: nothing predicts it from the document before.
    assert ((fl & shards.FLAG_TARGET) != 0).tolist() == ((fl & shards.FLAG_START) == 0).tolist()


@pytest.mark.parametrize("family", ["gemma-2-2b", "qwen3-4b"])
def test_packed_documents_do_not_attend_to_each_other(tmp_path: Path, family: str) -> None:
    tokens, flags, _ = _prepare(tmp_path, family)
    ids, fl = torch.from_numpy(tokens[:1].astype("int64")), torch.from_numpy(flags[:1])
    labels, positions = labels_and_positions(ids, fl)
    assert positions is not None
    starts = torch.nonzero(fl[0] & shards.FLAG_START).ravel().tolist()
    second = starts[1] if starts[0] == 0 else starts[0]
    assert positions[0, second] == 0 and labels[0, second] == IGNORE_INDEX
    model = build_model("random", narrowed(family), "", seed=0).eval()
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions).logits[0, second:]
        alone = model(input_ids=ids[:, second:]).logits[0]  # the rest of the block, from its own start
    # What follows a document's start sees only its own document: as if the block began there.
    end = starts[starts.index(second) + 1] if starts.index(second) + 1 < len(starts) else ids.shape[1]
    torch.testing.assert_close(packed[: end - second], alone[: end - second], rtol=1e-4, atol=1e-4)

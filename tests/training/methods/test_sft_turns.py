"""Preparation of Qwen3 reasoning and tool-call data (issue 50, items 6 and 7), from jsonl and from
parquet (whose struct columns give every turn every field, null where a turn has none): a
multi-turn reasoning conversation becomes one example per answer, each answer's reasoning in its
mask; the parquet rows train exactly what the jsonl lines do."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench.family_tokenizers import save_family_tokenizer
from tests.training.methods.test_sft import _read
from training.data import shards
from training.methods.sft import write_segment
from training.run.prepare import Segment, Settings

CALL = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
RECORDS = [
    {"messages": [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "5", "reasoning_content": "2 plus 3"},
        {"role": "user", "content": "Reverse abc"},
        {"role": "assistant", "content": "cba", "reasoning_content": "backwards"},
    ]},
    {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "Sunny.", "train": False},
    ]},
]  # fmt: skip
SEQ = 256


def _prepare(tmp_path: Path, name: str, parquet: bool) -> tuple[dict, np.ndarray, np.ndarray]:
    data = tmp_path / name
    if parquet:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(RECORDS), data)
        seg = Segment(0, str(data), True, 0, 1)
    else:
        data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
        seg = Segment(0, str(data), False, 0, data.stat().st_size)
    settings = Settings(
        SEQ, "text", "tiny", str(tmp_path / "tok"), 1 << 20, data_format="chat", too_long="drop"
    )
    counts = write_segment(seg, settings, str(tmp_path / f"{name}.bin"))
    tokens, flags = _read(tmp_path / f"{name}.bin", SEQ)
    return counts, tokens, flags


def test_reasoning_and_tool_calls_prepare_alike_from_jsonl_and_parquet(tmp_path: Path) -> None:
    tok = save_family_tokenizer("qwen3", tmp_path / "tok")
    counts, tokens, flags = _prepare(tmp_path, "c.jsonl", parquet=False)
    # Two examples for the reasoning conversation (Qwen3 rewrites the first answer once a user
    # turn follows), one for the tool call (its last answer is context).
    assert counts["documents"] == 3
    target = (flags & shards.FLAG_TARGET).astype(bool)
    answers = []
    for block, mask in zip(tokens, target, strict=True):
        edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
        answers += [tok.decode(block[a:b].tolist()) for a, b in zip(edges[::2], edges[1::2], strict=True)]
    assert answers == [
        "<think>\n2 plus 3\n</think>\n\n5<|im_end|>",
        "<think>\nbackwards\n</think>\n\ncba<|im_end|>",
        '<think>\n\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>",
    ]
    p_counts, p_tokens, p_flags = _prepare(tmp_path, "c.parquet", parquet=True)
    assert p_counts["documents"] == counts["documents"]
    np.testing.assert_array_equal(p_tokens, tokens)
    np.testing.assert_array_equal(p_flags, flags)

"""bench/sft_task.py: a held-out split that never overlaps training, records the chat template
renders, and the exact-match check run on a model folder through transformers alone."""

from __future__ import annotations

import json
from pathlib import Path

from bench import sft_task
from training.sft import ChatRenderer, conversation


def test_task_split_tokenizer_and_check(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.model import build_model

    made = sft_task.make(tmp_path / "task", 300, 40, seed=3)
    assert (made["train"], made["eval"]) == (300, 40)
    read = [
        [json.loads(x) for x in (tmp_path / "task" / f).read_text().splitlines()]
        for f in ("train.jsonl", "eval.jsonl")
    ]
    prompts = [{r["messages"][0]["content"] for r in recs} for recs in read]
    assert not prompts[0] & prompts[1] and len(prompts[1]) == 40
    tok = AutoTokenizer.from_pretrained(tmp_path / "task" / "tokenizer")
    assert len(tok) <= 264  # fits --shape tiny
    renderer = ChatRenderer(tok)
    for record in read[1]:
        renderer.render(conversation(record, "eval"), "eval")

    model_dir = tmp_path / "model"
    build_model("random", "tiny", "", seed=0).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    assert AutoModelForCausalLM.from_pretrained(model_dir) is not None
    got = sft_task.check(str(model_dir), str(tmp_path / "task" / "eval.jsonl"), limit=5)
    assert got["prompts"] == 5 and 0 <= got["exact"] <= 5

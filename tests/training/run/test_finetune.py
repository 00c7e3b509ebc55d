"""A fine-tuning run end to end on local Ray: chat records prepared with the tokenizer's template,
trained with the loss on the answers, evaluated on a held-out file, exported as a model folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import chat_tokenizer
from tests.training.methods.test_sft import CHATS, CORPUS
from training.reporting import emf
from training.reporting.summary import SUMMARY_FILE

pytestmark = [pytest.mark.ray, pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")]


def test_chat_run_evaluates_and_exports(
    ray_session: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.__main__ import main

    tok_dir = tmp_path / "tok"
    chat_tokenizer.build(CORPUS).save_pretrained(tok_dir)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CHATS * 12))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CHATS[:2] * 3))
    storage = tmp_path / "storage"
    rc = main(
        ["--init", "random", "--shape", "tiny", "--model", str(tok_dir),
         "--data", str(tmp_path / "train.jsonl"),
         "--eval-data", str(tmp_path / "eval.jsonl"), "--seq-len", "128", "--steps", "4", "--eval-every", "2",
         "--checkpoint-every", "2", "--micro-batch-size", "2", "--num-workers", "2", "--lr", "1e-3",
         "--run-name", "ft", "--output-dir", str(tmp_path / "out"), "--storage-path", str(storage)]
    )  # fmt: skip
    captured = capsys.readouterr()
    out = captured.out
    assert rc == 0, out
    # Quiet logs (issue 41): neither Ray Train's report records nor Ray Data's progress blocks nor
    # torchao's import notes on the console, from the driver or the workers (training/run/quiet.py).
    console = out + captured.err
    for chatter in ("TrainingReport(", "Running Dataset", "Execution plan of Dataset", "Failed to load"):
        assert chatter not in console, chatter
    assert "[prepare] chat: 48 examples" in out and "eval loss" in out
    summary = json.loads((tmp_path / "out" / SUMMARY_FILE).read_text())
    assert [h["step"] for h in summary["history"] if "eval_loss" in h] == [2, 4]
    # An evaluating step's record (the loop's per-step metrics) carries the held-out CloudWatch
    # metrics too, under the names the dashboard plots.
    record = emf.emf_record(summary["history"][-1], cluster="c", run_name="ft", timestamp_ms=1)
    assert {emf.EVAL_LOSS, emf.EVAL_PERPLEXITY, emf.EVAL_ACCURACY} <= set(record)
    assert summary["eval"]["step"] == 4 and summary["eval"]["eval_tokens"] > 0
    assert all(h["target_tokens"] > 0 for h in summary["history"])
    assert summary["options"]["data_format"] == "chat"
    model_dir = storage / "ft" / "model"
    assert summary["model"] == str(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    assert tok.chat_template and model.config.vocab_size == 264

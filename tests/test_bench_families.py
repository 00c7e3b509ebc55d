"""bench/families.py's CPU path, tiny: one family (Mistral's real config narrowed, its release's token
ids and template) full and LoRA through the loop's trainer on gloo, its held-out loss against the
model's own, its export loaded back and generating (the GPU run and its table: BENCHMARKS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.dev_packages  # peft: the LoRA row


def test_each_method_trains_evaluates_exports_and_generates_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "families.py"), "--cpu", "--families", "mistral-7b-v0.3",
         "--steps", "2", "--seq-len", "64", "--jobs", "2", "--work", str(tmp_path / "work"),
         "--out", str(out)],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=900,
    )  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    assert len(rows) == 2, proc.stderr[-3000:]
    by_method = {r["method"]: r for r in rows}
    for method, export in (("full", "model"), ("lora", "adapter")):
        row = by_method[method]
        assert "error" not in row, row
        assert row["family"] == "mistral-7b-v0.3" and row["model_type"] == "mistral"
        assert row["device"] == "cpu" and row["fsdp2"] and not row["compile"] and not row["liger"]
        assert row["attention"] == "sdpa" and row["steps"] == 2
        assert row["loss_match"] and row["loss_diff"] <= 1e-3
        assert row["export"] == export and row["end_of_turn_id"] == 2  # </s>
        assert row["generated_tokens"] > 0
    # Two steps teach nothing: the rows say so rather than passing (the GPU run trains 20).
    assert proc.returncode == (0 if all(r["ok"] for r in rows) else 1)

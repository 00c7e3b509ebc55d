"""The throughput benchmark's own arithmetic (the runs themselves need a GPU: BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load("train_throughput")


def test_worker_counts() -> None:
    assert bench._worker_counts("2,1,2") == [1, 2]
    assert bench._worker_counts(None) is None
    for bad in ("0", "a,b", "1,-2", ","):
        with pytest.raises(argparse.ArgumentTypeError):
            bench._worker_counts(bad)


def test_comparisons_ratio_at_the_smallest_count_and_scaling() -> None:
    results = {
        ("original", 1): {"tokens_per_s": 40.0, "tokens_per_s_per_gpu": 40.0, "peak_mem_gib": 80.0},
        ("ours", 1): {"tokens_per_s": 60.0, "tokens_per_s_per_gpu": 60.0, "peak_mem_gib": 40.0},
        ("ours", 2): {"tokens_per_s": 114.0, "tokens_per_s_per_gpu": 57.0, "peak_mem_gib": 32.0},
    }
    lines = bench.comparisons(results, ["original", "ours"], [1, 2])
    assert lines == [
        {"config": "ours", "workers": 1, "speedup_vs_original": 1.5, "memory_vs_original": 0.5},
        {"config": "ours", "workers": 2, "scaling_efficiency_vs_1": 0.95},
    ]


def test_bad_config_name_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--configs", "ours,turbo"])
    assert exc.value.code == 2
    assert "unknown configs ['turbo']" in capsys.readouterr().err


def test_attention_flops_formula() -> None:
    attn = _load("attention_backends")
    # causal forward = half of 4·B·H·S²·D; forward + backward = 3.5x that
    assert attn.attention_flops(1, 1, 4, 2) == 4 * 16 * 2 / 2 * 3.5

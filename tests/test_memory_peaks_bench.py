"""bench/memory_peaks.py: its variant grammar, and one real run end to end on the CPU (tiny shape).

The peaks themselves need a GPU (the lead runs it; results feed training/sizing/memory_plan.py's tests)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("memory_peaks", ROOT / "bench" / "memory_peaks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load()


def test_variant_names_map_to_the_loop_options() -> None:
    assert bench.parse_variant("compile") == {
        "compile": True,
        "activation_checkpointing": False,
        "float8": False,
    }
    assert bench.parse_variant("eager-ac-float8") == {
        "compile": False,
        "activation_checkpointing": True,
        "float8": True,
    }
    for bad in ("ac", "compile-ac-ac", "eager-fp8", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_variant(bad)


def test_float8_variant_is_refused_without_fp8_tensor_cores(capsys: pytest.CaptureFixture[str]) -> None:
    if bench.float8_available():
        pytest.skip("this machine runs float8")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--variants", "compile-float8"])
    assert exc.value.code == 2
    assert "float8 needs torchao and a GPU with FP8 tensor cores" in capsys.readouterr().err


def test_one_json_line_per_point_through_the_real_model_code() -> None:
    # A real world-size-1 gloo run of the tiny shape: proves the bench drives training.model.build's
    # build/shard/step path with accumulation (the GPU fields are null on the CPU).
    args = ["--device", "cpu", "--shape", "tiny", "--seq-len", "32", "--batches", "2,1", "--accum", "2"]
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "memory_peaks.py"),
            *args,
            "--variants",
            "eager",
            "--steps",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [(p["micro_batch"], p["accum"]) for p in lines] == [(1, 2), (2, 2)]
    assert all(p["variant"] == "eager" and p["world"] == 1 and "oom" not in p for p in lines)

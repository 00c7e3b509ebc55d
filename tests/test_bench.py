"""The throughput benchmark's own arithmetic (the runs themselves need a GPU: BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

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
    lines = bench.comparisons(results, ["ours", "original", "ours"], [1, 2])
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


convergence = _load("float8_convergence")


def _losses(tail_value: float, steps: int = 10) -> dict[str, list[float]]:
    return {"losses": [5.0] * (steps - 4) + [tail_value] * 4}


def test_float8_comparison_pairs_orders_and_judges_against_the_bf16_spread() -> None:
    rows = {
        ("bf16", 0): _losses(2.00),
        ("bf16", 1): _losses(1.95),
        ("bf16", 2): _losses(2.05),
        ("float8", 0): _losses(2.08),
        ("float8", 1): _losses(2.03),
        ("float8", 2): _losses(2.13),
        ("float8-ag", 0): _losses(2.01),
        ("float8-ag", 1): _losses(1.97),
    }
    out = convergence.compare(rows, tail=4)
    assert out["bf16_orders"] == [0, 1, 2]
    assert out["noise_stdev"] == pytest.approx(0.05)  # stdev of 2.00, 1.95, 2.05
    assert out["noise_mean_abs_diff"] == pytest.approx(0.05)
    f8 = out["float8"]
    # A consistent +0.08 on every order: larger than the order-to-order spread of bf16.
    assert f8["orders"] == [0, 1, 2] and f8["tail_minus_bf16"] == pytest.approx([0.08] * 3)
    assert f8["mean_difference"] == pytest.approx(0.08) and f8["within_noise"] is False
    assert f8["mean_abs_diff_order0"] == pytest.approx(0.08)
    ag = out["float8-ag"]  # +0.01 and +0.02 on the two orders it ran: within noise
    assert ag["orders"] == [0, 1] and ag["mean_difference"] == pytest.approx(0.015)
    assert ag["within_noise"] is True


def test_float8_comparison_without_a_second_bf16_order_gives_no_verdict() -> None:
    out = convergence.compare({("bf16", 0): _losses(2.0), ("float8", 0): _losses(2.1)}, tail=4)
    assert out["noise_stdev"] is None and out["float8"]["within_noise"] is None
    assert out["float8"]["difference_stdev"] is None


def test_float8_runs_planned_per_order_and_the_old_alias() -> None:
    assert convergence.planned_runs("float8", [0, 2]) == [("float8", 0), ("float8", 2)]
    assert convergence.planned_runs("bf16-order2", [0, 1, 2]) == [("bf16", 1)]
    for bad in ("", "a", "-1", "1,-2"):
        with pytest.raises(argparse.ArgumentTypeError):
            convergence._int_list(bad)


def test_float8_bench_refuses_unknown_configs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        convergence.main(["--configs", "bf16,fp4"])
    assert exc.value.code == 2
    assert "unknown: ['fp4']" in capsys.readouterr().err


def _out_file(path: Path, runs: dict[tuple[str, int], dict[str, list[float]]], steps: int = 10) -> str:
    env = {"environment": {"steps": steps, "micro_batch": 4, "seq_len": 2048, "lr": 3e-4}}
    lines = [env] + [{"config": c, "order": o, **r} for (c, o), r in runs.items()]
    convergence._write(str(path), lines)
    return str(path)


def test_float8_compare_merges_the_out_files_of_separate_invocations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = {("bf16", 0): _losses(2.00), ("float8", 0): _losses(2.01), ("bf16", 1): _losses(1.95),
            ("float8", 1): _losses(1.97)}  # fmt: skip
    a = _out_file(tmp_path / "order0.jsonl", dict(list(runs.items())[:2]))
    b = _out_file(tmp_path / "order1.jsonl", dict(list(runs.items())[2:]))
    assert not list(tmp_path.glob("*.tmp"))  # written beside, then renamed
    assert convergence.main(["--compare", a, b, "--tail", "4"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["comparison"]
    assert printed == json.loads(json.dumps(convergence.compare(runs, tail=4)))
    assert printed["float8"]["orders"] == [0, 1]


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ({"steps": 10, "dup": True}, "run bf16 on order 0 appears twice"),
        ({"steps": 12}, "differs from"),
        ({"missing": True}, "not a readable --out file"),
    ],
)
def test_float8_compare_refuses_files_that_do_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], second: dict[str, Any], message: str
) -> None:
    a = _out_file(tmp_path / "a.jsonl", {("bf16", 0): _losses(2.0)})
    b = str(tmp_path / "b.jsonl")
    if not second.get("missing"):
        order = 0 if second.get("dup") else 1
        _out_file(tmp_path / "b.jsonl", {("bf16", order): _losses(2.0, second["steps"])}, second["steps"])
    with pytest.raises(SystemExit) as exc:
        convergence.main(["--compare", a, b, "--tail", "4"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--compare:" in err and message in err and "Traceback" not in err


gpu_busy = _load("gpu_busy")


def test_gpu_busy_counts_overlapping_streams_once_and_lists_the_gaps() -> None:
    # Two streams overlap on [5, 12); then a 3 ns gap; then [15, 20) inside nothing else.
    busy, gaps = gpu_busy.busy_and_gaps([(15, 20), (0, 10), (5, 12), (16, 18)])
    assert (busy, gaps) == (17, [3])
    assert gpu_busy.busy_and_gaps([]) == (0, [])


def test_gpu_busy_summary_against_the_host_synced_steps() -> None:
    ms = 1_000_000
    # Two 10 ms steps; the GPU works 9 ms of each, with a 0.5 ms and a 0.2 ms gap in between.
    intervals = [(0, 4 * ms), (int(4.5 * ms), int(9.5 * ms)), (int(9.7 * ms), int(18.7 * ms))]
    out = gpu_busy.summarize(intervals, [4 * ms, 4_000, 9 * ms], [0.010, 0.010])
    assert out["gpu_busy_share"] == pytest.approx(0.9)
    assert out["idle_ms_per_step"] == pytest.approx(1.0)
    assert out["largest_gaps_ms"] == pytest.approx([0.5, 0.2])
    assert out["gaps_over_100us_per_step"] == 1.0
    assert out["kernels_per_step"] == 1.5 and out["kernels_under_10us_share"] == pytest.approx(1 / 3)


def test_gpu_busy_refuses_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in ((["--configs", "bf16,tf32"], "unknown: ['tf32']"), (["--steps", "0"], "--steps")):
        with pytest.raises(SystemExit) as exc:
            gpu_busy.main(argv)
        assert exc.value.code == 2 and message in capsys.readouterr().err


def test_gpu_busy_idle_sites_charge_each_gap_to_the_work_that_ends_it() -> None:
    ms = 1_000_000
    # Two steps: a (0-4 ms), 2 ms idle, b (6-10) overlapping c (8-12), 3 ms idle, b (15-18), 1 ms
    # idle, d (19-20).
    events = [(0, 4 * ms, "a"), (6 * ms, 10 * ms, "b"), (8 * ms, 12 * ms, "c"), (15 * ms, 18 * ms, "b"),
              (19 * ms, 20 * ms, "d")]  # fmt: skip
    sites = gpu_busy.idle_sites(events, steps=2)
    assert [s["waiting_for"] for s in sites] == ["b", "d"]
    assert sites[0]["idle_ms_per_step"] == 2.5 and sites[0]["gaps_per_step"] == 1.0
    # The second gap before b follows c, which ended last, not b itself.
    assert sites[0]["mostly_after"] in {"a", "c"}
    assert sites[1] == {
        "waiting_for": "d", "idle_ms_per_step": 0.5, "gaps_per_step": 0.5, "mostly_after": "b"
    }  # fmt: skip
    assert gpu_busy.idle_sites([], steps=1) == []
    assert len(gpu_busy.idle_sites([(i * ms, i * ms + 5, f"k{i}") for i in range(20)], 1, top=3)) == 3


def test_gpu_busy_sums_the_gpu_time_by_kernel_name() -> None:
    ms = 1_000_000
    # Two steps: gemm twice per step (3 and 1 ms, overlapping copy), a memcpy once in all.
    events = [(0, 3 * ms, "gemm"), (2 * ms, 4 * ms, "Memcpy DtoD"), (5 * ms, 6 * ms, "gemm"),
              (10 * ms, 13 * ms, "gemm"), (15 * ms, 16 * ms, "gemm")]  # fmt: skip
    rows = gpu_busy.gpu_time_by_kernel(events, steps=2)
    assert rows == [
        {"name": "gemm", "ms_per_step": 4.0, "per_step": 2.0},
        {"name": "Memcpy DtoD", "ms_per_step": 1.0, "per_step": 0.5},
    ]
    assert gpu_busy.gpu_time_by_kernel(events, steps=2, top=1)[0]["name"] == "gemm"
    assert gpu_busy.gpu_time_by_kernel([], steps=1) == []


def test_gpu_busy_splits_compiler_settings_off_a_configuration_name() -> None:
    assert gpu_busy.split_config("float8-autotune-cdtune") == ("float8", {"-autotune", "-cdtune"})
    assert gpu_busy.split_config("bf16-gathered-cppwrapper") == ("bf16-gathered", {"-cppwrapper"})
    assert gpu_busy.split_config("float8") == ("float8", set())
    import torch._inductor.config as inductor_config

    # Every setting a suffix names is one inductor has.
    assert all(hasattr(inductor_config, attr) for attr in gpu_busy.COMPILER_SETTINGS.values())

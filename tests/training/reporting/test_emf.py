"""Step metrics as CloudWatch embedded-metric-format lines (training/reporting/emf.py)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from training.options.train import OptionError, parse_args
from training.reporting import emf

# Units CloudWatch accepts (PutMetricData StandardUnit), which EMF metric directives use.
_UNITS = {
    "Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes",
    "Terabytes", "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count",
    "Bytes/Second", "Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second",
    "Bits/Second", "Kilobits/Second", "Megabits/Second", "Gigabits/Second", "Terabits/Second",
    "Count/Second", "None",
}  # fmt: skip

STEP = {
    "step": 7,
    "loss": 2.5,
    "tokens_per_s": 48_900.0,
    "step_time_s": 0.67,
    "mfu": 0.51,
    "data_wait_s": 0.001,
    "peak_mem_gib": 40.5,
    "grad_norm": None,
}


def assert_valid_emf(record: dict[str, Any]) -> None:
    """The EMF specification's rules for one log event (CloudWatch_Embedded_Metric_Format_Specification)."""
    meta = record["_aws"]
    assert isinstance(meta["Timestamp"], int) and meta["Timestamp"] > 0
    directives = meta["CloudWatchMetrics"]
    assert isinstance(directives, list) and directives
    for directive in directives:
        assert isinstance(directive["Namespace"], str) and 0 < len(directive["Namespace"]) <= 1024
        for dim_set in directive["Dimensions"]:
            assert 0 < len(dim_set) <= 30
            for dim in dim_set:
                # A dimension must be a root member with a string value.
                assert isinstance(record[dim], str) and record[dim], dim
        assert len(directive["Metrics"]) <= 100
        for metric in directive["Metrics"]:
            value = record[metric["Name"]]
            assert isinstance(value, float | int) and not isinstance(value, bool)
            assert math.isfinite(value) and abs(value) <= 2.0**360  # PutMetricData's range
            assert metric.get("Unit", "None") in _UNITS


def test_one_step_is_one_valid_emf_line() -> None:
    line = emf.emf_line(STEP, cluster="ray-train-dev", run_name="qwen", timestamp_ms=1_764_500_000_000)
    assert "\n" not in line and line.startswith(emf.EMF_LINE_PREFIX)
    record = json.loads(line)
    assert_valid_emf(record)
    directive = record["_aws"]["CloudWatchMetrics"][0]
    assert directive["Namespace"] == emf.NAMESPACE
    assert directive["Dimensions"] == [["ClusterName", "RunName"]]
    assert {m["Name"] for m in directive["Metrics"]} == {"TokensPerSecond", "MFU", "Loss", "StepTime"}
    assert record["ClusterName"] == "ray-train-dev" and record["RunName"] == "qwen"
    assert record["TokensPerSecond"] == 48_900.0 and record["Loss"] == 2.5
    assert record["MFU"] == pytest.approx(51.0)  # a fraction in the loop, Percent in CloudWatch
    assert record["Step"] == 7
    # Nothing else of the step (memory, data wait) becomes a metric.
    assert "peak_mem_gib" not in record and "PeakMemGib" not in record


def test_non_finite_and_missing_values_are_left_out() -> None:
    # CPU runs have no MFU; a diverged run has a NaN loss: JSON cannot carry NaN, EMF would drop
    # the whole event, so the metric is left out and the others still land.
    step = {**STEP, "loss": float("nan")}
    del step["mfu"]
    record = json.loads(emf.emf_line(step, cluster="c", run_name="r", timestamp_ms=1))
    assert_valid_emf(record)
    names = {m["Name"] for m in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert names == {"TokensPerSecond", "StepTime"}
    assert "Loss" not in record and "MFU" not in record


# What training/methods/evaluate.py returns, merged into the step's metrics on the steps that evaluate.
EVAL_FIGURES = {
    "eval_loss": 1.25,
    "eval_perplexity": math.exp(1.25),
    "eval_accuracy": 0.625,
    "eval_tokens": 96,
}


def test_an_evaluating_step_adds_the_held_out_figures() -> None:
    record = json.loads(emf.emf_line({**STEP, **EVAL_FIGURES}, cluster="c", run_name="r", timestamp_ms=1))
    assert_valid_emf(record)
    directive = record["_aws"]["CloudWatchMetrics"][0]
    units = {m["Name"]: m["Unit"] for m in directive["Metrics"]}
    assert units == {
        "TokensPerSecond": "Count/Second", "MFU": "Percent", "Loss": "None", "StepTime": "Seconds",
        "EvalLoss": "None", "EvalPerplexity": "None", "EvalAccuracy": "Percent",
    }  # fmt: skip
    assert record["EvalLoss"] == 1.25 and record["EvalPerplexity"] == pytest.approx(math.exp(1.25))
    assert record["EvalAccuracy"] == pytest.approx(62.5)  # a fraction in the loop
    assert "eval_tokens" not in record and "EvalTokens" not in record
    # The keys of the loop's per-step metrics that become metrics (each has a dashboard graph).
    assert {k for k, *_ in emf.METRICS.values()} == {
        "tokens_per_s", "mfu", "loss", "step_time_s", "eval_loss", "eval_perplexity", "eval_accuracy",
    }  # fmt: skip


def test_values_beyond_cloudwatchs_range_are_left_out() -> None:
    # A diverged run: evaluate.py caps the loss at 700 for exp(), far beyond CloudWatch's 2^360.
    step = {**STEP, **EVAL_FIGURES, "eval_loss": 700.0, "eval_perplexity": math.exp(700.0)}
    record = json.loads(emf.emf_line(step, cluster="c", run_name="r", timestamp_ms=1))
    assert_valid_emf(record)
    assert "EvalPerplexity" not in record and record["EvalLoss"] == 700.0
    edge = emf.emf_record({"eval_perplexity": emf.MAX_VALUE}, cluster="c", run_name="r", timestamp_ms=1)
    assert edge["EvalPerplexity"] == emf.MAX_VALUE


def _opts(cluster: str | None) -> SimpleNamespace:
    return SimpleNamespace(metrics_cluster=cluster, run_name="qwen")


def test_publish_writes_only_from_rank_zero_and_only_when_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "container-stdout"
    target.touch()
    monkeypatch.setattr(emf, "CONTAINER_STDOUT", str(target))
    monkeypatch.setattr(emf, "_publisher", None)
    emf.publish(_opts(None), 0, STEP)  # off: local runs
    emf.publish(_opts("ray-train-prod"), 1, STEP)  # other ranks: one series per job, not per GPU
    assert target.read_text() == ""
    emf.publish(_opts("ray-train-prod"), 0, STEP)
    emf.publish(_opts("ray-train-prod"), 0, {**STEP, "step": 8})
    lines = target.read_text().splitlines()
    assert [json.loads(x)["Step"] for x in lines] == [7, 8]
    for line in lines:
        assert_valid_emf(json.loads(line))


def test_unwritable_container_stdout_does_not_stop_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(emf, "CONTAINER_STDOUT", str(tmp_path / "no" / "such" / "fd"))
    monkeypatch.setattr(emf, "_publisher", None)
    emf.publish(_opts("c"), 0, STEP)
    emf.publish(_opts("c"), 0, STEP)
    out = capsys.readouterr().out
    assert out.count("CloudWatch step metrics off") == 1


def test_a_failing_stream_is_dropped_after_one_notice(capsys: pytest.CaptureFixture[str]) -> None:
    class Broken(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError("gone")

    pub = emf.Publisher("c", "r", Broken())
    pub.publish(STEP)
    pub.publish(STEP)
    assert pub.stream is None
    assert capsys.readouterr().out.count("CloudWatch step metrics off") == 1


def test_metrics_cluster_option() -> None:
    opts = parse_args(["--metrics-cluster", "ray-train-prod", "--shape", "tiny", "--init", "random"])
    assert opts.metrics_cluster == "ray-train-prod"
    assert parse_args(["--shape", "tiny", "--init", "random"]).metrics_cluster is None
    with pytest.raises(OptionError, match="not an EKS cluster name"):
        parse_args(["--metrics-cluster", "bad name", "--shape", "tiny", "--init", "random"])


def test_emf_imports_nothing_heavy() -> None:
    # The CDK side imports these names: the module must not pull torch or Ray.
    import subprocess
    import sys

    code = "import sys, training.reporting.emf; print(sorted(m for m in ('torch','ray') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

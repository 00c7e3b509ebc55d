"""Step metrics for CloudWatch: embedded-metric-format (EMF) lines on the container's stdout.

The names here are written once: the training loop emits them and the CDK dashboard
(cdk_constructs/observability.py) plots them. Standard library only, so the CDK side imports this
module without torch or Ray.

How a line becomes a metric on the cluster (`observability.metrics: true`):
- Rank 0 writes one JSON object per step to the worker container's own stdout (`/proc/1/fd/1`,
  the stream the container runtime captures), not to the Python process's stdout: Ray Train
  workers' stdout goes to Ray's log files and reaches the driver only behind a
  `(RayTrainWorker pid=…, ip=…)` prefix, and EMF must be the whole log event.
- The Container Insights Fluent Bit (amazon-cloudwatch-observability add-on) sends every container
  log line to /aws/containerinsights/<cluster>/application, but its kubernetes filter parses JSON
  lines into a nested `log_processed` key (`Merge_Log_Key log_processed` in the add-on's default
  application-log.conf, aws-observability/helm-charts values.yaml), so `_aws` is not at the root
  and CloudWatch extracts no metrics there. The add-on therefore gets one extra Fluent Bit file
  (the documented `containerLogs.fluentBit.config.extraFiles`) that tails the Ray namespace's
  container logs, keeps the lines starting with `EMF_LINE_PREFIX` and ships only the raw line
  (`log_key log`, `log_format json/emf`) to its own log group, where CloudWatch extracts them.
- EMF specification: the root holds `_aws` with `Timestamp` (ms since epoch) and
  `CloudWatchMetrics` (namespace, dimension sets, metric names/units); each dimension and metric
  is a root member of the same name
  (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

NAMESPACE = "RayTrain"
CLUSTER_DIMENSION = "ClusterName"  # the same name Container Insights uses for its metrics
RUN_DIMENSION = "RunName"
DIMENSIONS = (CLUSTER_DIMENSION, RUN_DIMENSION)

TOKENS_PER_SECOND = "TokensPerSecond"
MFU = "MFU"
LOSS = "Loss"
STEP_TIME = "StepTime"
EVAL_LOSS = "EvalLoss"
EVAL_PERPLEXITY = "EvalPerplexity"
EVAL_ACCURACY = "EvalAccuracy"
# Metric name -> (key in the loop's per-step metrics, CloudWatch unit, scale).
METRICS: dict[str, tuple[str, str, float]] = {
    TOKENS_PER_SECOND: ("tokens_per_s", "Count/Second", 1.0),
    MFU: ("mfu", "Percent", 100.0),  # the loop reports a fraction
    LOSS: ("loss", "None", 1.0),
    STEP_TIME: ("step_time_s", "Seconds", 1.0),
    # Only on the steps that evaluate (training/methods/evaluate.py); absent values are left out.
    EVAL_LOSS: ("eval_loss", "None", 1.0),
    EVAL_PERPLEXITY: ("eval_perplexity", "None", 1.0),
    EVAL_ACCURACY: ("eval_accuracy", "Percent", 100.0),
}

# CloudWatch rejects metric values beyond +-2^360 (PutMetricData, MetricDatum.Value); a diverged
# run's perplexity (exp of the loss, up to e^700 in training/methods/evaluate.py) can get there.
MAX_VALUE = 2.0**360

# Every line starts with this (json.dumps keeps insertion order); Fluent Bit greps for it.
EMF_LINE_PREFIX = '{"_aws":'
# The stream the container runtime captures for the container (PID 1's stdout).
CONTAINER_STDOUT = "/proc/1/fd/1"


def emf_record(
    metrics: Mapping[str, Any], *, cluster: str, run_name: str, timestamp_ms: int
) -> dict[str, Any]:
    """One EMF object for one step; missing, non-finite (JSON has no NaN) and out-of-range values
    (`MAX_VALUE`) are left out."""
    values: dict[str, float] = {}
    for name, (key, _unit, scale) in METRICS.items():
        value = metrics.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            scaled = float(value) * scale
            if abs(scaled) <= MAX_VALUE:
                values[name] = scaled
    record: dict[str, Any] = {
        "_aws": {
            "Timestamp": int(timestamp_ms),
            "CloudWatchMetrics": [
                {
                    "Namespace": NAMESPACE,
                    "Dimensions": [list(DIMENSIONS)],
                    "Metrics": [{"Name": n, "Unit": METRICS[n][1]} for n in values],
                }
            ],
        },
        CLUSTER_DIMENSION: cluster,
        RUN_DIMENSION: run_name,
    }
    record.update(values)
    if "step" in metrics:
        record["Step"] = int(metrics["step"])  # a property: searchable in Logs Insights, no metric
    return record


def emf_line(metrics: Mapping[str, Any], *, cluster: str, run_name: str, timestamp_ms: int) -> str:
    return json.dumps(
        emf_record(metrics, cluster=cluster, run_name=run_name, timestamp_ms=timestamp_ms),
        separators=(",", ":"),
        allow_nan=False,
    )


class Publisher:
    """Writes EMF lines to a stream; gives up quietly (after one notice) if the stream fails."""

    def __init__(self, cluster: str, run_name: str, stream: IO[str] | None) -> None:
        self.cluster, self.run_name, self.stream = cluster, run_name, stream

    def publish(self, metrics: Mapping[str, Any]) -> None:
        if self.stream is None:
            return
        line = emf_line(
            metrics, cluster=self.cluster, run_name=self.run_name, timestamp_ms=int(time.time() * 1000)
        )
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except OSError as exc:
            _notice(f"CloudWatch step metrics off: cannot write to {CONTAINER_STDOUT} ({exc})")
            self.stream = None


_publisher: Publisher | None = None


def publish(opts: Any, rank: int, metrics: Mapping[str, Any]) -> None:
    """The loop's one call per step: rank 0 writes an EMF line when `--metrics-cluster` is set."""
    global _publisher  # noqa: PLW0603 - one stream per worker process, opened on first use
    cluster = getattr(opts, "metrics_cluster", None)
    if rank != 0 or not cluster:
        return
    if _publisher is None or (_publisher.cluster, _publisher.run_name) != (cluster, opts.run_name):
        _publisher = Publisher(cluster, opts.run_name, _open_container_stdout())
    _publisher.publish(metrics)


def _open_container_stdout() -> IO[str] | None:
    try:
        return open(CONTAINER_STDOUT, "a", buffering=1, encoding="utf-8")
    except OSError as exc:
        _notice(f"CloudWatch step metrics off: cannot open {CONTAINER_STDOUT} ({exc})")
        return None


def _notice(message: str) -> None:
    sys.stdout.write(f"[train] {message}\n")
    sys.stdout.flush()

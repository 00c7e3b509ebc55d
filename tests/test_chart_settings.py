"""Validation of the workload and job settings: messages name the file and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from config.catalogue import CATALOGUE
from config.loader import SettingsError, environments_dir, load_settings, parse_settings
from config.settings import Settings, Transport

DEV = environments_dir() / "dev.yaml"


KEY = "arn:aws:kms:us-west-2:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
DATA_URI = "s3://corpus-111122223333-us-west-2/text/en"


def dev_data(**sections: dict[str, Any]) -> dict[str, Any]:
    data = load_settings("dev").model_dump(mode="json", exclude={"name"})
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return data


def problems(**sections: dict[str, Any]) -> str:
    """The loader's message for dev.yaml with some sections changed (JSON is YAML)."""
    with pytest.raises(SettingsError) as exc:
        parse_settings(json.dumps(dev_data(**sections)), name="dev", source=DEV)
    return str(exc.value)


def test_environment_files_are_valid_with_defaults() -> None:
    for name in ("dev", "prod"):
        s = load_settings(name)
        assert s.job.keep_checkpoints >= 2
        assert s.job.transport(s.gpu_nodes.efa) is Transport.EFA
    example = environments_dir() / "example.yaml"
    parse_settings(example.read_text(), name="example", source=example)


@pytest.mark.parametrize(
    ("sections", "field", "fragment"),
    [
        ({"job": {"keep_checkpoints": 1}}, "job.keep_checkpoints", "greater than or equal to 2"),
        ({"job": {"max_failures": 0}}, "job.max_failures", "greater than or equal to 1"),
        ({"job": {"init": "pretrained", "shape": "tiny"}}, "job.init", "use init: random"),
        ({"job": {"checkpoint_every": 500, "steps": 100}}, "job.checkpoint_every", "never checkpoint"),
        ({"job": {"micro_batch_size": 32}}, "job.micro_batch_size", "larger than global_batch_size"),
        ({"job": {"global_batch_size": 12}}, "job.global_batch_size", "workers (8 = 2 nodes x 4 GPUs)"),
        ({"job": {"sharding": "zero3"}}, "job.sharding", "'auto', 'full' or 'hsdp'"),
        ({"job": {"expect_transport": "tcp"}}, "job.expect_transport", "got 'tcp'"),
        ({"job": {"data": "bucket/key"}}, "job.data", "s3://bucket/prefix"),
        ({"job": {"data": "s3:/bucket/key"}}, "job.data", "looks like a URI but is not scheme://"),
        ({"job": {"data": "s3://Bucket/key"}}, "job.data", "is not an S3 bucket name"),
        ({"job": {"model": "s3://bucket//m"}}, "job.model", "empty path segment"),
        ({"job": {"max_skipped_fraction": 1}}, "job.max_skipped_fraction", "less than 1"),
        ({"job": {"model": "not a model"}}, "job.model", "Hugging Face id"),
        ({"job": {"run_name": "Run_1"}}, "job.run_name", "is not a run name"),
        ({"job": {"output_dir": "relative/dir"}}, "job.output_dir", "absolute path"),
        ({"job": {"cluster": "standing"}}, "job.ttl_seconds_after_finished", "must be 0"),
        ({"job": {"ttl_seconds_after_finished": -1}}, "job.ttl_seconds_after_finished", "greater than or"),
        (
            {"job": {"ttl_seconds_after_finished": 2**31}},
            "job.ttl_seconds_after_finished",
            "less than or equal to 2147483647",
        ),
        ({"job": {"cluster": "shared"}}, "job.cluster", "'own' or 'standing'"),
        ({"job": {"backoff_limit": -1}}, "job.backoff_limit", "greater than or equal to 0"),
        ({"job": {"active_deadline_seconds": 0}}, "job.active_deadline_seconds", "greater than"),
        (
            {"job": {"steps": 10, "checkpoint_every": 5, "epochs": 3}},
            "job.epochs",
            "set steps or epochs, not both",
        ),
        ({"job": {"steps": 10, "checkpoint_every": 5, "epoch": 3}}, "job.epoch", "unknown field"),
        (
            {"gpu_nodes": {"instance_type": "g5.12xlarge", "efa": False}, "job": {"expect_transport": "efa"}},
            "job.expect_transport",
            "gpu_nodes.efa is false",
        ),
        ({"gpu_nodes": {"desired_size": 2}}, "gpu_nodes.desired_size", "unknown field"),
        ({"job": {"float8": "fast"}}, "job.float8", "valid boolean"),
        (
            {"job": {"data": DATA_URI, "input_kms_keys": [KEY.replace("key/", "alias/")]}},
            "job.input_kms_keys",
            "is an alias",
        ),
        (
            {"job": {"data": DATA_URI, "input_kms_keys": ["1234abcd"]}},
            "job.input_kms_keys",
            "is not a KMS key ARN",
        ),
        (
            {"job": {"data": DATA_URI, "input_kms_keys": [KEY, KEY]}},
            "job.input_kms_keys",
            "lists a key twice",
        ),
        ({"job": {"input_kms_keys": [KEY]}}, "job.input_kms_keys", "neither data nor model is an s3://"),
        (
            {"job": {"data": DATA_URI, "input_kms_keys": [KEY.replace("arn:aws:", "arn:aws-cn:")]}},
            "job.input_kms_keys",
            "is in partition aws-cn",
        ),
        (
            {"gpu_nodes": {"instance_type": "g5.12xlarge", "efa": False}, "job": {"float8": True}},
            "job.float8",
            "A10G GPUs have no FP8 tensor cores",
        ),
        ({"job": {"nodes": 0}}, "job.nodes", "greater than or equal to 1"),
        ({"job": {"nodes": 3}}, "job.nodes", "can be given at most 2 nodes"),
        ({"job": {"start_timeout_seconds": 60}}, "job.start_timeout_seconds", "greater than or equal to 300"),
        (
            {"job": {"start_timeout_seconds": 7200, "active_deadline_seconds": 3600}},
            "job.start_timeout_seconds",
            "leaves no time to train",
        ),
        ({"workload": {"shm_size_gib": 100}}, "workload.shm_size_gib", "more than half"),
        (
            {"workload": {"gpu_node_daemon_cpu_millis": 47000}},
            "workload.gpu_node_daemon_cpu_millis",
            "allocatable for the Ray worker",
        ),
        ({"workload": {"head_memory_mib": 32768}}, "workload.head_memory_mib", "m7i.xlarge"),
        ({"workload": {"head_cpu_millis": 8000}}, "workload.head_cpu_millis", "m7i.xlarge"),
        ({"workload": {"worker_env": {"1BAD": "x"}}}, "workload.worker_env", "environment variable"),
        (
            {"workload": {"worker_env": {"RAYTRAIN_EXPECT_TRANSPORT": "any"}}},
            "workload.worker_env",
            "job.expect_transport",
        ),
        ({"workload": {"namespace": "kube-system"}}, "workload.namespace", "reserved"),
    ],
)
def test_bad_settings_name_file_and_field(sections: dict[str, Any], field: str, fragment: str) -> None:
    message = problems(**sections)
    (line,) = message.splitlines()  # one problem, one line: "FILE: FIELD: what is valid"
    assert line.startswith(f"{_shown(DEV)}: {field}: "), message
    assert fragment in line, message


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def test_standing_mode_is_valid_with_ttl_zero() -> None:
    data = dev_data(job={"cluster": "standing", "ttl_seconds_after_finished": 0})
    # The standing cluster is the implicit team's (no `teams:`; tests/test_settings_teams.py).
    data["cluster"]["job_submitter_principals"] = [
        a for t in data.pop("teams").values() for a in t["submitters"]
    ]
    assert Settings.model_validate({"name": "dev", **data}).job.cluster == "standing"


GPU_TYPES = sorted(name for name, t in CATALOGUE.items() if t.gpus)


@settings(max_examples=60, deadline=None)
@given(
    instance_type=st.sampled_from(GPU_TYPES),
    nodes=st.integers(min_value=1, max_value=4),
    micro=st.integers(min_value=1, max_value=8),
    global_batch=st.integers(min_value=1, max_value=512),
)
def test_batch_sizes_must_divide_evenly_over_workers(
    instance_type: str, nodes: int, micro: int, global_batch: int
) -> None:
    itype = CATALOGUE[instance_type]
    data = dev_data(
        gpu_nodes={"instance_type": instance_type, "efa": itype.efa, "max_size": 4},
        # A Ray head's room for each of the 4 jobs that can run at once (config/settings/queueing.py).
        system_nodes={"max_size": 4},
        # Short sequences, so every micro-batch here fits the GPU's memory (config/memory.py): the
        # subject is divisibility.
        job={"nodes": nodes, "micro_batch_size": micro, "global_batch_size": global_batch, "seq_len": 256},
    )
    text = json.dumps(data)
    valid = micro <= global_batch and global_batch % (micro * nodes * itype.gpus) == 0
    # Small GPU types cannot hold the default 32 GiB /dev/shm next to the worker: not this test's
    # subject, so the expectation accounts for it.
    if itype.allocatable_memory_mib() - 4096 < 2 * 32 * 1024:
        valid = False
    if valid:
        s = parse_settings(text, name="dev", source=DEV)
        assert s.num_workers == nodes * itype.gpus
    else:
        with pytest.raises(SettingsError):
            parse_settings(text, name="dev", source=DEV)


@settings(max_examples=60, deadline=None)
@given(
    keep=st.integers(min_value=-2, max_value=10),
    every=st.integers(min_value=-1, max_value=300),
    steps=st.integers(min_value=-1, max_value=300),
    failures=st.integers(min_value=-1, max_value=5),
)
def test_checkpoint_settings_property(keep: int, every: int, steps: int, failures: int) -> None:
    data = dev_data(
        job={"keep_checkpoints": keep, "checkpoint_every": every, "steps": steps, "max_failures": failures}
    )
    valid = keep >= 2 and failures >= 1 and 1 <= every <= steps
    if valid:
        job = parse_settings(json.dumps(data), name="dev", source=DEV).job
        assert (job.keep_checkpoints, job.checkpoint_every, job.steps) == (keep, every, steps)
    else:
        with pytest.raises(
            SettingsError, match=r"job\.(keep_checkpoints|checkpoint_every|steps|max_failures): "
        ):
            parse_settings(json.dumps(data), name="dev", source=DEV)


def test_a_failed_job_is_not_retried_on_a_new_cluster_by_default() -> None:
    """Issue 41: KubeRay 1.7 retries any failed attempt (an input error, the transport gate, a start
    timeout) on a new cluster up to backoffLimit; lost workers are Ray Train's (max_failures)."""
    from config.settings.workload import JobSettings

    assert JobSettings().backoff_limit == 0
    for name in ("dev", "prod"):
        assert load_settings(name).job.backoff_limit == 0


@pytest.mark.parametrize(("expect", "seen"), [("any", "any"), ("efa", "efa"), ("auto", "efa")])
def test_the_transport_the_job_expects_reaches_the_workers(expect: str, seen: str) -> None:
    """job.expect_transport as written (auto: EFA on EFA nodes) is what the gate in each worker
    reads (RAYTRAIN_EXPECT_TRANSPORT): an explicit value is passed through, not only `auto`."""
    from tests.chart_render import render, variant

    s = variant("dev", job={"expect_transport": expect})
    job = next(o for o in render(s) if o["kind"] == "RayJob")
    (group,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    env = {e["name"]: e.get("value") for e in group["template"]["spec"]["containers"][0]["env"]}
    assert env["RAYTRAIN_EXPECT_TRANSPORT"] == seen

"""The contract between the settings and the training job: every environment's RayJob entry point,
as the chart renders it, parses with `training.options.train`' own parser into the settings' values."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from config import image
from config.checkpointing import checkpoint_interval
from config.loader import environment_names, load_settings
from k8s.chart import render_manifests
from k8s.job import deployed_run_name, rayjob_name
from training.options.train import parse_args
from training.sizing.batch import accumulation_steps

CHECKPOINT_URI = "s3://ray-train-checkpoints-111122223333-us-west-2/checkpoints"


def training_entrypoint(out_dir: Path) -> list[str]:
    """The argv of `python -m training` in the rendered RayJob (not a preparation job's)."""
    argvs = []
    for path in sorted(out_dir.glob("RayJob.*.k8s.yaml")):
        words = shlex.split(yaml.safe_load(path.read_text())["spec"]["entrypoint"])
        if words[:3] == ["python", "-m", "training"]:
            argvs.append(words[3:])
    assert len(argvs) == 1, f"one training RayJob expected in {out_dir}, found {len(argvs)}"
    return argvs[0]


@pytest.fixture
def pod_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the image carries (config/image.toml `packages`) and what the code asset vendors
    (`job_packages`, e.g. liger-kernel) counts as importable, as it is in the pod; anything else the
    options need must really be importable here."""
    pod = image.load()
    modules = {name.replace("-", "_") for name in [*pod.packages, *pod.job_packages]}
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        if name in modules:
            return importlib.machinery.ModuleSpec(name, None)
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.fixture
def s3_chat_records(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The environments' s3:// data and eval files, served by moto's S3 server: one jsonl file of
    chat records each (a key without a file suffix is a folder holding one). The options read the
    first record through pyarrow, as in the pod, to tell text from chat."""
    import boto3

    from tests.moto_server import running_moto_server

    record = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    )
    with running_moto_server() as endpoint:
        # Where pyarrow's FileSystem.from_uri (the options' way in) and boto3 take them from.
        for name, value in {
            "AWS_ENDPOINT_URL_S3": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-west-2",
            "AWS_DEFAULT_REGION": "us-west-2",
        }.items():
            monkeypatch.setenv(name, value)
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-west-2")
        for env in environment_names():
            job = load_settings(env).job
            for uri in (job.data, job.eval_data):
                if not (uri and uri.startswith("s3://")):
                    continue
                bucket, _, key = uri.removeprefix("s3://").partition("/")
                if bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
                    s3.create_bucket(
                        Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"}
                    )
                if not key.endswith((".jsonl", ".parquet")):
                    key = f"{key.rstrip('/')}/part-0.jsonl"
                s3.put_object(Bucket=bucket, Key=key, Body=f"{record}\n".encode())
        yield


@pytest.mark.parametrize("env", environment_names())
@pytest.mark.usefixtures("pod_packages", "s3_chat_records")
def test_every_entrypoint_parses_into_the_settings(env: str, tmp_path: Path) -> None:
    settings = load_settings(env)
    job = settings.job
    render_manifests(
        settings,
        tmp_path,
        code_uri="s3://cdk-assets-111122223333-us-west-2/0123abcd.zip",
        code_hash="0123abcd",
        checkpoint_uri=CHECKPOINT_URI,
    )
    opts = parse_args(training_entrypoint(tmp_path))
    # The deployed RayJob trains a run of its own and names itself, so its retries resume that run.
    rayjob = rayjob_name(settings, code_hash="0123abcd")
    run = deployed_run_name(settings, rayjob)
    assert (opts.run_name, opts.job_id, opts.resume) == (run, rayjob, job.resume)
    assert opts.run_name == f"{job.run_name}-{rayjob.rsplit('-', 1)[1]}"
    assert opts.storage_path == CHECKPOINT_URI
    assert opts.num_workers == settings.num_workers
    assert (opts.model, opts.init) == (job.model, job.init.value)
    assert opts.shape == (job.shape or "qwen2.5-1.5b")  # the CLI's default when the job names none
    assert opts.planned_dims == job.model_plan.dims.signature()
    assert (opts.lora, opts.export_merged) == (job.lora_spec, job.export_merged)
    assert (opts.seq_len, opts.steps, opts.lr, opts.seed) == (job.seq_len, job.steps, job.lr, job.seed)
    gpu = settings.gpu_nodes.instance
    assert (opts.global_batch_size, opts.micro_batch_size) == (job.global_batch_size, job.micro_batch(gpu))
    assert (opts.checkpoint_every, opts.keep_checkpoints, opts.max_failures) == (
        checkpoint_interval(settings).steps,
        job.keep_checkpoints,
        job.max_failures,
    )
    assert (opts.sharding, opts.expect_transport) == (job.sharding.value, job.expect_transport.value)
    assert (opts.compile, opts.liger) == (job.compile, job.liger)
    assert opts.activation_checkpointing == job.activation_checkpointing
    assert opts.float8 is job.float8_on(settings.gpu_nodes.instance)  # always explicit
    assert (opts.eval_data, opts.eval_fraction, opts.eval_every) == (
        job.eval_data,
        job.eval_fraction,
        job.eval_every,
    )
    assert (opts.early_stop_patience, opts.export, opts.too_long) == (
        job.early_stop_patience,
        job.export,
        job.too_long.value,
    )
    if job.data_format.value != "auto":
        assert opts.data_format == job.data_format.value
    # The settings accepted the batch sizes by the same rule the driver applies on the cluster.
    assert accumulation_steps(opts.global_batch_size, opts.micro_batch_size, opts.num_workers)

"""The data-preparation RayJob: rendered from the job settings when `prepare_data` is on, valid
against the KubeRay CRD, and agreeing with the training job on where and how the data is prepared
(both entry points parsed by the real command-line parsers)."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from config.loader import SettingsError, environment_names, environments_dir, load_settings, parse_settings
from k8s.job import PREPARED_DIR
from tests.chart_render import CHECKPOINT_URI, crd_errors, render, variant
from training.options.train import build_parser as training_parser
from training.run.prepare import build_parser as prepare_parser

TEXT = {"data": "s3://corpus-bucket/text/", "text_field": "body", "seq_len": 1024, "prepare_data": True,
        "max_skipped_fraction": 0.001}  # fmt: skip


def _jobs(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    jobs = [o for o in objs if o["kind"] == "RayJob"]
    return {o["metadata"]["labels"].get("ray-train/step", "train"): o for o in jobs}


def _argv(job: dict[str, Any], module: str) -> list[str]:
    words = shlex.split(job["spec"]["entrypoint"])
    assert words[:3] == ["python", "-m", module]
    return words[3:]


@pytest.mark.parametrize("cluster", ["own", "standing"])
def test_preparation_job_agrees_with_the_training_job(cluster: str) -> None:
    job_settings = {**TEXT, "cluster": cluster}
    if cluster == "standing":
        job_settings["ttl_seconds_after_finished"] = 0
    # A standing cluster is the implicit team's: with teams every job is Kueue's and brings its own.
    s = variant("dev", job=job_settings, **({"teams": {}} if cluster == "standing" else {}))
    jobs = _jobs(render(s))
    assert set(jobs) == {"train", "prepare-data"}
    prep, train = jobs["prepare-data"], jobs["train"]
    for obj in (prep, train):
        errors = crd_errors(obj)
        assert not errors, errors[:5]
    p = prepare_parser().parse_args(_argv(prep, "training.prepare"))
    t = training_parser().parse_args(_argv(train, "training"))
    out = f"{CHECKPOINT_URI}/{PREPARED_DIR}/{s.job.run_name}"
    assert p.out == t.prepared_data == out  # one location, written once
    assert (p.data, p.seq_len, p.text_field, p.model, p.shape, p.max_skipped_fraction) == (
        t.data, t.seq_len, t.text_field, t.model, t.shape, t.max_skipped_fraction
    )  # fmt: skip
    assert (p.data, p.seq_len, p.text_field, p.max_skipped_fraction) == (TEXT["data"], 1024, "body", 0.001)
    assert p.address == "auto"
    # The same cluster (a copy, or the standing one) and lifecycle; no extra packages to install.
    assert prep["spec"].get("rayClusterSpec") == train["spec"].get("rayClusterSpec")
    assert prep["spec"].get("clusterSelector") == train["spec"].get("clusterSelector")
    assert prep["spec"].get("deletionStrategy") == train["spec"].get("deletionStrategy")
    assert "pip" not in prep["spec"]["runtimeEnvYAML"]
    name = prep["metadata"]["name"]
    assert name.startswith("rj-prep-") and len(name) <= 47 and name != train["metadata"]["name"]


def test_no_preparation_job_unless_asked() -> None:
    for env in environment_names():
        assert set(_jobs(render(load_settings(env)))) == {"train"}
    text_only = variant("dev", job={**TEXT, "prepare_data": False})
    jobs = _jobs(render(text_only))
    assert set(jobs) == {"train"}
    # The training job prepares text data itself, into the same place.
    t = training_parser().parse_args(_argv(jobs["train"], "training"))
    assert t.prepared_data == f"{CHECKPOINT_URI}/{PREPARED_DIR}/{text_only.job.run_name}"


def test_a_changed_preparation_gets_a_new_name() -> None:
    names = [
        _jobs(render(variant("dev", job=job)))["prepare-data"]["metadata"]["name"]
        for job in (TEXT, {**TEXT, "text_field": "content"})
    ]
    assert names[0] != names[1]


def test_preparing_random_data_is_a_settings_error() -> None:
    data = load_settings("dev").model_dump(mode="json", exclude={"name"})
    data["job"] = {**data["job"], "prepare_data": True}
    with pytest.raises(SettingsError) as exc:
        parse_settings(json.dumps(data), name="dev", source=environments_dir() / "dev.yaml")
    assert "job.prepare_data" in str(exc.value) and "data is 'random'" in str(exc.value)

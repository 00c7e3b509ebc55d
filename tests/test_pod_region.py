"""Every Ray pod (head, GPU workers, the job submitter; the preparation job's too) carries the
environment's region for the AWS SDKs: the Pod Identity webhook injects credentials only."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart_render import ALL, render, settings_of, variant
from tests.test_settings import dev_data, error_of

REGION_VARS = ("AWS_REGION", "AWS_DEFAULT_REGION")


def _pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod template of the rendered workload, by where it sits."""
    found: dict[str, dict[str, Any]] = {}
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        spec = obj.get("spec", {})
        clusters = {"RayCluster": spec}.get(obj["kind"]) or spec.get("rayClusterSpec")
        if clusters:
            found[f"{name} head"] = clusters["headGroupSpec"]["template"]["spec"]
            for group in clusters["workerGroupSpecs"]:
                found[f"{name} workers {group['groupName']}"] = group["template"]["spec"]
        if "submitterPodTemplate" in spec:
            found[f"{name} submitter"] = spec["submitterPodTemplate"]["spec"]
    return found


@pytest.mark.parametrize("name", ALL)
def test_every_ray_container_has_the_environments_region(name: str) -> None:
    s = settings_of(name)
    pods = _pod_specs(render(s))
    kinds = {where.rsplit(" ", 1)[-1] if "workers" not in where else "workers" for where in pods}
    assert kinds == {"head", "workers", "submitter"}, pods.keys()
    for where, pod in pods.items():
        for container in pod["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert {k: env.get(k) for k in REGION_VARS} == dict.fromkeys(REGION_VARS, s.region), where


def test_region_follows_the_settings_and_the_prepare_job_has_it_too() -> None:
    data = {"data": "s3://corpus-bucket/text", "prepare_data": True}
    s = variant("dev", region="us-east-1", job=data,
                vpc={"availability_zones": ["us-east-1a", "us-east-1b"]},
                gpu_nodes={"availability_zone": "us-east-1b"})  # fmt: skip
    objects = render(s)
    assert sum(o["kind"] == "RayJob" for o in objects) == 2
    for where, pod in _pod_specs(objects).items():
        env = {e["name"]: e.get("value") for e in pod["containers"][0].get("env", [])}
        assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "us-east-1", where


@pytest.mark.parametrize("key", REGION_VARS)
def test_worker_env_cannot_set_another_region(key: str) -> None:
    data = dev_data()
    data["workload"] = {"worker_env": {key: "eu-west-1"}}
    message = error_of(data)
    assert "workload.worker_env" in message and key in message and "region" in message

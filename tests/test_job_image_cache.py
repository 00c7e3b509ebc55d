"""`raytrain job submit` and a digest-pinned Ray image: it must be in the pull-through cache before a job uses
it, and the submitter policy may describe the cached image only."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from config.loader import load_settings
from tests.test_job_submit import ENV, REGION

# --- a digest-pinned image must be in the pull-through cache before a job uses it ---


def _pinned(digest: str) -> Any:
    base = load_settings(ENV)
    return base.model_copy(update={"workload": base.workload.model_copy(update={"image_digest": digest})})


def test_a_digest_not_in_the_cache_is_refused_before_anything_is_created(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """moto's ECR: the cache's repository holds the image the last deploy warmed; a newly pinned
    digest is not there (nor is any before the repository exists): one line naming the fix."""
    from moto import mock_aws

    from raytrain.job.common import JobError
    from raytrain.job.submit import check_image_cached

    for key, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x")):
        monkeypatch.setenv(key, value)
    with mock_aws():
        ecr = boto3.client("ecr", region_name=REGION)
        warmed = _pinned("sha256:" + "0" * 64)
        repository = warmed.image_source.cache_repository(warmed.workload.image)
        assert repository == "dev/ecr-public/deep-learning-containers/ray"
        with pytest.raises(JobError, match="is not in the pull-through cache"):
            check_image_cached(warmed, ecr)  # no repository yet: nothing was ever cached
        ecr.create_repository(repositoryName=repository)
        manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                               "manifests": []})  # fmt: skip
        image = ecr.put_image(
            repositoryName=repository, imageManifest=manifest, imageTag="train-ml-cuda-v1.1"
        )
        cached = image["image"]["imageId"]["imageDigest"]
        check_image_cached(_pinned(cached), ecr)  # passes
        newly = "sha256:" + "9" * 64
        with pytest.raises(JobError) as err:
            check_image_cached(_pinned(newly), ecr)
    message = str(err.value)
    assert f"workload.image_digest {newly} is not in the pull-through cache ({repository})" in message
    assert "Deploy the Cluster stack (`cdk deploy RayTrain-dev-Cluster`" in message
    assert "\n" not in message


def test_the_submitter_policy_may_describe_the_cached_ray_images_only(synthesized: Any) -> None:
    from moto.iam import access_control as ac

    settings = synthesized["dev"].settings
    template = synthesized["dev"].template("Workload")
    (doc,) = [
        r["Properties"]["PolicyDocument"] for r in template["Resources"].values()
        if r["Type"] == "AWS::IAM::ManagedPolicy"
        and r["Properties"].get("ManagedPolicyName", "").endswith("-job-submitter")
    ]  # fmt: skip
    statements = [st for st in doc["Statement"] if "ecr:" in json.dumps(st["Action"])]
    evaluator = ac.IAMPolicy(json.dumps({"Version": "2012-10-17", "Statement": statements}))
    repo = settings.image_source.cache_repository(settings.workload.image)
    arn = f"arn:aws:ecr:{settings.region}:{settings.account}:repository/{repo}"
    assert evaluator.is_action_permitted("ecr:DescribeImages", arn) is ac.PermissionResult.PERMITTED
    assert (
        evaluator.is_action_permitted("ecr:DescribeImages", arn + "-other")
        is not ac.PermissionResult.PERMITTED
    )
    assert evaluator.is_action_permitted("ecr:BatchGetImage", arn) is not ac.PermissionResult.PERMITTED

"""A pipeline that deploys an environment in another region (stacks/pipeline/replication.py), and
what one environment's synthesis reads of the others (stacks/app_builder.py): team-prod hosts the
pipeline in us-east-1 and deploys team-dev in eu-north-1 (tests/conftest.py `own_environments`)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from config.loader import SettingsError, load_settings
from stacks import synth_all
from stacks.app_builder import pipeline_environments
from tests.environment_copies import copy_environment

HOST, OTHER = "team-prod", "team-dev"


def _support(own_synthesized) -> dict:
    host = own_synthesized[HOST].settings
    other = own_synthesized[OTHER].settings
    path = own_synthesized[HOST].directory / f"cross-region-stack-{host.account}_{other.region}.template.json"
    return json.loads(path.read_text())


def _of_type(template: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == kind}


def test_the_replication_bucket_is_encrypted_private_logged_and_expires(own_synthesized):
    support = _support(own_synthesized)
    buckets = _of_type(support, "AWS::S3::Bucket")
    (replication_id,) = [k for k in buckets if k.startswith("CrossRegionCodePipelineReplicationBucket")]
    (logs_id,) = [k for k in buckets if k != replication_id]
    props = buckets[replication_id]["Properties"]
    (rule,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    assert set(props["PublicAccessBlockConfiguration"].values()) == {True}
    assert props["LoggingConfiguration"] == {
        "DestinationBucketName": {"Ref": logs_id},
        "LogFilePrefix": "replication/",
    }
    assert props["LifecycleConfiguration"]["Rules"] == [{"ExpirationInDays": 30, "Status": "Enabled"}]
    logs = buckets[logs_id]["Properties"]
    assert set(logs["PublicAccessBlockConfiguration"].values()) == {True}
    policies = {p["Properties"]["Bucket"]["Ref"]: p["Properties"]["PolicyDocument"]["Statement"]
                for p in _of_type(support, "AWS::S3::BucketPolicy").values()}  # fmt: skip
    # TLS only on both; log delivery may write only under the prefix, only for this bucket.
    for bucket in (replication_id, logs_id):
        assert any(s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
                   for s in policies[bucket])  # fmt: skip
    (delivery,) = [
        s for s in policies[logs_id] if s.get("Principal") == {"Service": "logging.s3.amazonaws.com"}
    ]
    assert delivery["Condition"]["ArnLike"] == {"aws:SourceArn": {"Fn::GetAtt": [replication_id, "Arn"]}}
    assert delivery["Resource"]["Fn::Join"][1][-1] == "/replication/*"
    # The key rotates.
    (key,) = _of_type(support, "AWS::KMS::Key").values()
    assert key["Properties"]["EnableKeyRotation"] is True


def test_the_pipeline_role_uses_only_the_replication_keys_alias_there(own_synthesized):
    host, other = own_synthesized[HOST].settings, own_synthesized[OTHER].settings
    template = own_synthesized[HOST].template("Pipeline")
    (pipeline,) = _of_type(template, "AWS::CodePipeline::Pipeline").values()
    stores = {s["Region"]: s["ArtifactStore"] for s in pipeline["Properties"]["ArtifactStores"]}
    assert set(stores) == {host.region, other.region}
    alias = "alias/" + stores[other.region]["EncryptionKey"]["Id"].split(":alias/", 1)[1]
    role = pipeline["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    statements = [
        s
        for p in _of_type(template, "AWS::IAM::Policy").values()
        if {"Ref": role} in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]
    kms = [s for s in statements if any(a.startswith("kms:") for a in s["Action"])]
    resources = [
        r for s in kms for r in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])
    ]
    assert "*" not in resources, kms
    (there,) = [s for s in kms if s.get("Condition")]
    assert there["Resource"] == f"arn:aws:kms:{other.region}:{host.account}:key/*"
    assert there["Condition"] == {"ForAnyValue:StringEquals": {"kms:ResourceAliases": alias}}


def test_the_summary_lists_the_support_stack(own_synthesized):
    metadata = json.loads((own_synthesized[HOST].directory / "manifest.json").read_text())
    names = {a.get("displayName") or k for k, a in metadata["artifacts"].items()}
    assert any("cross-region-stack" in n for n in names), names


def test_a_pipeline_environment_that_does_not_load_is_named_as_the_dependency(tmp_path: Path):
    copy_environment("prod", tmp_path, HOST, region="us-east-1", rename={"dev": OTHER})
    (tmp_path / f"{OTHER}.yaml").write_text("region: [us-east-1\n", encoding="utf-8")
    with pytest.raises(SettingsError) as caught:
        pipeline_environments(load_settings(HOST, tmp_path), tmp_path)
    message = str(caught.value)
    assert message.startswith(f"env={HOST}'s pipeline deploys env={OTHER} (pipeline.environments)")
    assert f"{OTHER}.yaml: not valid YAML" in message and "\n" not in message
    # make synth's synthesis stops with that one line, before any environment is synthesized.
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert synth_all.main([HOST, "--config-dir", str(tmp_path), "--out", str(tmp_path / "out")]) == 1
    assert err.getvalue().count("\n") == 1 and "pipeline deploys env=team-dev" in err.getvalue()
    assert not (tmp_path / "out" / HOST).exists()


def test_a_smoke_environment_without_a_job_is_refused_naming_the_host_file(tmp_path: Path):
    copy_environment("prod", tmp_path, HOST, region="us-east-1", rename={"dev": OTHER})
    copy_environment("dev", tmp_path, OTHER, region="eu-north-1", edit={"job.deploy": False})
    with pytest.raises(
        SettingsError, match=rf"{HOST}\.yaml: pipeline\.smoke_job lists '{OTHER}'.*job\.deploy"
    ):
        pipeline_environments(load_settings(HOST, tmp_path), tmp_path)


def test_two_files_enabling_the_pipeline_are_refused_in_one_line(tmp_path: Path):
    copy_environment("prod", tmp_path, HOST, region="us-east-1", rename={"dev": OTHER})
    copy_environment("prod", tmp_path, "team-prod-2", region="us-west-2", rename={"dev": OTHER})
    with pytest.raises(SettingsError) as caught:
        load_settings(HOST, tmp_path)
    message = str(caught.value)
    assert "pipeline.enabled: env='team-prod-2' enables a pipeline too" in message and "\n" not in message


def test_cfn_lint_is_clean_on_the_support_and_pipeline_templates(own_synthesized):
    import subprocess
    import sys

    host = own_synthesized[HOST].directory
    templates = [str(p) for p in sorted(host.glob("cross-region-stack-*.template.json"))]
    assert templates
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [str(Path(sys.executable).with_name("cfn-lint")), "--config-file", str(root / ".cfnlintrc.yaml"),
         *templates, str(host / "RayTrain-team-prod-Pipeline.template.json")],
        capture_output=True, text=True, cwd=root, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr

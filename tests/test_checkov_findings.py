"""What checkov found and we fixed (KMS on sensitive log groups, the asset role's unconstrained
builds statement), and how the rest is suppressed: in resource metadata, each with its reason."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3

from cdk_constructs import checkov


def _resources(template: dict, cfn_type: str) -> dict[str, dict]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == cfn_type}


@pytest.mark.parametrize(("stack", "group"), [("Network", "FlowLogs"), ("Cluster", "ControlPlaneLogs")])
def test_sensitive_log_groups_use_their_own_key(synthesized, stack: str, group: str) -> None:
    env = synthesized["prod"]
    template = env.template(stack)
    (_logical, log_group), *rest = [
        (k, r) for k, r in _resources(template, "AWS::Logs::LogGroup").items() if k.startswith(group)
    ]
    assert not rest
    key_ref = log_group["Properties"]["KmsKeyId"]["Fn::GetAtt"]
    assert key_ref[1] == "Arn"
    key = template["Resources"][key_ref[0]]
    assert key["Properties"]["EnableKeyRotation"] is True
    # prod keeps the log group, so it keeps the key that can read it.
    assert log_group["DeletionPolicy"] == key["DeletionPolicy"] == "Retain"
    logs_statements = [
        st
        for st in key["Properties"]["KeyPolicy"]["Statement"]
        if st.get("Principal", {}).get("Service") == f"logs.{env.settings.region}.amazonaws.com"
    ]
    assert len(logs_statements) == 1
    condition = logs_statements[0]["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"]
    rendered = condition if isinstance(condition, str) else "".join(map(str, condition["Fn::Join"][1]))
    assert f":logs:{env.settings.region}:{env.settings.account}:log-group:" in rendered


def test_asset_role_starts_builds_of_this_accounts_projects_only(synthesized) -> None:
    env = synthesized["prod"]
    template = env.template("Pipeline")
    policies = [
        r
        for k, r in _resources(template, "AWS::IAM::Policy").items()
        if k.startswith("PipelineAssetsFileRole")
    ]
    assert len(policies) == 1
    statements = policies[0]["Properties"]["PolicyDocument"]["Statement"]
    (builds,) = [st for st in statements if "codebuild:StartBuild" in st["Action"]]
    resource = builds["Resource"]
    rendered = "".join(map(str, resource["Fn::Join"][1])) if isinstance(resource, dict) else resource
    assert rendered.endswith(f":codebuild:{env.settings.region}:{env.settings.account}:project/*")
    assert all(st["Resource"] != "*" for st in statements)


def _checkov_skips(resource: dict) -> list[dict[str, Any]]:
    return resource.get("Metadata", {}).get("checkov", {}).get("skip", [])


def test_every_suppression_has_a_reason(synthesized) -> None:
    seen = 0
    for env in synthesized.values():
        for template in env.templates().values():
            for logical, resource in template["Resources"].items():
                for entry in _checkov_skips(resource):
                    seen += 1
                    assert entry["id"].startswith("CKV"), (logical, entry)
                    assert len(entry.get("comment", "")) > 40, (logical, entry)
    assert seen > 0


def test_only_framework_functions_are_suppressed_wholesale(synthesized) -> None:
    # Our functions (the VPC cleanup, the image-cache warm, the submitted-jobs drain) say why
    # themselves; the blanket reasons are for CDK's own functions (custom-resource providers, kubectl
    # provider, pipeline approval) only.
    blanket = set(checkov.FRAMEWORK_FUNCTION_REASONS.values())
    ours = 0
    for env in synthesized.values():
        for name, template in env.templates().items():
            for logical, fn in _resources(template, "AWS::Lambda::Function").items():
                skips = _checkov_skips(fn)
                own = logical.startswith(("EksLeftoverCleanup", "RayImageWarm", "SubmittedJobDrain"))
                ours += own
                assert bool({s["comment"] for s in skips} & blanket) != own, (name, logical)
                # CKV_AWS_117 (in a VPC) is skipped only by functions that run outside one.
                in_vpc = "VpcConfig" in fn["Properties"]
                wanted = {"CKV_AWS_115", "CKV_AWS_116"} | (set() if in_vpc else {"CKV_AWS_117"})
                assert wanted <= {s["id"] for s in skips}, logical
    assert ours > 0


def test_skip_replaces_a_check_and_keeps_the_others() -> None:
    stack = cdk.Stack(cdk.App(), "S")
    bucket = s3.Bucket(stack, "B")
    checkov.skip(bucket, "CKV_AWS_18", "first reason, long enough")
    checkov.skip(bucket, "CKV_AWS_21", "versioning reason")
    checkov.skip(bucket, "CKV_AWS_18", "second reason")
    cfn = bucket.node.default_child
    assert isinstance(cfn, cdk.CfnResource)
    assert cfn.get_metadata("checkov") == {
        "skip": [
            {"id": "CKV_AWS_21", "comment": "versioning reason"},
            {"id": "CKV_AWS_18", "comment": "second reason"},
        ]
    }


def test_every_log_group_is_encrypted_with_a_key_of_this_app(synthesized) -> None:
    # Control-plane audit, flow logs and, where Container Insights is on, the containers' output.
    seen = 0
    for env in synthesized.values():
        for name, template in env.templates().items():
            for logical, group in _resources(template, "AWS::Logs::LogGroup").items():
                seen += 1
                key = group["Properties"].get("KmsKeyId", {}).get("Fn::GetAtt", [None])[0]
                assert template["Resources"].get(key, {}).get("Type") == "AWS::KMS::Key", (name, logical)
    assert seen >= 4

"""cdk-nag acknowledgements of the pipeline stack: findings inherent to CDK Pipelines' generated
roles, each on the one policy that has it."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import pipelines
from constructs import IConstruct

from cdk_constructs.nag import acknowledge, managed_policy_finding
from stacks.common import partition

_ARTIFACTS = (
    "CDK Pipelines grants its actions read/write on this pipeline's own artifact bucket and key "
    "(s3:GetObject*/List*/Abort*, kms:GenerateDataKey*/ReEncrypt* on <bucket>/*): scoped to that "
    "bucket and key, which hold nothing but pipeline artifacts."
)
_CODEBUILD_LOGS = (
    "CodeBuild writes to the log groups and report groups named after its own project "
    "(/aws/codebuild/<project>:*, report-group/<project>-*); CDK Pipelines scopes them so."
)


# What CDK's bucket/key grants put on each role: read (assets), read + key (most), read/write + key.
_READ = ("s3:GetObject*", "s3:GetBucket*", "s3:List*")
_READ_KEY = (*_READ, "kms:ReEncrypt*", "kms:GenerateDataKey*")
_READ_WRITE_KEY = (*_READ_KEY, "s3:DeleteObject*", "s3:Abort*")


def acknowledge_pipeline_findings(
    stack: cdk.Stack,
    *,
    pipeline: pipelines.CodePipeline,
    artifact_bucket: s3.IBucket,
    steps_role: iam.IRole,
) -> None:
    """Findings inherent to CDK Pipelines' generated roles, each acknowledged by its exact finding
    id on the one policy that has it (logical IDs are resolved, so nothing else is covered)."""
    bucket = stack.get_logical_id(artifact_bucket.node.default_child)  # type: ignore[arg-type]

    def artifact_findings(actions: tuple[str, ...]) -> list[str]:
        return [f"AwsSolutions-IAM5[Action::{a}]" for a in actions] + [
            f"AwsSolutions-IAM5[Resource::<{bucket}.Arn>/*]"
        ]

    # Every CodeBuild project's role may write its own project's logs and reports.
    for project in (c for c in pipeline.node.find_all() if isinstance(c, codebuild.Project)):
        logical = stack.get_logical_id(project.node.default_child)  # type: ignore[arg-type]
        prefix = f"arn:{partition(stack.region)}"
        policy = project.role.node.find_child("DefaultPolicy")  # type: ignore[union-attr]
        for finding in (
            f"{prefix}:logs:{stack.region}:{stack.account}:log-group:/aws/codebuild/<{logical}>:*",
            f"{prefix}:codebuild:{stack.region}:{stack.account}:report-group/<{logical}>-*",
        ):
            acknowledge(policy, f"AwsSolutions-IAM5[Resource::{finding}]", _CODEBUILD_LOGS)

    def policy_of(path: str) -> IConstruct:
        return find(pipeline, path).node.find_child("DefaultPolicy")

    roles: dict[str, tuple[tuple[str, ...], list[str], str]] = {
        "Pipeline/Role": (_READ_WRITE_KEY, [], ""),
        "Pipeline/Build/Synth/CdkBuildProject/Role": (_READ_WRITE_KEY, [], ""),
        "UpdatePipeline/SelfMutation/Role": (
            _READ_KEY,
            ["Resource::*", "Resource::arn:*:iam::{account}:role/*"],
            "Self-mutation reads stack status (cloudformation:DescribeStacks, Resource *) and assumes "
            "only CDK bootstrap roles (arn:*:iam::<account>:role/* under an aws-cdk:bootstrap-role "
            "tag condition).",
        ),
        "Assets/FileRole": (
            _READ,
            [
                "Resource::*",
                "Resource::arn:{partition}:logs:{region}:{account}:log-group:/aws/codebuild/*",
                "Resource::arn:{partition}:codebuild:{region}:{account}:report-group/*",
            ],
            "One CodeBuild project per asset, started by this role as the asset actions' role, so its "
            "log and report groups are named codebuild/*. The builds statement CDK writes with "
            "Resource * is narrowed to this account's and region's projects by a property override "
            "(stack.py _scope_asset_role_builds), which cdk-nag does not see; the template has no * left.",
        ),
        "PipelinesSecurityCheck/CDKSecurityCheck/Role": (
            _READ_KEY,
            ["Resource::*", "Resource::<{approve}.Arn>:*"],
            "The permission-broadening check runs `cdk diff` through the bootstrap lookup roles "
            "(Resource *, tag-conditioned) and invokes CDK's auto-approve function (<function ARN>:*: "
            "any version of that one function).",
        ),
        "PipelinesSecurityCheck/CDKPipelinesAutoApprove/ServiceRole": (
            (),
            ["Resource::*"],
            "CDK Pipelines' auto-approve function calls codepipeline:PutApprovalResult on the approval "
            "it is handed at run time (Resource *): its ARN is not known when synthesizing.",
        ),
    }
    approve_fn = find(pipeline, "PipelinesSecurityCheck/CDKPipelinesAutoApprove")
    names = {
        "account": stack.account,
        "region": stack.region,
        "partition": partition(stack.region),
        "approve": stack.get_logical_id(approve_fn.node.default_child),  # type: ignore[arg-type]
    }
    for path, (actions, extra, reason) in roles.items():
        policy = policy_of(path)
        for finding in artifact_findings(actions) if actions else []:
            acknowledge(policy, finding, _ARTIFACTS)
        for finding in extra:
            acknowledge(policy, "AwsSolutions-IAM5[" + finding.format(**names) + "]", reason)
    # The source action's role (its construct id is derived from the repository name).
    source_stage = find(pipeline, "Pipeline/Source")
    for child in source_stage.node.children:
        role = child.node.try_find_child("CodePipelineActionRole")
        if role is not None:
            for finding in artifact_findings(_READ_WRITE_KEY):
                acknowledge(role.node.find_child("DefaultPolicy"), finding, _ARTIFACTS)
    steps_policy = steps_role.node.find_child("DefaultPolicy")
    for finding in artifact_findings(_READ_KEY):
        acknowledge(steps_policy, finding, _ARTIFACTS)
    acknowledge(
        find(pipeline, "PipelinesSecurityCheck/CDKPipelinesAutoApprove/ServiceRole"),
        managed_policy_finding("AWSLambdaBasicExecutionRole", service_role=True),
        "CDK Pipelines' auto-approve function (approves a stage when no permission broadens) logs "
        "through the AWS managed basic execution policy; CDK owns this role.",
    )


def find(scope: IConstruct, path: str) -> IConstruct:
    node: IConstruct = scope
    for part in path.split("/"):
        node = node.node.find_child(part)
    return node


def acknowledge_access_findings(stack: cdk.Stack, *, project: codebuild.Project, starter: iam.Policy) -> None:
    """The PipelineAccess stack's findings: CDK's CodeBuild grants to the in-VPC project's role
    (its S3 source, its encryption key, its logs and reports, its VPC network interfaces), and the
    log streams the starter role reads."""
    logical = stack.get_logical_id(project.node.default_child)  # type: ignore[arg-type]
    prefix = f"arn:{partition(stack.region)}"
    role_policy = project.role.node.find_child("DefaultPolicy")  # type: ignore[union-attr]
    for action in ("s3:GetBucket*", "s3:GetObject*", "s3:List*"):
        acknowledge(
            role_policy,
            f"AwsSolutions-IAM5[Action::{action}]",
            "CodeBuild's S3 source grants read of the source bucket (Source.s3 -> bucket.grantRead): "
            "that bucket holds only the pipeline's checkouts for this project.",
        )
    for action in ("kms:GenerateDataKey*", "kms:ReEncrypt*"):
        acknowledge(
            role_policy,
            f"AwsSolutions-IAM5[Action::{action}]",
            "The project's encryption key (the source bucket's key): CodeBuild encrypts its build "
            "output and reads the source with it; the grant names that one key.",
        )
    for finding in (
        f"{prefix}:logs:{stack.region}:{stack.account}:log-group:/aws/codebuild/<{logical}>:*",
        f"{prefix}:codebuild:{stack.region}:{stack.account}:report-group/<{logical}>-*",
    ):
        acknowledge(role_policy, f"AwsSolutions-IAM5[Resource::{finding}]", _CODEBUILD_LOGS)
    vpc_reason = (
        "A VPC build: CodeBuild creates and deletes the build's network interface with the "
        "project's role (ec2:Describe* have no resource level; CreateNetworkInterfacePermission is "
        "conditioned on this project's subnets and the CodeBuild service). CDK writes these grants."
    )
    acknowledge(
        role_policy,
        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:ec2:<AWS::Region>:<AWS::AccountId>:network-interface/*]",
        vpc_reason,
    )
    acknowledge(project.node.find_child("PolicyDocument"), "AwsSolutions-IAM5[Resource::*]", vpc_reason)
    names = [c for c in stack.node.find_all() if isinstance(c, logs.LogGroup)]
    for group in names:
        name = group.node.default_child.log_group_name  # type: ignore[union-attr]
        acknowledge(
            starter,
            f"AwsSolutions-IAM5[Resource::{prefix}:logs:{stack.region}:{stack.account}:log-group:{name}:log-stream:*]",
            "The pipeline's step prints the build's log: one stream per build, named after the build "
            "ID, in this project's log group only.",
        )

"""The pipeline stack: CDK Pipelines' CodePipeline, its artifact storage and the verify steps' role."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_codecommit as codecommit
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import pipelines
from constructs import Construct

from cdk_constructs import checkov
from cdk_constructs.buckets import kms_bucket_with_access_logs
from config.settings import PipelineSettings, Settings
from stacks.common import partition, removal_policy
from stacks.pipeline.access import pipeline_verify_role_name
from stacks.pipeline.nag import acknowledge_pipeline_findings, find
from stacks.pipeline.replication import harden_replication_buckets
from stacks.pipeline.stage import EnvironmentStage
from stacks.pipeline.steps import (
    BUILD_IMAGE,
    PREFLIGHT_TIMEOUT,
    RUNTIME_VERSIONS,
    SETUP_COMMANDS,
    bootstrap_lookup_role_arn,
    preflight_commands,
    start_commands,
    start_timeout,
)


def _source(scope: Construct, p: PipelineSettings) -> pipelines.CodePipelineSource:
    if p.codecommit_repository is not None:
        repo = codecommit.Repository.from_repository_name(scope, "Repository", p.codecommit_repository)
        return pipelines.CodePipelineSource.code_commit(repo, p.branch)
    assert p.repository is not None and p.connection_arn is not None  # settings enforce the pair
    return pipelines.CodePipelineSource.connection(p.repository, p.branch, connection_arn=p.connection_arn)


class PipelineStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        environments: dict[str, Settings],
        **kwargs: Any,
    ) -> None:
        """`environments`: the settings of every environment in `pipeline.environments`, checked
        (stacks/app_builder.py `pipeline_environments`)."""
        super().__init__(scope, construct_id, **kwargs)
        assert settings.pipeline is not None
        p = settings.pipeline

        # Artifacts cross accounts: a customer-managed key the target accounts' deploy roles may use.
        storage = kms_bucket_with_access_logs(
            self,
            ids=("ArtifactKey", "ArtifactAccessLogs", "Artifacts"),
            key_description=f"Pipeline artifacts of {settings.stack_prefix}",
            log_prefix="artifacts/",
            removal_policy=removal_policy(settings),
            # Artifacts are rebuilt by every run; old ones only help to debug a recent failure.
            lifecycle_rules=[s3.LifecycleRule(expiration=cdk.Duration.days(30))],
        )
        self.artifact_key, self.access_logs = storage.key, storage.access_logs
        self.artifact_bucket = storage.bucket
        checkov.skip(
            self.artifact_bucket,
            "CKV_AWS_21",
            "pipeline artifacts are rebuilt by every run and expire after 30 days: no state lives here",
        )

        source = _source(self, p)
        host_out = f"cdk.out/{settings.name}"
        synth = pipelines.ShellStep(
            "Synth",
            input=source,
            # The README's commands: the whole test suite (lint, types, tests), then the offline
            # synthesis of every environment; this pipeline's own assembly is the host's folder.
            commands=["make test", "make synth"],
            primary_output_directory=host_out,
        )
        build_spec = codebuild.BuildSpec.from_object(
            {"phases": {"install": {"runtime-versions": RUNTIME_VERSIONS}}}
        )
        self.steps_role = iam.Role(
            self,
            "StepsRole",
            role_name=pipeline_verify_role_name(settings),
            assumed_by=iam.ServicePrincipal("codebuild.amazonaws.com"),
            description=(
                "Pipeline checks: assumes each environment's CDK lookup role (preflight) and "
                "verification starter role (post-deploy)"
            ),
        )
        self.pipeline = pipelines.CodePipeline(
            self,
            "Pipeline",
            pipeline_name=settings.stack_prefix,
            synth=synth,
            artifact_bucket=self.artifact_bucket,
            cross_account_keys=True,
            enable_key_rotation=True,
            code_build_defaults=pipelines.CodeBuildOptions(
                build_environment=codebuild.BuildEnvironment(
                    build_image=BUILD_IMAGE, compute_type=codebuild.ComputeType.LARGE
                ),
                partial_build_spec=build_spec,
            ),
        )

        principal = (
            f"arn:{partition(settings.region)}:iam::{settings.account}:role/"
            f"{pipeline_verify_role_name(settings)}"
        )
        self.stages: dict[str, EnvironmentStage] = {}
        for name in p.environments:
            env_settings = environments[name]
            smoke = name in p.smoke_job
            stage = EnvironmentStage(
                self, f"Deploy-{name}", settings=env_settings, pipeline_principal=principal, smoke=smoke
            )
            self.stages[name] = stage
            approve = name in p.manual_approval
            # First: what only the account can answer (raytrain preflight), read-only.
            self.steps_role.add_to_policy(
                iam.PolicyStatement(
                    actions=["sts:AssumeRole"], resources=[bootstrap_lookup_role_arn(env_settings)]
                )
            )
            preflight = pipelines.CodeBuildStep(
                f"Preflight-{name}",
                input=source,
                install_commands=SETUP_COMMANDS,
                commands=preflight_commands(env_settings),
                role=self.steps_role,
                timeout=PREFLIGHT_TIMEOUT,
            )
            pre: list[pipelines.Step] = [preflight]
            stack_steps: list[pipelines.StackSteps] = []
            if approve:
                broadening = pipelines.ConfirmPermissionsBroadening("CheckBroadening", stage=stage)
                broadening.add_step_dependency(preflight)  # pre steps otherwise run side by side
                pre.append(broadening)
                stack_steps = [
                    pipelines.StackSteps(
                        stack=stack,
                        change_set=[
                            pipelines.ManualApprovalStep(
                                f"Approve-{stack.stack_name}",
                                comment=(
                                    f"Review the change set of {stack.stack_name} in CloudFormation "
                                    f"({env_settings.region}) before it is executed."
                                ),
                            )
                        ],
                    )
                    for stack in [*stage.stacks.all(), stage.access]
                ]
            self.steps_role.add_to_policy(
                iam.PolicyStatement(
                    actions=["sts:AssumeRole"],
                    resources=[env_settings.verify_build.starter_role_arn],
                )
            )
            # Outside any VPC: it only calls AWS APIs (S3, CodeBuild, CloudWatch Logs) as the
            # environment's starter role; the checks themselves run in the environment's VPC.
            verify = pipelines.CodeBuildStep(
                f"Verify-{name}",
                input=source,
                install_commands=SETUP_COMMANDS,
                commands=start_commands(env_settings),
                role=self.steps_role,
                timeout=start_timeout(env_settings, smoke=smoke),
            )
            self.pipeline.add_stage(stage, pre=pre, post=[verify], stack_steps=stack_steps)
        # Build now (not lazily at synthesis) so the generated roles exist to be acknowledged.
        self.pipeline.build_pipeline()
        _scope_asset_role_builds(self, self.pipeline)
        # Environments in other regions: CodePipeline's replication bucket there (its own stack).
        self.support_stacks = harden_replication_buckets(self, self.pipeline.pipeline)
        # CDK Pipelines writes the deploy actions' role ARNs as Fn::Join with an empty delimiter;
        # cfn-lint's E3703 (prefer Fn::Sub) is style, on generated values, only on this resource.
        cfn_pipeline = self.pipeline.pipeline.node.default_child
        assert isinstance(cfn_pipeline, cdk.CfnResource)
        cfn_pipeline.add_metadata("cfn-lint", {"config": {"ignore_checks": ["E3703"]}})
        acknowledge_pipeline_findings(
            self,
            pipeline=self.pipeline,
            artifact_bucket=self.artifact_bucket,
            steps_role=self.steps_role,
        )


def _scope_asset_role_builds(stack: cdk.Stack, pipeline: pipelines.CodePipeline) -> None:
    """CDK Pipelines' asset role (also the asset actions' role) may start, stop and read builds of
    any resource ("*", pipelines/lib/private/asset-singleton-role.ts, its third statement): narrowed
    here to CodeBuild projects of this account and region, where the asset projects live. cdk-nag
    reads the statements before this override (stacks/pipeline/nag.py says so); checkov and
    CloudFormation see the result."""
    policy = find(pipeline, "Assets/FileRole").node.find_child("DefaultPolicy").node.default_child
    assert isinstance(policy, iam.CfnPolicy)
    statements = stack.resolve(policy.policy_document)["Statement"]
    index = next(i for i, st in enumerate(statements) if "codebuild:StartBuild" in st["Action"])
    assert statements[index]["Resource"] == "*", statements[index]
    policy.add_property_override(
        f"PolicyDocument.Statement.{index}.Resource",
        stack.format_arn(service="codebuild", resource="project", resource_name="*"),
    )

"""Pipeline: CDK Pipelines CodePipeline that tests, synthesizes and deploys the environments in order.

Defined by the one environment whose settings enable `pipeline` (prod in this repository: the account
that receives production deploys also holds the pipeline that makes them, so no other account needs
to be trusted to deploy there). Per environment, in settings order:

1. (`manual_approval` environments) `cdk diff --security-only` on the stage: broadened IAM or
   security-group permissions stop the pipeline for an approval (ConfirmPermissionsBroadening);
2. per stack, CloudFormation creates the change set; (`manual_approval`) a person approves that change
   set before it is executed;
3. after the stage, `raytrain verify --env NAME` as a role in the environment's account that has an EKS
   access entry (read-only, cluster-wide; created by the stage's `<prefix>-PipelineAccess` stack);
4. (`smoke_job` environments) the RayJob this deploy applied must reach SUCCEEDED: its in-job transport
   gate fails the job unless inter-node NCCL traffic ran on EFA.

Target accounts must be bootstrapped to trust the pipeline's account:
`npx cdk bootstrap aws://ACCOUNT/REGION --trust PIPELINE_ACCOUNT --cloudformation-execution-policies ARN`.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from typing import Any

import aws_cdk as cdk
import jsii
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_codecommit as codecommit
from aws_cdk import aws_eks as eks_l1
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import pipelines
from constructs import Construct, IConstruct

from cdk_constructs.buckets import kms_bucket_with_access_logs
from config.loader import load_settings
from config.names import SERVICE_ACCOUNT
from config.settings import PipelineSettings, Settings, Transport
from k8s.chart import rayjob_name
from stacks.common import removal_policy

# The verify/smoke steps assume this role in each target account (physical names: the step in one
# account and the role in another must agree on them without a cross-account reference).
VERIFY_ROLE_SUFFIX = "pipeline-verify"
# Read-only, cluster-wide: `raytrain verify` reads nodes, DaemonSets, Deployments and the KubeRay
# custom resources; AmazonEKSViewPolicy covers neither nodes nor (unaggregated) CRDs.
VERIFY_ACCESS_POLICY = "AmazonEKSAdminViewPolicy"
BUILD_IMAGE = codebuild.LinuxBuildImage.STANDARD_7_0
# Runtimes the Makefile needs (pyproject: Python 3.11-3.12; ENVIRONMENT: Node 20 for the CDK CLI).
RUNTIME_VERSIONS = {"python": "3.11", "nodejs": "20"}
SMOKE_POLL_SECONDS = 30


def verify_role_name(settings: Settings) -> str:
    return f"{settings.stack_prefix}-{VERIFY_ROLE_SUFFIX}"


def pipeline_verify_role_name(host: Settings) -> str:
    """The CodeBuild role of the verify steps, in the pipeline's account."""
    return f"{host.stack_prefix}-pipeline-steps"


class PipelineAccessStack(cdk.Stack):
    """Only in the pipeline's stages: a role in the environment's account that the pipeline's verify
    steps assume, with an EKS access entry. Kept out of the standalone app so a manual deploy of the
    environment neither needs nor removes it; destroy it before the Cluster stack."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        pipeline_principal: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        cluster_name = settings.cluster.name
        self.role = iam.Role(
            self,
            "VerifyRole",
            role_name=verify_role_name(settings),
            assumed_by=iam.ArnPrincipal(pipeline_principal),
            description=f"Pipeline post-deploy checks of {cluster_name} (read-only Kubernetes access)",
            max_session_duration=cdk.Duration.hours(1),
        )
        # `aws eks update-kubeconfig` reads the endpoint and CA; nothing else is needed from the EKS API.
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["eks:DescribeCluster"],
                resources=[self.format_arn(service="eks", resource="cluster", resource_name=cluster_name)],
            )
        )
        self.access_entry = eks_l1.CfnAccessEntry(
            self,
            "VerifyAccess",
            cluster_name=cluster_name,
            principal_arn=self.role.role_arn,
            type="STANDARD",
            access_policies=[
                eks_l1.CfnAccessEntry.AccessPolicyProperty(
                    policy_arn=(
                        f"arn:{self.partition}:eks::aws:cluster-access-policy/{VERIFY_ACCESS_POLICY}"
                    ),
                    access_scope=eks_l1.CfnAccessEntry.AccessScopeProperty(type="cluster"),
                )
            ],
        )


class EnvironmentStage(cdk.Stage):
    """One environment's stacks, exactly as the standalone app builds them (same stack names and
    logical IDs, so the pipeline and a manual `cdk deploy` update the same stacks), plus the
    PipelineAccess stack."""

    def __init__(
        self, scope: Construct, construct_id: str, *, settings: Settings, pipeline_principal: str
    ) -> None:
        super().__init__(
            scope, construct_id, env=cdk.Environment(account=settings.account, region=settings.region)
        )
        from stacks.app_builder import build_environment  # app_builder imports this module

        # Without its pipeline section: the host environment's stage must not nest the pipeline.
        self.settings = settings.model_copy(update={"pipeline": None})
        self.stacks = build_environment(self, self.settings)
        self.access = PipelineAccessStack(
            self,
            f"{settings.stack_prefix}-PipelineAccess",
            stack_name=f"{settings.stack_prefix}-PipelineAccess",
            settings=self.settings,
            pipeline_principal=pipeline_principal,
            env=cdk.Environment(account=settings.account, region=settings.region),
            termination_protection=settings.termination_protection,
            description=f"Ray Train on EKS ({settings.name}): pipeline verification access",
        )
        self.access.add_stack_dependency(self.stacks.cluster)
        cdk.Aspects.of(self).add(
            _StandaloneNameTags(self.node.path + "/"), priority=cdk.AspectPriority.READONLY
        )
        _restore_standalone_logical_ids(self)


def make_unique_id(components: list[str]) -> str:
    """CDK's unique-ID algorithm (aws-cdk-lib core/lib/private/uniqueid): the human-readable path
    plus an MD5 of it. Logical IDs are this over a construct's path inside its stack."""
    components = [c for c in components if c != "Default"]
    if len(components) == 1:
        candidate = re.sub(r"[^A-Za-z0-9]", "", components[0])
        if len(candidate) <= 255:
            return candidate
    digest = hashlib.md5("/".join(components).encode(), usedforsecurity=False).hexdigest()[:8].upper()
    human: list[str] = []
    for component in components:  # CDK drops a component that the previous one ends with
        if not human or not human[-1].endswith(component):
            human.append(component)
    text = "".join(re.sub(r"[^A-Za-z0-9]", "", c) for c in human if c != "Resource")
    return text[:240] + digest


def _restore_standalone_logical_ids(stage: cdk.Stage) -> None:
    """Some construct IDs embed another construct's unique ID, which covers its path from the root:
    a security group rule to itself is `from <group's unique id>:ALL TRAFFIC`. Inside the stage that
    ID includes the pipeline's path, so the rule's logical ID differs from the standalone stack's,
    and a pipeline deploy would replace the rule (creating the duplicate first, which EC2 refuses).
    Give such resources the logical IDs the standalone app gives them."""
    depth = len(stage.node.scopes)  # path components of the stage itself
    renamed: dict[str, str] = {}
    for construct in stage.node.find_all():
        scopes = construct.node.scopes
        if len(scopes) > depth:
            in_stage = cdk.Names.node_unique_id(construct.node)
            standalone = make_unique_id([c.node.id for c in scopes[depth:]])
            if in_stage != standalone:
                renamed[in_stage] = standalone
    marker = re.sub(r"[^A-Za-z0-9]", "", "".join(c.node.id for c in stage.node.scopes[1:]))
    for construct in stage.node.find_all():
        if not isinstance(construct, cdk.CfnResource):
            continue
        stack = cdk.Stack.of(construct)
        components = [c.node.id for c in construct.node.scopes[len(stack.node.scopes) :]]
        if not any(marker in c for c in components):
            continue
        for old, new in renamed.items():
            components = [c.replace(old, new) for c in components]
        construct.override_logical_id(make_unique_id(components))


@jsii.implements(cdk.IAspect)
class _StandaloneNameTags:
    """CDK tags EC2 resources (VPC, subnets, gateways, route tables, ...) with `Name` = their construct
    path, which inside this stage starts with the pipeline's path. Strip it, so the pipeline and a
    manual deploy write the same tags instead of flipping them on every deploy. Runs after the tag
    aspects (READONLY priority comes last)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def visit(self, node: IConstruct) -> None:
        tags = cdk.TagManager.of(node)  # both taggable interfaces (e.g. VPC endpoints use the v2 one)
        if tags is None:
            return
        name = tags.tag_values().get("Name")
        if name is not None and name.startswith(self.prefix):
            tags.set_tag("Name", name.removeprefix(self.prefix), 1000)


def _source(scope: Construct, p: PipelineSettings) -> pipelines.CodePipelineSource:
    if p.codecommit_repository is not None:
        repo = codecommit.Repository.from_repository_name(scope, "Repository", p.codecommit_repository)
        return pipelines.CodePipelineSource.code_commit(repo, p.branch)
    assert p.repository is not None and p.connection_arn is not None  # settings enforce the pair
    return pipelines.CodePipelineSource.connection(p.repository, p.branch, connection_arn=p.connection_arn)


def partition(region: str) -> str:
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def verify_role_arn(settings: Settings) -> str:
    return f"arn:{partition(settings.region)}:iam::{settings.account}:role/{verify_role_name(settings)}"


def verify_commands(settings: Settings, *, smoke_code_hash: str | None = None) -> list[str]:
    """Shell commands of the post-deploy step of one environment (CodeBuild, source checkout).
    With `smoke_code_hash` (the training code's asset hash), also wait for the deployed RayJob."""
    role_arn = verify_role_arn(settings)
    commands = [
        # A profile that assumes the environment's verify role from CodeBuild's own credentials;
        # kubectl's exec plugin and the kubernetes client inherit AWS_PROFILE.
        f"aws configure set profile.target.role_arn {role_arn}",
        "aws configure set profile.target.credential_source EcsContainer",
        "export AWS_PROFILE=target",
        f"aws eks update-kubeconfig --region {settings.region} --name {settings.cluster.name}",
        f".venv/bin/raytrain verify --env {settings.name}",
    ]
    if smoke_code_hash is not None:
        commands += smoke_commands(settings, code_hash=smoke_code_hash)
    return commands


def smoke_commands(settings: Settings, *, code_hash: str) -> list[str]:
    """Wait for the RayJob this deploy applied (its name hashes its spec and code) to succeed."""
    name = rayjob_name(settings, code_hash=code_hash, service_account_name=SERVICE_ACCOUNT)
    ns = settings.workload.namespace
    version = settings.cluster.kubernetes_version
    deadline = settings.job.active_deadline_seconds * (settings.job.backoff_limit + 1)
    get = f"kubectl -n {ns} get rayjob {name}"
    script = (
        f"end=$((SECONDS + {deadline})); "
        # <Ray job status>/<RayJob deployment status>: the job can also fail before Ray runs it
        # (cluster never ready, deadline exceeded), which only the deployment status shows.
        f"while :; do state=$({get} -o jsonpath='{{.status.jobStatus}}/{{.status.jobDeploymentStatus}}')"
        " || exit 1; "
        f'echo "rayjob {name}: $state"; '
        f'case "$state" in SUCCEEDED/*) break;; FAILED/*|STOPPED/*|*/Failed) {get} -o yaml; exit 1;; esac; '
        f'[ "$SECONDS" -lt "$end" ] || {{ echo "rayjob {name}: no result in {deadline}s"; exit 1; }}; '
        f"sleep {SMOKE_POLL_SECONDS}; done"
    )
    return [
        # kubectl matching the cluster's minor version (not in the build image).
        f"curl -fsSLo /usr/local/bin/kubectl https://dl.k8s.io/release/v{version}.0/bin/linux/amd64/kubectl",
        "chmod +x /usr/local/bin/kubectl",
        f"bash -c {shlex.quote(script)}",
    ]


def check_smoke_environment(settings: Settings) -> None:
    """The smoke step proves EFA only where the job expects EFA between nodes."""
    if settings.job.transport(settings.gpu_nodes.efa) is not Transport.EFA:
        raise ValueError(
            f"pipeline.smoke_job lists {settings.name!r}, but its job does not expect EFA transport "
            f"(gpu_nodes.efa={settings.gpu_nodes.efa}, job.expect_transport="
            f"{settings.job.expect_transport.value})"
        )


class PipelineStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings, **kwargs: Any) -> None:
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
            description="Pipeline post-deploy checks: assumes each environment's verify role",
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
            env_settings = settings if name == settings.name else load_settings(name)
            smoke = name in p.smoke_job
            if smoke:
                check_smoke_environment(env_settings)
            stage = EnvironmentStage(
                self, f"Deploy-{name}", settings=env_settings, pipeline_principal=principal
            )
            self.stages[name] = stage
            approve = name in p.manual_approval
            pre: list[pipelines.Step] = []
            stack_steps: list[pipelines.StackSteps] = []
            if approve:
                pre.append(pipelines.ConfirmPermissionsBroadening("CheckBroadening", stage=stage))
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
                    resources=[verify_role_arn(env_settings)],
                )
            )
            verify = pipelines.CodeBuildStep(
                f"Verify-{name}",
                input=source,
                install_commands=["make setup-cdk"],
                commands=verify_commands(
                    env_settings,
                    smoke_code_hash=stage.stacks.workload.review.code_hash if smoke else None,
                ),
                role=self.steps_role,
                timeout=_step_timeout(env_settings, smoke=smoke),
            )
            self.pipeline.add_stage(stage, pre=pre, post=[verify], stack_steps=stack_steps)
        # Build now (not lazily at synthesis) so the generated roles exist to be acknowledged.
        self.pipeline.build_pipeline()
        # CDK Pipelines writes the deploy actions' role ARNs as Fn::Join with an empty delimiter;
        # cfn-lint's E3703 (prefer Fn::Sub) is style, on generated values, only on this resource.
        cfn_pipeline = self.pipeline.pipeline.node.default_child
        assert isinstance(cfn_pipeline, cdk.CfnResource)
        cfn_pipeline.add_metadata("cfn-lint", {"config": {"ignore_checks": ["E3703"]}})
        acknowledge_pipeline_findings(self)


def _step_timeout(settings: Settings, *, smoke: bool) -> cdk.Duration:
    if not smoke:
        return cdk.Duration.minutes(30)
    attempts = settings.job.backoff_limit + 1
    minutes = settings.job.active_deadline_seconds * attempts // 60 + 30
    return cdk.Duration.minutes(min(minutes, 480))  # CodeBuild's limit


def _ack(scope: IConstruct, rule: str, reason: str) -> None:
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=rule, reason=reason))


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


def acknowledge_pipeline_findings(stack: PipelineStack) -> None:
    """Findings inherent to CDK Pipelines' generated roles, each acknowledged by its exact finding
    id on the one policy that has it (logical IDs are resolved, so nothing else is covered)."""
    pipeline = stack.pipeline
    bucket = stack.get_logical_id(stack.artifact_bucket.node.default_child)  # type: ignore[arg-type]

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
            _ack(policy, f"AwsSolutions-IAM5[Resource::{finding}]", _CODEBUILD_LOGS)

    def policy_of(path: str) -> IConstruct:
        return _find(pipeline, path).node.find_child("DefaultPolicy")

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
            "Asset publishing assumes the target accounts' CDK file-publishing roles (Resource * under "
            "an aws-cdk:bootstrap-role tag condition); one CodeBuild project per asset, so its log and "
            "report groups are named codebuild/*.",
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
    approve_fn = _find(pipeline, "PipelinesSecurityCheck/CDKPipelinesAutoApprove")
    names = {
        "account": stack.account,
        "region": stack.region,
        "partition": partition(stack.region),
        "approve": stack.get_logical_id(approve_fn.node.default_child),  # type: ignore[arg-type]
    }
    for path, (actions, extra, reason) in roles.items():
        policy = policy_of(path)
        for finding in artifact_findings(actions) if actions else []:
            _ack(policy, finding, _ARTIFACTS)
        for finding in extra:
            _ack(policy, "AwsSolutions-IAM5[" + finding.format(**names) + "]", reason)
    # The source action's role (its construct id is derived from the repository name).
    source_stage = _find(pipeline, "Pipeline/Source")
    for child in source_stage.node.children:
        role = child.node.try_find_child("CodePipelineActionRole")
        if role is not None:
            for finding in artifact_findings(_READ_WRITE_KEY):
                _ack(role.node.find_child("DefaultPolicy"), finding, _ARTIFACTS)
    steps_policy = stack.steps_role.node.find_child("DefaultPolicy")
    for finding in artifact_findings(_READ_KEY):
        _ack(steps_policy, finding, _ARTIFACTS)
    _ack(
        _find(pipeline, "PipelinesSecurityCheck/CDKPipelinesAutoApprove/ServiceRole"),
        "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
        "CDK Pipelines' auto-approve function (approves a stage when no permission broadens) logs "
        "through the AWS managed basic execution policy; CDK owns this role.",
    )


def _find(scope: IConstruct, path: str) -> IConstruct:
    node: IConstruct = scope
    for part in path.split("/"):
        node = node.node.find_child(part)
    return node

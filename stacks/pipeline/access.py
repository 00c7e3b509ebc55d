"""The PipelineAccess stack: in each environment's account, the pipeline's post-deploy verification
runs inside the environment's VPC.

The pipeline's CodeBuild steps run in the pipeline's account, outside any VPC, and CDK Pipelines
gives a step a VPC only in the pipeline's own account and region. EKS sends Kubernetes API requests
from inside the cluster's VPC to the private endpoint once private access is on (EKS API
reference, VpcConfigRequest `endpointPrivateAccess`), which every environment's settings keep on.
So this stack, deployed by the pipeline into the environment's account, holds:

- a CodeBuild project in the VPC's private subnets (NAT for PyPI/npm) with a security group of its
  own, which the control plane's security group admits on TCP 443; its service role has the
  read-only EKS access entry and runs the verification commands (`stacks/pipeline/steps.py`);
- a versioned, KMS-encrypted bucket for the pipeline's checkout, the project's source;
- the starter role that the pipeline's step assumes: it may only upload the checkout to that one
  key, start and stop builds of that one project, read their status and read that project's log
  (`raytrain pipeline-verify` drives it).
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks as eks_l1
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk_constructs import checkov
from cdk_constructs.buckets import kms_bucket_with_access_logs
from cdk_constructs.encrypted_logs import encrypted_log_group
from config.names import VerifyBuild
from config.settings import Settings
from stacks.cluster_stack import control_plane_security_group_export
from stacks.common import log_retention
from stacks.pipeline.nag import acknowledge_access_findings
from stacks.pipeline.steps import (
    BUILD_IMAGE,
    QUEUE_MINUTES,
    RUNTIME_VERSIONS,
    SETUP_COMMANDS,
    step_timeout,
)

# Read-only, cluster-wide: `raytrain verify` reads nodes, DaemonSets, Deployments and the KubeRay
# custom resources; AmazonEKSViewPolicy covers neither nodes nor (unaggregated) CRDs.
VERIFY_ACCESS_POLICY = "AmazonEKSAdminViewPolicy"
HTTPS = 443


def pipeline_verify_role_name(host: Settings) -> str:
    """The CodeBuild role of the pipeline's verify steps, in the pipeline's account."""
    return f"{host.stack_prefix}-pipeline-steps"


class PipelineAccessStack(cdk.Stack):
    """Only in the pipeline's stages: the in-VPC verification build and the role that starts it.
    Kept out of the standalone app so a manual deploy of the environment neither needs nor removes
    it; destroy it before the Cluster stack (it adds a rule to the control plane's group)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        vpc: ec2.IVpc,
        pipeline_principal: str,
        verify_commands: list[str],
        smoke: bool,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        names: VerifyBuild = settings.verify_build
        cluster_name = settings.cluster.name

        source = kms_bucket_with_access_logs(
            self,
            ids=("SourceKey", "SourceAccessLogs", "Source"),
            key_description=f"Pipeline checkouts for the verification of {cluster_name}",
            log_prefix="source/",
            # Uploaded checkouts and build logs only, under fixed names: kept after a destroy they
            # would block the next deploy ("already exists"), so they go in every environment.
            removal_policy=cdk.RemovalPolicy.DESTROY,
            bucket_name=names.bucket,
            # The build names the object version it runs (StartBuild sourceVersion: "For Amazon S3:
            # the version ID of the object that represents the build input ZIP file").
            versioned=True,
            lifecycle_rules=[
                cdk.aws_s3.LifecycleRule(
                    expiration=cdk.Duration.days(30),
                    noncurrent_version_expiration=cdk.Duration.days(7),
                )
            ],
        )
        self.source_bucket, self.source_key = source.bucket, source.key

        # Outbound HTTPS only: the API server (private endpoint), AWS APIs, PyPI, npm, dl.k8s.io
        # (through the NAT). DNS to the VPC resolver is not filtered by security groups.
        self.security_group = ec2.SecurityGroup(
            self,
            "VerifySecurityGroup",
            vpc=vpc,
            description=f"Pipeline verification builds of {cluster_name}",
            allow_all_outbound=False,
        )
        self.security_group.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.tcp(HTTPS), "HTTPS: EKS API, AWS APIs, package registries"
        )
        # The control plane's group (Cluster stack, exported by name) admits this group on 443. An
        # explicit rule here: a rule in the Cluster stack would reference this stack, which
        # references the Cluster stack (a cycle), and the standalone Cluster stack has no build.
        self.cluster_ingress = ec2.CfnSecurityGroupIngress(
            self,
            "ClusterAdmitsVerify",
            group_id=cdk.Fn.import_value(control_plane_security_group_export(settings)),
            source_security_group_id=self.security_group.security_group_id,
            ip_protocol="tcp",
            from_port=HTTPS,
            to_port=HTTPS,
            description="Kubernetes API from the pipeline's in-VPC verification",
        )

        logs = encrypted_log_group(
            self,
            "VerifyLogs",
            description=f"Pipeline verification builds of {cluster_name}",
            log_group_name=names.log_group,
            retention=log_retention(90),
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        self.log_group = logs
        build_spec = codebuild.BuildSpec.from_object(
            {
                "version": "0.2",
                "phases": {
                    "install": {"runtime-versions": RUNTIME_VERSIONS, "commands": SETUP_COMMANDS},
                    "build": {"commands": verify_commands},
                },
            }
        )
        self.project = codebuild.Project(
            self,
            "VerifyProject",
            project_name=names.project,
            description=f"Post-deploy verification of {cluster_name}, inside its VPC",
            source=codebuild.Source.s3(bucket=self.source_bucket, path=names.SOURCE_KEY),
            build_spec=build_spec,
            environment=codebuild.BuildEnvironment(
                build_image=BUILD_IMAGE, compute_type=codebuild.ComputeType.SMALL
            ),
            vpc=vpc,
            subnet_selection=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            security_groups=[self.security_group],
            encryption_key=self.source_key,
            logging=codebuild.LoggingOptions(cloud_watch=codebuild.CloudWatchLoggingOptions(log_group=logs)),
            timeout=step_timeout(settings, smoke=smoke),
            queued_timeout=cdk.Duration.minutes(QUEUE_MINUTES),
        )
        checkov.skip(
            self.project.node.find_child("PolicyDocument"),
            "CKV_AWS_111",
            "CodeBuild creates and deletes a VPC build's network interface with the project's role: "
            "ec2:CreateNetworkInterface/DeleteNetworkInterface on * as the CodeBuild user guide's VPC "
            "policy has them (the interface does not exist before); CDK writes this statement",
        )
        role = self.project.role
        assert role is not None
        self.build_role = role
        # `aws eks update-kubeconfig` reads the endpoint and CA; nothing else is needed from the EKS API.
        role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["eks:DescribeCluster"],
                resources=[self.format_arn(service="eks", resource="cluster", resource_name=cluster_name)],
            )
        )
        self.access_entry = eks_l1.CfnAccessEntry(
            self,
            "VerifyAccess",
            cluster_name=cluster_name,
            principal_arn=role.role_arn,
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
        # The project exists only once its Kubernetes access and the API server's rule do.
        cfn_project = self.project.node.default_child
        assert isinstance(cfn_project, cdk.CfnResource)
        cfn_project.add_resource_dependency(self.access_entry)
        cfn_project.add_resource_dependency(self.cluster_ingress)

        self.starter = iam.Role(
            self,
            "StarterRole",
            role_name=names.starter_role,
            assumed_by=iam.ArnPrincipal(pipeline_principal),
            description=f"Pipeline: upload the checkout and run the in-VPC verification of {cluster_name}",
            # Assumed from CodeBuild's own role session (role chaining: one hour at most); the
            # driver assumes it again before its session expires.
            max_session_duration=cdk.Duration.hours(1),
        )
        starter_policy = iam.Policy(
            self,
            "StarterPolicy",
            roles=[self.starter],
            statements=[
                # The one object the project builds from; SSE-KMS with the bucket's key needs
                # kms:GenerateDataKey for a single PutObject (S3 API reference, PutObject).
                iam.PolicyStatement(
                    actions=["s3:PutObject"],
                    resources=[self.source_bucket.arn_for_objects(names.SOURCE_KEY)],
                ),
                iam.PolicyStatement(actions=["kms:GenerateDataKey"], resources=[self.source_key.key_arn]),
                # StartBuild, StopBuild and BatchGetBuilds are authorised on the project's ARN
                # (CodeBuild permissions reference). No source-location override is needed: the
                # build names the uploaded object's version.
                iam.PolicyStatement(
                    actions=["codebuild:StartBuild", "codebuild:StopBuild", "codebuild:BatchGetBuilds"],
                    resources=[self.project.project_arn],
                ),
                # The build's log: GetLogEvents is authorised on the log stream's ARN
                # (resource type log-stream, log-group:NAME:log-stream:STREAM; Service Authorization
                # Reference, CloudWatch Logs).
                iam.PolicyStatement(
                    actions=["logs:GetLogEvents"],
                    resources=[
                        self.format_arn(
                            service="logs",
                            resource="log-group",
                            resource_name=f"{names.log_group}:log-stream:*",
                            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
                        )
                    ],
                ),
            ],
        )
        self.starter_policy = starter_policy
        acknowledge_access_findings(self, project=self.project, starter=starter_policy)

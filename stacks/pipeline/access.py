"""The PipelineAccess stack: in each environment's account, the role the pipeline's verify steps
assume, with a read-only EKS access entry."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_eks as eks_l1
from aws_cdk import aws_iam as iam
from constructs import Construct

from config.settings import Settings
from stacks.common import partition

# The verify/smoke steps assume this role in each target account (physical names: the step in one
# account and the role in another must agree on them without a cross-account reference).
VERIFY_ROLE_SUFFIX = "pipeline-verify"
# Read-only, cluster-wide: `raytrain verify` reads nodes, DaemonSets, Deployments and the KubeRay
# custom resources; AmazonEKSViewPolicy covers neither nodes nor (unaggregated) CRDs.
VERIFY_ACCESS_POLICY = "AmazonEKSAdminViewPolicy"


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


def verify_role_arn(settings: Settings) -> str:
    return f"arn:{partition(settings.region)}:iam::{settings.account}:role/{verify_role_name(settings)}"

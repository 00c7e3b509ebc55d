"""cdk-nag acknowledgements, each scoped to the construct it concerns, with its reason.

Only findings that are inherent to EKS or to CDK's own provider functions are acknowledged here;
anything else must be fixed. Each acknowledgement names the construct path it applies to, so a new
resource with the same finding elsewhere still fails synthesis.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import IConstruct

if TYPE_CHECKING:
    from stacks.app_builder import EnvironmentStacks

NODE_ROLE_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEC2ContainerRegistryReadOnly",
    "AmazonEKS_CNI_Policy",
)


def _ack(scope: IConstruct, rule: str, reason: str) -> None:
    Validations.of(scope).acknowledge(Acknowledgment(id=rule, reason=reason))


def _managed_policy(name: str, service_role: bool = False) -> str:
    prefix = "service-role/" if service_role else ""
    return f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{prefix}{name}]"


def _ecr_public_policy(stack: Stack, handler: IConstruct) -> str:
    # CDK attaches the ECR Public policy under a condition (only where ECR Public exists), so
    # cdk-nag names the finding by the whole Fn::If expression, which holds the condition's ID.
    condition = handler.node.find_child("HasEcrPublic")
    logical_id = stack.get_logical_id(condition)  # type: ignore[arg-type]
    policy = {
        "Fn::If": [
            logical_id,
            {
                "Fn::Join": [
                    "",
                    [
                        "arn:",
                        {"Ref": "AWS::Partition"},
                        ":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly",
                    ],
                ]
            },
            {"Ref": "AWS::NoValue"},
        ]
    }
    return f"AwsSolutions-IAM4[Policy::{json.dumps(policy, separators=(',', ':'))}]"


def acknowledge_findings(stacks: EnvironmentStacks) -> None:
    cluster_stack = stacks.cluster
    cluster = cluster_stack.cluster

    _ack(
        cluster.role,
        _managed_policy("AmazonEKSClusterPolicy"),
        "EKS requires its service-managed AmazonEKSClusterPolicy on the cluster role.",
    )
    for group in (cluster_stack.system_nodes.nodegroup, cluster_stack.gpu_nodes.nodegroup):
        for policy in NODE_ROLE_POLICIES:
            _ack(
                group.role,
                _managed_policy(policy),
                "Managed node groups need the EKS worker-node policies on the node role: "
                "joining the cluster, pulling images from ECR, and the VPC CNI assigning pod IPs "
                "(AWS maintains these policies as EKS changes).",
            )

    provider = cluster.node.find_child("KubectlProvider")
    handler = provider.node.find_child("Handler")
    lambda_policies = [
        _managed_policy("AWSLambdaBasicExecutionRole", service_role=True),
        _managed_policy("AWSLambdaVPCAccessExecutionRole", service_role=True),
        _managed_policy("AmazonEC2ContainerRegistryReadOnly"),
        _ecr_public_policy(cluster_stack, handler),
    ]
    for policy in lambda_policies:
        _ack(
            provider,
            policy,
            "CDK's kubectl provider (handler + custom-resource framework) uses AWS managed "
            "policies for logs, VPC ENIs and pulling its layer images; CDK owns these roles.",
        )
    handler_arn = cluster_stack.get_logical_id(handler.node.default_child)  # type: ignore[arg-type]
    _ack(
        provider,
        f"AwsSolutions-IAM5[Resource::<{handler_arn}.Arn>:*]",
        "The custom-resource framework may invoke any version of CDK's own kubectl handler "
        "function (<handler ARN>:*); the wildcard is scoped to that one function.",
    )
    _ack(
        provider,
        "AwsSolutions-L1",
        "CDK pins the runtime of its kubectl handler to the one the kubectl layer is built for.",
    )

    workload = stacks.workload
    bucket_arn = workload.get_logical_id(workload.bucket.node.default_child)  # type: ignore[arg-type]
    _ack(
        workload.role.node.find_child("DefaultPolicy"),
        f"AwsSolutions-IAM5[Resource::<{bucket_arn}.Arn>/checkpoints/*]",
        "Ray Train writes one file per rank and checkpoint under the run's prefix; the names are "
        "not known in advance, so the object wildcard is limited to the checkpoints/ prefix.",
    )

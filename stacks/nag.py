"""cdk-nag acknowledgements of an environment's stacks, per stack, each scoped to the construct it
concerns, with its reason (through `cdk_constructs.nag.acknowledge`, like every acknowledgement).

Only findings that are inherent to EKS or to CDK's own provider functions are acknowledged here;
anything else must be fixed. Each acknowledgement names the construct path it applies to, so a new
resource with the same finding elsewhere still fails synthesis. Constructs that bring their own
findings (VPC cleanup, cluster autoscaler) acknowledge them themselves; the pipeline's are in
`stacks/pipeline/nag.py`.
"""

from __future__ import annotations

import json

from aws_cdk import Stack
from constructs import IConstruct

from cdk_constructs.nag import acknowledge, managed_policy_finding
from stacks.cluster_stack import ClusterStack
from stacks.common import partition
from stacks.workload_stack import WorkloadStack

NODE_ROLE_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEC2ContainerRegistryReadOnly",
    "AmazonEKS_CNI_Policy",
)


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


def acknowledge_cluster_findings(cluster_stack: ClusterStack) -> None:
    cluster = cluster_stack.cluster

    acknowledge(
        cluster.role,
        managed_policy_finding("AmazonEKSClusterPolicy"),
        "EKS requires its service-managed AmazonEKSClusterPolicy on the cluster role.",
    )
    for group in (cluster_stack.system_nodes.nodegroup, cluster_stack.gpu_nodes.nodegroup):
        for policy in NODE_ROLE_POLICIES:
            acknowledge(
                group.role,
                managed_policy_finding(policy),
                "Managed node groups need the EKS worker-node policies on the node role: "
                "joining the cluster, pulling images from ECR, and the VPC CNI assigning pod IPs "
                "(AWS maintains these policies as EKS changes).",
            )

    provider = cluster.node.find_child("KubectlProvider")
    handler = provider.node.find_child("Handler")
    lambda_policies = [
        managed_policy_finding("AWSLambdaBasicExecutionRole", service_role=True),
        managed_policy_finding("AWSLambdaVPCAccessExecutionRole", service_role=True),
        managed_policy_finding("AmazonEC2ContainerRegistryReadOnly"),
        _ecr_public_policy(cluster_stack, handler),
    ]
    for policy in lambda_policies:
        acknowledge(
            provider,
            policy,
            "CDK's kubectl provider (handler + custom-resource framework) uses AWS managed "
            "policies for logs, VPC ENIs and pulling its layer images; CDK owns these roles.",
        )
    handler_arn = cluster_stack.get_logical_id(handler.node.default_child)  # type: ignore[arg-type]
    acknowledge(
        provider,
        f"AwsSolutions-IAM5[Resource::<{handler_arn}.Arn>:*]",
        "The custom-resource framework may invoke any version of CDK's own kubectl handler "
        "function (<handler ARN>:*); the wildcard is scoped to that one function.",
    )
    acknowledge(
        provider,
        "AwsSolutions-L1",
        "CDK pins the runtime of its kubectl handler to the one the kubectl layer is built for.",
    )


def acknowledge_workload_findings(workload: WorkloadStack) -> None:
    bucket_arn = workload.get_logical_id(workload.bucket.node.default_child)  # type: ignore[arg-type]
    code = (
        f"AwsSolutions-IAM5[Resource::<{bucket_arn}.Arn>/code/*]",
        "Submitted training code is one zip per content, code/<sha256>.zip, named at submit time; "
        "the wildcard is limited to the code/ prefix (read only for the Ray pods; add and read for "
        "submitters, who can neither delete nor list).",
    )
    acknowledge(workload.submitter_policy, *code)
    for team, role in workload.roles.items():
        policy = role.node.find_child("DefaultPolicy")
        prefix = workload.checkpoint_prefixes[team]
        acknowledge(
            policy,
            f"AwsSolutions-IAM5[Resource::<{bucket_arn}.Arn>/{prefix}/*]",
            "Ray Train writes one file per rank and checkpoint under the run's prefix; the names are "
            f"not known in advance, so the object wildcard is limited to the team's {prefix}/ prefix.",
        )
        acknowledge(policy, *code)
        for location in workload.inputs:
            for arn in location.object_arns(partition(workload.region)):
                if arn.endswith("*"):
                    acknowledge(
                        policy,
                        f"AwsSolutions-IAM5[Resource::{arn}]",
                        f"{location.setting} is a folder of files (text or token shards, or model "
                        "files) read by name; read-only, limited to that prefix.",
                    )

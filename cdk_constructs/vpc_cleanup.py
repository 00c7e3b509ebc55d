"""Custom resource that, when its stack is deleted, removes what EKS left in the VPC outside
CloudFormation (load balancers, target groups, security groups, available ENIs), so the VPC's own
deletion does not stop on a DependencyViolation. The handler is `vpc_cleanup_handler/handler.py`.

Where it runs in a destroy, and why it sits in the Network stack:
- The Cluster stack imports the Network stack's exports (VPC, subnets), so CloudFormation (and
  `cdk destroy`, which follows stack dependencies) deletes Workload, then Cluster, then Network.
  When Network's deletion starts, the EKS cluster and its node groups are already gone: nothing
  recreates load balancers or ENIs behind our back.
- Inside the Network stack this resource depends on every resource of the VPC construct (subnets,
  route tables, NAT and internet gateways, endpoints, the VPC). CloudFormation deletes dependents
  first, so this resource is deleted — the handler runs — before any of them.
- Its function and role are siblings it depends on, so they outlive it.
"""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk_constructs import handler_function as fn
from cdk_constructs.nag import acknowledge
from cdk_constructs.vpc_cleanup_handler.handler import ELBV2_CLUSTER_TAG, cluster_tag

HANDLER_DIR = Path(__file__).resolve().parent / "vpc_cleanup_handler"
RESOURCE_TYPE = "Custom::EksVpcCleanup"
# Lambda's ceiling; the handler keeps a margin to answer CloudFormation.
HANDLER_TIMEOUT = cdk.Duration.minutes(15)


# checkov's Lambda checks this function does not meet, and why (it runs once, on stack delete).
CLEANUP_CHECKOV_REASONS = {
    "CKV_AWS_115": "runs once per stack delete, invoked by CloudFormation: a reserved-concurrency limit "
    "would only take from the account's pool (and fails in accounts with the minimum of 10)",
    "CKV_AWS_116": "invoked by CloudFormation, which records a failure in the stack events and keeps "
    "the resource so the next destroy retries: a dead-letter queue would hold nothing actionable",
    "CKV_AWS_117": "calls only the EC2 and ELB APIs, and runs while the VPC's NAT gateway and "
    "endpoints are being deleted: inside the VPC it could lose its way to them",
}


class VpcCleanup(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.Vpc,
        cluster_name: str,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        # Named, so its log group (/aws/lambda/<name>, created by Lambda on the first invocation and
        # not by CloudFormation) is recognisable after destroy; the Network stack keeps a single
        # CloudFormation log group, the flow logs'.
        self.function_name = f"{cluster_name}-vpc-cleanup"[:64]
        log_group = fn.log_group_arn(self, self.function_name)
        self.role = fn.handler_role(
            self, f"Removes what EKS cluster {cluster_name} left in its VPC, on stack delete"
        )
        self.role.add_to_policy(fn.write_logs(log_group))
        # Describe calls have no resource-level permissions.
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=[
                    "ec2:DescribeNetworkInterfaces",
                    "ec2:DescribeSecurityGroups",
                    "elasticloadbalancing:DescribeLoadBalancers",
                    "elasticloadbalancing:DescribeTargetGroups",
                    "elasticloadbalancing:DescribeTags",
                ],
                resources=["*"],
            )
        )
        vpc_arn = stack.format_arn(service="ec2", resource="vpc", resource_name=vpc.vpc_id)
        # Deletes only inside this VPC; the IDs are made by EKS/Kubernetes, unknown in advance.
        delete_resources = [
            stack.format_arn(service="ec2", resource="network-interface", resource_name="*"),
            stack.format_arn(service="ec2", resource="security-group", resource_name="*"),
        ]
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=[
                    "ec2:DeleteNetworkInterface",
                    "ec2:DeleteSecurityGroup",
                    "ec2:RevokeSecurityGroupIngress",
                    "ec2:RevokeSecurityGroupEgress",
                ],
                resources=delete_resources,
                conditions={"ArnEquals": {"ec2:Vpc": vpc_arn}},
            )
        )
        elb_resources = [
            stack.format_arn(service="elasticloadbalancing", resource="loadbalancer", resource_name="*"),
            stack.format_arn(service="elasticloadbalancing", resource="targetgroup", resource_name="*"),
        ]
        elb_actions = [
            "elasticloadbalancing:DeleteLoadBalancer",
            "elasticloadbalancing:ModifyLoadBalancerAttributes",
            "elasticloadbalancing:DeleteTargetGroup",
        ]
        # Only load balancers and target groups tagged for this cluster, by either controller.
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=elb_actions,
                resources=elb_resources,
                conditions={"StringEquals": {f"aws:ResourceTag/{ELBV2_CLUSTER_TAG}": cluster_name}},
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=elb_actions,
                resources=elb_resources,
                conditions={"Null": {f"aws:ResourceTag/{cluster_tag(cluster_name)}": "false"}},
            )
        )
        self.function = fn.handler_function(
            self,
            HANDLER_DIR,
            role=self.role,
            function_name=self.function_name,
            description=f"EKS leftovers cleanup for {cluster_name} (runs on stack delete only)",
            timeout=HANDLER_TIMEOUT,
            memory_size=256,
            checkov_reasons=CLEANUP_CHECKOV_REASONS,
        )
        self.resource = fn.handler_resource(
            self,
            self.function,
            resource_type=RESOURCE_TYPE,
            properties={"VpcId": vpc.vpc_id, "ClusterName": cluster_name},
            timeout=HANDLER_TIMEOUT,
        )
        # Deleted before every resource of the VPC (see the module docstring).
        self.resource.node.add_dependency(vpc)

        policy = self.role.node.find_child("DefaultPolicy")
        acknowledge(
            policy,
            "AwsSolutions-IAM5[Resource::*]",
            "Describe calls (ENIs, security groups, load balancers, target groups, tags) have no "
            "resource-level permissions; every delete below is scoped.",
        )
        fn.acknowledge_log_streams(policy, log_group)
        for arn in delete_resources:
            acknowledge(
                policy,
                f"AwsSolutions-IAM5[Resource::{stack.resolve(arn)}]",
                "The ENIs and security groups EKS leaves have IDs unknown before deploy; deletes are "
                "limited to this VPC by the ec2:Vpc condition.",
            )
        for arn in elb_resources:
            acknowledge(
                policy,
                f"AwsSolutions-IAM5[Resource::{stack.resolve(arn)}]",
                "Load balancers and target groups made by Kubernetes controllers have names unknown "
                "before deploy; deletes require the cluster's ownership tag (aws:ResourceTag condition).",
            )

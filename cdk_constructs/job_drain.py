"""Custom resource that, when the Workload stack is deleted (or its failed creation rolls back),
deletes the RayJobs `raytrain job submit` created (foreground) and waits until they are gone:
before the stack's manifests (the jobs
anchor, the Roles) go, and so before the Cluster stack (the KubeRay operator) goes. Why the anchor
alone does not hold the destroy: `job_drain_handler/handler.py`.

Where it runs: the function sits where CDK's kubectl provider sits (the cluster's private subnets,
the cluster security group, which the control plane admits), with the same layers (kubectl,
AWS CLI). Its role has an EKS access entry of type STANDARD in the drainer's Kubernetes group, which
a Role in the Ray namespace binds to listing and deleting RayJobs (k8s/rbac.py), and
eks:DescribeCluster on this cluster (aws eks update-kubeconfig), and cloudformation:DescribeStacks
on its own stack, whose status tells a stack delete from a replacement, a removal or an update's
rollback (job_drain_handler/handler.py), which leave the jobs alone. The resource depends on the
manifest and on the access entry, so CloudFormation deletes it (runs the handler) first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk.lambda_layer_awscli import AwsCliLayer
from constructs import Construct

from cdk_constructs import handler_function as fn
from cdk_constructs.nag import acknowledge, managed_policy_finding
from config.names import JOB_DRAIN_RESOURCE_TYPE

HANDLER_DIR = Path(__file__).resolve().parent / "job_drain_handler"
RESOURCE_TYPE = JOB_DRAIN_RESOURCE_TYPE
HANDLER_TIMEOUT = cdk.Duration.minutes(15)

DRAIN_CHECKOV_REASONS = {
    "CKV_AWS_115": "runs once per stack delete, invoked by CloudFormation: a reserved-concurrency limit "
    "would only take from the account's pool",
    "CKV_AWS_116": "invoked by CloudFormation, which records a failure in the stack events and keeps "
    "the resource so the next destroy retries: a dead-letter queue would hold nothing actionable",
    "CKV_AWS_173": "its one environment variable is AWS_STS_REGIONAL_ENDPOINTS=regional (as CDK's "
    "kubectl provider sets, so `aws eks get-token` signs for the VPC's regional STS endpoint): "
    "nothing secret to encrypt",
}


class SubmittedJobDrain(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        cluster_arn: str,
        namespace: str,
        selector: str,
        kubectl_layer: lambda_.ILayerVersion,
        vpc: ec2.IVpc,
        security_group: ec2.ISecurityGroup,
        other_namespaces: Sequence[str] = (),
    ) -> None:
        """`namespace` and `other_namespaces`: one drain each (every team's namespace), by one function."""
        super().__init__(scope, construct_id)
        self.function_name = f"{cluster_name}-job-drain"[:64]
        log_group = fn.log_group_arn(self, self.function_name)
        self.role = fn.handler_role(
            self,
            f"Deletes the submitted RayJobs of {cluster_name} on Workload stack delete",
            # ENIs in the VPC, as CDK's kubectl provider (Lambda Developer Guide, VPC permissions).
            managed_policies=[
                iam.ManagedPolicy.from_aws_managed_policy_name("service-role/AWSLambdaVPCAccessExecutionRole")
            ],
        )
        policy = iam.Policy(
            self,
            "Policy",
            statements=[
                fn.write_logs(log_group),
                iam.PolicyStatement(actions=["eks:DescribeCluster"], resources=[cluster_arn]),
                # Its own stack only (Ref AWS::StackId: the ARN DescribeStacks is authorised on).
                iam.PolicyStatement(actions=["cloudformation:DescribeStacks"], resources=[cdk.Aws.STACK_ID]),
            ],
        )
        policy.attach_to_role(self.role)
        fn.acknowledge_log_streams(policy, log_group)
        acknowledge(
            self.role,
            managed_policy_finding("AWSLambdaVPCAccessExecutionRole", service_role=True),
            "The AWS managed policy for a function in a VPC (its ENIs), as CDK's kubectl provider uses.",
        )
        self.function = fn.handler_function(
            self,
            HANDLER_DIR,
            role=self.role,
            function_name=self.function_name,
            description=f"Deletes {cluster_name}'s submitted RayJobs and waits (stack delete only)",
            timeout=HANDLER_TIMEOUT,
            memory_size=512,
            checkov_reasons=DRAIN_CHECKOV_REASONS,
            layers=[kubectl_layer, AwsCliLayer(self, "AwsCliLayer")],
            vpc=vpc,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            security_groups=[security_group],
            environment={"AWS_STS_REGIONAL_ENDPOINTS": "regional"},
        )
        self.function.node.add_dependency(policy)
        self.resources = [
            fn.handler_resource(
                self if i == 0 else Construct(self, f"Namespace-{ns}"),
                self.function,
                resource_type=RESOURCE_TYPE,
                properties={"ClusterName": cluster_name, "Namespace": ns, "Selector": selector},
                timeout=HANDLER_TIMEOUT,
            )
            for i, ns in enumerate([namespace, *other_namespaces])
        ]
        self.resource = self.resources[0]

    def after(self, *dependencies: Any) -> None:
        """Deleted before these (CloudFormation deletes a resource before what it depends on)."""
        for resource in self.resources:
            resource.node.add_dependency(*dependencies)

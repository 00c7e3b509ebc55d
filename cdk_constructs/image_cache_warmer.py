"""Custom resource that pulls a digest-pinned image through the pull-through cache by tag at deploy,
then checks the digest is served (the handler's docstring says why: aws/containers-roadmap#2837).

It sits in the Cluster stack, after the cache's rules, and before anything that runs the image (the
Workload stack's RayJob, `raytrain job submit`). A changed tag or digest updates it, so a new pin is
warmed and checked by the same deploy that ships it. Its function runs outside the VPC: it only
calls ECR, and the registry's first pull of an image goes to the upstream anyway.
"""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk_constructs import handler_function as fn
from cdk_constructs.image_cache import FILL_ACTIONS
from cdk_constructs.nag import acknowledge

HANDLER_DIR = Path(__file__).resolve().parent / "image_cache_warmer_handler"
RESOURCE_TYPE = "Custom::ImageCacheWarm"
# Tag pulls with backoff (handler ATTEMPTS x BACKOFF_SECONDS) and a multi-GB import: well inside this.
HANDLER_TIMEOUT = cdk.Duration.minutes(10)
# The pulls a first pull by tag and the digest check make (ECR User Guide, "IAM permissions required
# to sync an upstream registry"): the manifest reads, and the cache's fill actions.
PULL_ACTIONS = ("ecr:BatchGetImage", "ecr:BatchCheckLayerAvailability", *FILL_ACTIONS)

WARMER_CHECKOV_REASONS = {
    "CKV_AWS_115": "runs once per deploy that changes the pinned image, invoked by CloudFormation: a "
    "reserved-concurrency limit would only take from the account's pool",
    "CKV_AWS_116": "invoked by CloudFormation, which records a failure in the stack events and rolls "
    "back: a dead-letter queue would hold nothing actionable",
    "CKV_AWS_117": "calls only ECR's API and registry endpoints; outside the VPC it needs no endpoint "
    "or NAT of the cluster's",
}


class ImageCacheWarmer(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        registry: str,
        repository: str,
        tag: str,
        digest: str,
        repository_prefix: str,
        function_name: str,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        self.role = fn.handler_role(
            self, f"Pulls {repository}:{tag} through the ECR pull-through cache at deploy"
        )
        self.function = fn.handler_function(
            self,
            HANDLER_DIR,
            role=self.role,
            # Named, so its log group (/aws/lambda/<name>, made by Lambda) is known to the policy
            # below and recognisable after destroy.
            function_name=function_name,
            description=f"Warms the pull-through cache with {repository}:{tag} and checks {digest[:19]}…",
            timeout=HANDLER_TIMEOUT,
            memory_size=256,
            checkov_reasons=WARMER_CHECKOV_REASONS,
        )
        log_group = fn.log_group_arn(self, function_name)
        repositories = stack.format_arn(
            service="ecr", resource="repository", resource_name=f"{repository_prefix}/*"
        )
        self.role.add_to_policy(fn.write_logs(log_group))
        # GetAuthorizationToken has no resource-level permissions (ECR's service authorization reference).
        self.role.add_to_policy(iam.PolicyStatement(actions=["ecr:GetAuthorizationToken"], resources=["*"]))
        self.role.add_to_policy(iam.PolicyStatement(actions=list(PULL_ACTIONS), resources=[repositories]))
        self.resource = fn.handler_resource(
            self,
            self.function,
            resource_type=RESOURCE_TYPE,
            properties={"Registry": registry, "Repository": repository, "Tag": tag, "Digest": digest},
            timeout=HANDLER_TIMEOUT,
        )
        # The role's policy before the first invocation (CloudFormation would otherwise race them).
        self.resource.node.add_dependency(self.role)
        policy = self.role.node.find_child("DefaultPolicy")
        acknowledge(
            policy,
            "AwsSolutions-IAM5[Resource::*]",
            "ecr:GetAuthorizationToken has no resource-level permissions; every pull is scoped to the "
            "cache's repositories.",
        )
        acknowledge(
            policy,
            f"AwsSolutions-IAM5[Resource::{stack.resolve(repositories)}]",
            "ECR names a cached repository after the upstream's path on the first pull; the grant "
            "covers only repositories under this environment's cache prefix.",
        )
        fn.acknowledge_log_streams(policy, log_group)

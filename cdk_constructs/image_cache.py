"""ECR pull-through cache: one rule per upstream the cluster's images come from, and what the nodes'
role needs to fill it on a first pull.

Permissions (ECR User Guide, "IAM permissions required to sync an upstream registry with an Amazon
ECR private registry"): besides the usual pull permissions (the node role's
AmazonEC2ContainerRegistryReadOnly, which EKS attaches to managed node groups),
`ecr:BatchImportUpstreamImage` "to retrieve the external image and import it to your private
registry", and `ecr:CreateRepository`, "required if the repository storing the cached images
doesn't already exist" -- both checked against the caller of the pull, here the kubelet's node
role. Granted only on repositories under the cache's prefix.
"""

from __future__ import annotations

from collections.abc import Iterable

from aws_cdk import Stack
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk_constructs.nag import acknowledge
from config.registries import UPSTREAMS, ImageSource

# The actions a first pull through the cache needs beyond a plain pull (module docstring).
FILL_ACTIONS = ("ecr:BatchImportUpstreamImage", "ecr:CreateRepository")


class PullThroughCache(Construct):
    """`AWS::ECR::PullThroughCacheRule` for each upstream in `upstreams` (ECR's names: ecr-public,
    quay, k8s), and a policy on the node roles that lets their pulls fill the cache."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        source: ImageSource,
        upstreams: Iterable[str],
        node_roles: list[iam.IRole],
    ) -> None:
        super().__init__(scope, construct_id)
        assert source.prefix is not None, "the cache is off"
        hosts = {name: host for host, name in UPSTREAMS.items()}
        self.rules: dict[str, ecr.CfnPullThroughCacheRule] = {}
        for name in sorted(set(upstreams)):
            self.rules[name] = ecr.CfnPullThroughCacheRule(
                self,
                name,
                ecr_repository_prefix=source.rule_prefix(name),
                upstream_registry=name,
                upstream_registry_url=hosts[name],
                # No CredentialArn: these upstreams need none (config/registries.py).
            )
        repositories = Stack.of(self).format_arn(
            service="ecr", resource="repository", resource_name=f"{source.prefix}/*"
        )
        self.policy = iam.Policy(
            self,
            "FillFromNodes",
            statements=[iam.PolicyStatement(actions=list(FILL_ACTIONS), resources=[repositories])],
            roles=node_roles,
        )
        acknowledge(
            self.policy,
            f"AwsSolutions-IAM5[Resource::{Stack.of(self).resolve(repositories)}]",
            "ECR names a cached repository after the upstream's path on the first pull; the grant "
            "covers only repositories under this environment's cache prefix.",
        )

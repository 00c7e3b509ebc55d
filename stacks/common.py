"""Small helpers shared by the stacks."""

from __future__ import annotations

import aws_cdk as cdk

from config.settings import RemovalPolicy, Settings


def removal_policy(settings: Settings) -> cdk.RemovalPolicy:
    """What happens to stateful resources (buckets, keys, log groups) when a stack is destroyed."""
    if settings.storage.removal_policy is RemovalPolicy.RETAIN:
        return cdk.RemovalPolicy.RETAIN
    return cdk.RemovalPolicy.DESTROY


def partition(region: str) -> str:
    """The ARN partition of a region (ARNs are built from settings, across accounts)."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"

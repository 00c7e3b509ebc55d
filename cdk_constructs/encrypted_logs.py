"""CloudWatch log groups encrypted with their own customer-managed KMS key.

For log groups whose contents are sensitive: the EKS control-plane log (API audit records: who did
what to which object) and the VPC flow log (every connection's addresses and ports). CloudWatch Logs
encrypts with the key itself, so the key policy grants the regional Logs service principal the key
operations, limited by the `kms:EncryptionContext:aws:logs:arn` condition to log groups of this
account and region ("Encrypt log data in CloudWatch Logs using AWS KMS", CloudWatch Logs user guide).
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct


def encrypted_log_group(
    scope: Construct,
    construct_id: str,
    *,
    description: str,
    retention: logs.RetentionDays,
    removal_policy: cdk.RemovalPolicy,
    log_group_name: str | None = None,
) -> logs.LogGroup:
    """A log group and its key (`<construct_id>Key`); both follow `removal_policy` (a retained log
    group keeps its key: without it the logs could not be read)."""
    stack = cdk.Stack.of(scope)
    key = kms.Key(
        scope,
        f"{construct_id}Key",
        description=description,
        enable_key_rotation=True,
        removal_policy=removal_policy,
    )
    # A named group's own ARN; an unnamed one (the name is generated at deploy) cannot be named in
    # its key's policy without a dependency cycle, so any log group of this account and region.
    log_group_arn = stack.format_arn(
        service="logs",
        resource="log-group",
        resource_name=log_group_name or "*",
        arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
    )
    key.add_to_resource_policy(
        iam.PolicyStatement(
            principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
            actions=[
                "kms:Encrypt*",
                "kms:Decrypt*",
                "kms:ReEncrypt*",
                "kms:GenerateDataKey*",
                "kms:Describe*",
            ],
            resources=["*"],  # in a key policy, "*" is this key
            conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn": log_group_arn}},
        )
    )
    return logs.LogGroup(
        scope,
        construct_id,
        log_group_name=log_group_name,
        encryption_key=key,
        retention=retention,
        removal_policy=removal_policy,
    )

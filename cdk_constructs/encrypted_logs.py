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


def log_group_key(
    scope: Construct,
    construct_id: str,
    *,
    description: str,
    removal_policy: cdk.RemovalPolicy,
    log_group_names: str = "*",
) -> kms.Key:
    """A key CloudWatch Logs may use for the log groups of this account and region whose names
    match `log_group_names` (a name, or a pattern ending in *)."""
    stack = cdk.Stack.of(scope)
    key = kms.Key(
        scope,
        construct_id,
        description=description,
        enable_key_rotation=True,
        removal_policy=removal_policy,
    )
    log_group_arn = stack.format_arn(
        service="logs",
        resource="log-group",
        resource_name=log_group_names,
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
    return key


def encrypted_log_group(
    scope: Construct,
    construct_id: str,
    *,
    description: str,
    retention: logs.RetentionDays,
    removal_policy: cdk.RemovalPolicy,
    log_group_name: str | None = None,
    key: kms.IKey | None = None,
) -> logs.LogGroup:
    """A log group and, unless `key` is given, its own key (`<construct_id>Key`); both follow
    `removal_policy` (a retained log group keeps its key: without it the logs could not be read).
    An unnamed group's name is generated at deploy, so its key's policy cannot name it without a
    dependency cycle: it allows any log group of this account and region."""
    if key is None:
        key = log_group_key(
            scope,
            f"{construct_id}Key",
            description=description,
            removal_policy=removal_policy,
            log_group_names=log_group_name or "*",
        )
    return logs.LogGroup(
        scope,
        construct_id,
        log_group_name=log_group_name,
        encryption_key=key,
        retention=retention,
        removal_policy=removal_policy,
    )

"""Small helpers shared by the stacks."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_logs as logs

from config.names import arn_partition
from config.settings import RemovalPolicy, Settings


def removal_policy(settings: Settings) -> cdk.RemovalPolicy:
    """What happens to stateful resources (buckets, keys, log groups) when a stack is destroyed."""
    if settings.storage.removal_policy is RemovalPolicy.RETAIN:
        return cdk.RemovalPolicy.RETAIN
    return cdk.RemovalPolicy.DESTROY


def partition(region: str) -> str:
    """The ARN partition of a region (ARNs are built from settings, across accounts)."""
    return arn_partition(region)


def log_retention(days: int) -> logs.RetentionDays:
    """CloudWatch Logs retention from a number of days the settings allow."""
    by_days = {
        1: logs.RetentionDays.ONE_DAY,
        3: logs.RetentionDays.THREE_DAYS,
        5: logs.RetentionDays.FIVE_DAYS,
        7: logs.RetentionDays.ONE_WEEK,
        14: logs.RetentionDays.TWO_WEEKS,
        30: logs.RetentionDays.ONE_MONTH,
        60: logs.RetentionDays.TWO_MONTHS,
        90: logs.RetentionDays.THREE_MONTHS,
        120: logs.RetentionDays.FOUR_MONTHS,
        150: logs.RetentionDays.FIVE_MONTHS,
        180: logs.RetentionDays.SIX_MONTHS,
        365: logs.RetentionDays.ONE_YEAR,
    }
    return by_days[days]

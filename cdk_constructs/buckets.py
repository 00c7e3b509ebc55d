"""An encrypted bucket with its own KMS key and server-access-log bucket.

A function, not a Construct: the resources are created directly in the caller's scope under the ids
it passes, so their logical IDs (pinned in tests/fixtures/logical_ids.json) do not move.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import aws_cdk as cdk
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from cdk_constructs import checkov


@dataclass(frozen=True)
class LoggedBucket:
    key: kms.Key
    access_logs: s3.Bucket
    bucket: s3.Bucket


def kms_bucket_with_access_logs(
    scope: Construct,
    *,
    ids: tuple[str, str, str],
    key_description: str,
    log_prefix: str,
    removal_policy: cdk.RemovalPolicy,
    bucket_name: str | None = None,
    versioned: bool = False,
    lifecycle_rules: Sequence[s3.LifecycleRule] = (),
) -> LoggedBucket:
    """`ids` = (key id, access-log bucket id, bucket id). With RemovalPolicy.DESTROY both buckets are
    emptied (all versions) and removed on destroy; with RETAIN they, and the key, stay."""
    key_id, logs_id, bucket_id = ids
    destroy = removal_policy == cdk.RemovalPolicy.DESTROY
    key = kms.Key(
        scope, key_id, description=key_description, enable_key_rotation=True, removal_policy=removal_policy
    )
    access_logs = access_log_bucket(scope, logs_id, removal_policy=removal_policy)
    bucket = s3.Bucket(
        scope,
        bucket_id,
        bucket_name=bucket_name,
        encryption=s3.BucketEncryption.KMS,
        encryption_key=key,
        bucket_key_enabled=True,
        versioned=versioned or None,
        enforce_ssl=True,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        server_access_logs_bucket=access_logs,
        server_access_logs_prefix=log_prefix,
        lifecycle_rules=list(lifecycle_rules),
        removal_policy=removal_policy,
        auto_delete_objects=destroy,
    )
    return LoggedBucket(key=key, access_logs=access_logs, bucket=bucket)


def access_log_bucket(scope: Construct, construct_id: str, *, removal_policy: cdk.RemovalPolicy) -> s3.Bucket:
    """A bucket that receives S3 server access logs: SSE-S3 (log delivery cannot write SSE-KMS
    objects), no public access, TLS only, logs kept a year."""
    access_logs = s3.Bucket(
        scope,
        construct_id,
        encryption=s3.BucketEncryption.S3_MANAGED,  # log delivery cannot write SSE-KMS objects
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        enforce_ssl=True,
        # Log delivery is granted by bucket policy (cdk.json flag), so ACLs stay off.
        object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
        lifecycle_rules=[s3.LifecycleRule(expiration=cdk.Duration.days(365))],
        removal_policy=removal_policy,
        auto_delete_objects=removal_policy == cdk.RemovalPolicy.DESTROY,
    )
    checkov.skip(
        access_logs,
        "CKV_AWS_18",
        "the access-log bucket itself: logging it would need a further bucket, or loop into itself",
    )
    checkov.skip(
        access_logs,
        "CKV_AWS_21",
        "written only by S3 log delivery, never overwritten, expired after 365 days: versions would "
        "hold nothing that is not already there",
    )
    return access_logs

"""A pipeline that deploys an environment in another region: CodePipeline's replication bucket there.

CodePipeline runs an action in another region from an artifact store in that region ("a cross-region
action ... an artifact bucket in each Region", CodePipeline User Guide, actions-create-cross-region);
CDK creates one per region in a support stack of the pipeline's account
(`cross-region-stack-<account>:<region>`, aws-codepipeline/lib/private/cross-region-support-stack.ts):
a bucket with all public access blocked, TLS enforced, SSE-KMS under a key of its own whose alias has a
generated name (so the pipeline's template, in another region, can name it). Two things it leaves
open, closed here:

- the bucket has no server access logs (cdk-nag AwsSolutions-S1): a log bucket in the same stack
  receives them, as for the pipeline's own artifact bucket;
- the pipeline's role may use that key through an identity statement on `kms:*`-style actions with
  Resource "*" (aws-kms Key.grant writes "*" when the grantee's stack cannot reference the key's ARN,
  as across regions). "*" would also reach every other key in the account whose key policy delegates
  to IAM. The statement is narrowed to keys of that region and account that carry the replication
  key's alias (`kms:ResourceAliases`, KMS developer guide, alias-authorization: "allows or denies
  access to a KMS key based on the aliases associated with the KMS key").
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_codepipeline as codepipeline
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

from cdk_constructs import checkov
from cdk_constructs.buckets import access_log_bucket
from cdk_constructs.nag import acknowledge
from stacks.common import partition

LOG_PREFIX = "replication/"
# The same life as the pipeline's own artifacts (stack.py): rebuilt by every run.
EXPIRE_DAYS = 30


def harden_replication_buckets(stack: cdk.Stack, pipeline: codepipeline.Pipeline) -> list[cdk.Stack]:
    """Log, expire and narrow the key grant of every replication bucket CDK made for `pipeline`;
    returns the support stacks (deployed before the pipeline stack, which depends on them)."""
    supports = dict(pipeline.cross_region_support)
    if not supports:
        return []
    aliases: dict[str, str] = {}
    for region, support in sorted(supports.items()):
        bucket = support.replication_bucket
        support_stack = support.stack
        # CDK retains the replication bucket (it may hold the last run's artifacts); its logs stay too.
        logs = access_log_bucket(
            support_stack, "ReplicationAccessLogs", removal_policy=cdk.RemovalPolicy.RETAIN
        )
        cfn_bucket = bucket.node.default_child
        assert isinstance(cfn_bucket, s3.CfnBucket)
        cfn_bucket.logging_configuration = s3.CfnBucket.LoggingConfigurationProperty(
            destination_bucket_name=logs.bucket_name, log_file_prefix=LOG_PREFIX
        )
        # What `server_access_logs_bucket` writes under the serverAccessLogsUseBucketPolicy flag.
        logs.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal("logging.s3.amazonaws.com")],
                actions=["s3:PutObject"],
                resources=[logs.arn_for_objects(f"{LOG_PREFIX}*")],
                conditions={
                    "ArnLike": {"aws:SourceArn": bucket.bucket_arn},
                    "StringEquals": {"aws:SourceAccount": support_stack.account},
                },
            )
        )
        cfn_bucket.lifecycle_configuration = s3.CfnBucket.LifecycleConfigurationProperty(
            rules=[s3.CfnBucket.RuleProperty(status="Enabled", expiration_in_days=EXPIRE_DAYS)]
        )
        checkov.skip(
            bucket,
            "CKV_AWS_21",
            "pipeline artifacts copied to this region for its deploy actions: rebuilt by every run and "
            f"expired after {EXPIRE_DAYS} days, no state lives here",
        )
        aliases[region] = _alias_name(stack, pipeline, region)
        acknowledge(
            pipeline.role.node.find_child("DefaultPolicy"),
            f"AwsSolutions-IAM5[Resource::arn:{partition(region)}:s3:::{stack.resolve(bucket.bucket_name)}/*]",
            "CodePipeline copies the run's artifacts into the replication bucket of the region it deploys "
            "to and reads them there (CDK's bucket grant, objects of that one bucket): it holds nothing "
            "but this pipeline's artifacts.",
        )
    _narrow_key_grant(stack, pipeline, aliases)
    return [s.stack for _, s in sorted(supports.items())]


def _alias_name(stack: cdk.Stack, pipeline: codepipeline.Pipeline, region: str) -> str:
    """The replication key's alias as the pipeline's artifact store for `region` names it."""
    cfn = pipeline.node.default_child
    assert isinstance(cfn, codepipeline.CfnPipeline)
    for store in stack.resolve(cfn.artifact_stores) or []:  # CfnPipeline's camel-case property keys
        if store["region"] == region:
            key_id = store["artifactStore"]["encryptionKey"]["id"]
            assert isinstance(key_id, str) and ":alias/" in key_id, key_id
            return "alias/" + key_id.split(":alias/", 1)[1]
    raise AssertionError(f"no artifact store for {region}")


def _narrow_key_grant(stack: cdk.Stack, pipeline: codepipeline.Pipeline, aliases: dict[str, str]) -> None:
    policy = pipeline.role.node.find_child("DefaultPolicy")
    cfn_policy = policy.node.default_child
    assert isinstance(cfn_policy, iam.CfnPolicy)
    statements = stack.resolve(cfn_policy.policy_document)["Statement"]

    def resources(statement: dict) -> list:
        found = statement["Resource"]
        return found if isinstance(found, list) else [found]

    index = next(
        i for i, st in enumerate(statements) if "kms:Decrypt" in st["Action"] and "*" in resources(st)
    )
    kms = statements[index]
    others = [r for r in resources(kms) if r != "*"]
    narrowed = [
        {
            "Action": kms["Action"],
            "Effect": "Allow",
            "Resource": f"arn:{partition(region)}:kms:{region}:{stack.account}:key/*",
            "Condition": {"ForAnyValue:StringEquals": {"kms:ResourceAliases": alias}},
        }
        for region, alias in sorted(aliases.items())
    ]
    kept = [{**kms, "Resource": others}] if others else []
    cfn_policy.add_property_override(
        "PolicyDocument.Statement", [*statements[:index], *kept, *statements[index + 1 :], *narrowed]
    )
    acknowledge(
        policy,
        "AwsSolutions-IAM5[Resource::*]",
        "CDK grants the pipeline role the replication key of another region with Resource * (a key's "
        "ARN cannot be referenced across regions); the template narrows it (stacks/pipeline/"
        "replication.py) to keys of that region and account carrying the replication key's alias "
        "(kms:ResourceAliases), which cdk-nag, reading the statement before the override, does not see.",
    )
    for region in aliases:
        acknowledge(
            policy,
            f"AwsSolutions-IAM5[Resource::arn:{partition(region)}:kms:{region}:{stack.account}:key/*]",
            "the replication key of that region, named by its alias (kms:ResourceAliases condition)",
        )

"""The one way this app acknowledges a cdk-nag finding, and the finding ids it builds.

cdk-nag 3 reads acknowledgements that `Validations.of(construct).acknowledge(Acknowledgment(...))`
records in the construct's metadata (aws-cdk-lib `Validations.acknowledge`: "Acknowledgments are
recorded to construct metadata so that downstream plugins (e.g. CDK Nag) can read them"); they
cover the construct and its children. Acknowledge on the narrowest construct that has the finding,
with the finding's exact id, so the same finding elsewhere still fails synthesis.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from constructs import IConstruct


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge the finding `rule` (e.g. `AwsSolutions-IAM5[Resource::*]`) on `scope`, with why."""
    Validations.of(scope).acknowledge(Acknowledgment(id=rule, reason=reason))


def managed_policy_finding(name: str, *, service_role: bool = False) -> str:
    """cdk-nag's IAM4 finding id for the AWS managed policy `name` (`service-role/` ones too)."""
    prefix = "service-role/" if service_role else ""
    return f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{prefix}{name}]"

"""Suppressions for checkov, the independent IaC scanner CI runs over every synthesized template
(`make iac-scan`). Each is written into the resource's own CloudFormation metadata with its reason,
where checkov reads it (`Metadata.checkov.skip: [{id, comment}]`, checkov's
cloudformation/context_parser.py `collect_skip_comments`), so a reviewer sees it next to the resource.

Only CDK's own framework functions are suppressed wholesale (`FrameworkFunctionSkips`); anything of
ours gets its skips one by one through `skip`, and a new function of ours fails the scan until it
meets the checks or says why not.
"""

from __future__ import annotations

import jsii
from aws_cdk import CfnResource, IAspect
from constructs import IConstruct

# Checks that CDK's framework functions (custom-resource providers, the kubectl provider, the
# pipeline's approval helper) do not meet, and why that is acceptable for them.
FRAMEWORK_FUNCTION_REASONS = {
    "CKV_AWS_115": "CDK framework function invoked only by CloudFormation during deployments: a "
    "reserved-concurrency limit would only take from the account's pool (and fails in accounts with "
    "the minimum of 10)",
    "CKV_AWS_116": "CDK framework function invoked by CloudFormation, which records every failure in "
    "the stack events and rolls back: a dead-letter queue would hold nothing actionable",
    "CKV_AWS_117": "CDK framework function that only calls AWS APIs (and, for the kubectl provider, the "
    "cluster's endpoint): it runs outside the VPC by CDK's design",
    "CKV_AWS_173": "CDK framework function whose environment holds resource names and settings, no "
    "secrets; Lambda encrypts environment variables at rest with its service key",
}

# Construct paths of CDK's framework functions: the singleton custom-resource providers
# (`Custom::<Name>CustomResourceProvider`), the EKS kubectl provider and CDK Pipelines' approval helper.
FRAMEWORK_PATH_MARKERS = (
    "CustomResourceProvider/",
    "/KubectlProvider/",
    "/PipelinesSecurityCheck/",
)


def skip(resource: IConstruct, check_id: str, reason: str) -> None:
    """Record a checkov suppression, with its reason, in the resource's CloudFormation metadata."""
    cfn = resource if isinstance(resource, CfnResource) else resource.node.default_child
    if not isinstance(cfn, CfnResource):
        raise TypeError(f"{resource.node.path}: no CloudFormation resource to carry a checkov skip")
    metadata = cfn.get_metadata("checkov") or {}
    skips = [s for s in metadata.get("skip", []) if s["id"] != check_id]
    cfn.add_metadata("checkov", {**metadata, "skip": [*skips, {"id": check_id, "comment": reason}]})


@jsii.implements(IAspect)
class FrameworkFunctionSkips:
    """Suppress, with reasons, the Lambda checks that CDK's own framework functions do not meet."""

    def visit(self, node: IConstruct) -> None:
        if not isinstance(node, CfnResource) or node.cfn_resource_type != "AWS::Lambda::Function":
            return
        if any(marker in node.node.path + "/" for marker in FRAMEWORK_PATH_MARKERS):
            for check_id, reason in FRAMEWORK_FUNCTION_REASONS.items():
                skip(node, check_id, reason)

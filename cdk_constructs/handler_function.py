"""The Lambda function behind each custom resource of ours (VpcCleanup, SubmittedJobDrain,
ImageCacheWarmer): its code asset, role, log group and function, set up the same way for all three.
What differs (permissions, VPC placement, layers, memory, timeout) stays in each construct.

Code asset: the handler's own folder (`<name>_handler/`, with `handler.py`) plus the shared
`cfn_response.py` at `cdk_constructs/cfn_response.py`, the path the handler imports it by; nothing
of the other handlers. CDK bundles it locally, without Docker (`BundlingOptions.local`, an
`ILocalBundling` whose `tryBundle` writes the output folder and returns true, so CDK runs no
container: https://docs.aws.amazon.com/cdk/api/v2/docs/aws-cdk-lib.ILocalBundling.html and the
"Asset bundling" section of https://docs.aws.amazon.com/cdk/api/v2/docs/aws-cdk-lib.aws_s3_assets-readme.html).
The asset's hash is that of the output (`AssetHashType.OUTPUT`: "when the source of the asset is a
top level folder containing code and/or dependencies that are not directly linked to the asset",
https://docs.aws.amazon.com/cdk/api/v2/docs/aws-cdk-lib.AssetHashType.html), so a change to the
shared module changes every function's asset, not only a change in its folder. The copy needs
nothing but this process: synthesis stays offline. CDK prints "Bundling asset <path>..." for each.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import jsii
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct, IConstruct

from cdk_constructs import cfn_response, checkov
from cdk_constructs.nag import acknowledge

RUNTIME = lambda_.Runtime.PYTHON_3_14
HANDLER = "handler.on_event"
# Modules of this package the handlers import, bundled at their import path.
SHARED_MODULES = (cfn_response,)
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc")


def write_asset(handler_dir: Path, out: Path) -> None:
    """Write a handler's Lambda asset into `out`: its folder, and the shared modules."""
    shutil.copytree(handler_dir, out, ignore=IGNORED, dirs_exist_ok=True)
    for module in SHARED_MODULES:
        target = out.joinpath(*module.__name__.split(".")).with_suffix(".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(str(module.__file__), target)


@jsii.implements(cdk.ILocalBundling)
class _LocalAsset:
    def __init__(self, handler_dir: Path) -> None:
        self.handler_dir = handler_dir

    def try_bundle(self, output_dir: str, *, image: cdk.DockerImage, **options: Any) -> bool:
        write_asset(self.handler_dir, Path(output_dir))
        return True  # done: CDK starts no container


def handler_code(handler_dir: Path) -> lambda_.Code:
    """The function's code: `handler_dir` and the shared modules, bundled locally."""
    return lambda_.Code.from_asset(
        str(handler_dir),
        asset_hash_type=cdk.AssetHashType.OUTPUT,
        # `image` is required by BundlingOptions but never run: the local bundling always succeeds
        # (or raises), and a container could not reach the shared module outside the folder anyway.
        bundling=cdk.BundlingOptions(image=RUNTIME.bundling_image, local=_LocalAsset(handler_dir)),
    )


def log_group_arn(scope: Construct, function_name: str) -> str:
    """The ARN of the log group Lambda makes for a named function on its first invocation
    (/aws/lambda/<name>): named functions let the role be scoped to it before it exists."""
    return cdk.Stack.of(scope).format_arn(
        service="logs",
        resource="log-group",
        resource_name=f"/aws/lambda/{function_name}",
        arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
    )


def write_logs(log_group: str) -> iam.PolicyStatement:
    """What the function needs to log into its own log group (`log_group_arn`) and nothing else."""
    return iam.PolicyStatement(
        actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
        resources=[log_group, f"{log_group}:log-stream:*"],
    )


def acknowledge_log_streams(policy: IConstruct, log_group: str) -> None:
    """cdk-nag's IAM5 finding on `write_logs`'s stream wildcard, with its reason."""
    acknowledge(
        policy,
        f"AwsSolutions-IAM5[Resource::{cdk.Stack.of(policy).resolve(log_group)}:log-stream:*]",
        "Lambda names its log streams per execution environment; the wildcard covers only the "
        "streams of this function's own log group.",
    )


def handler_role(
    scope: Construct, description: str, *, managed_policies: list[iam.IManagedPolicy] | None = None
) -> iam.Role:
    """The function's role (`<scope>/Role`), assumed by Lambda; each construct adds its statements."""
    return iam.Role(
        scope,
        "Role",
        assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
        description=description,
        managed_policies=managed_policies,
    )


def handler_function(
    scope: Construct,
    handler_dir: Path,
    *,
    role: iam.IRole,
    function_name: str,
    description: str,
    timeout: cdk.Duration,
    memory_size: int,
    checkov_reasons: Mapping[str, str],
    **options: Any,
) -> lambda_.Function:
    """The function (`<scope>/Handler`) running `handler_dir`'s `handler.on_event`, with the
    checkov checks it does not meet skipped for the reasons given. `options` go to
    lambda_.Function as they are (VPC placement, layers, environment)."""
    function = lambda_.Function(
        scope,
        "Handler",
        runtime=RUNTIME,
        handler=HANDLER,
        code=handler_code(handler_dir),
        timeout=timeout,
        memory_size=memory_size,
        role=role,
        function_name=function_name,
        description=description,
        **options,
    )
    for check_id, reason in checkov_reasons.items():
        checkov.skip(function, check_id, reason)
    return function


def handler_resource(
    scope: Construct,
    function: lambda_.IFunction,
    *,
    resource_type: str,
    properties: Mapping[str, Any],
    timeout: cdk.Duration,
) -> cdk.CustomResource:
    """The custom resource (`<scope>/Resource`) that `function` serves; `timeout` is the function's."""
    return cdk.CustomResource(
        scope,
        "Resource",
        service_token=function.function_arn,
        resource_type=resource_type,
        properties=dict(properties),
        # A handler that never answers fails the operation after this, not after an hour.
        service_timeout=timeout.plus(cdk.Duration.minutes(1)),
    )

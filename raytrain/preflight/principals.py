"""The IAM principals of the cluster's access entries exist.

EKS: "An access entry includes the Amazon Resource Name (ARN) of one, and only one, existing IAM
principal" (EKS User Guide, "Create access entries",
https://docs.aws.amazon.com/eks/latest/userguide/creating-access-entries.html); a role's ARN may
include a path. The admins' entries are created by the Cluster stack after the EKS cluster itself:
a missing principal fails that stack late and rolls the cluster back. The submitters' entries are
the Workload stack's. A principal of this account is looked up (`iam:GetRole` / `iam:GetUser` by
name, then its ARN compared, path included); one of another account cannot be seen from here and is
a warning.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import botocore.exceptions as bce

from config.settings import Settings
from raytrain.aws import error_code
from raytrain.preflight.report import Check, ok, problem, warn

NAME = "access entry principals"


def _principals(settings: Settings) -> list[tuple[str, str, str]]:
    """(ARN, settings field, stack that creates its access entry)."""
    cluster = settings.cluster
    prefix = settings.stack_prefix
    return [
        (arn, "cluster.admin_principal_arns", f"{prefix}-Cluster") for arn in cluster.admin_principal_arns
    ] + [
        (arn, "cluster.job_submitter_principals", f"{prefix}-Workload")
        for arn in cluster.job_submitter_principals
    ]


def _lookup(iam: Any, kind: str, name: str) -> str | None:
    """The principal's ARN, or None when this account has no such role/user."""
    try:
        if kind == "role":
            return str(iam.get_role(RoleName=name)["Role"]["Arn"])
        return str(iam.get_user(UserName=name)["User"]["Arn"])
    except bce.ClientError as exc:
        if error_code(exc) == "NoSuchEntity":
            return None
        raise


def access_principals(settings: Settings, iam: Any) -> Iterator[Check]:
    for arn, field, stack in _principals(settings):
        # arn:PARTITION:iam::ACCOUNT:role/PATH/NAME (settings validate the form)
        account, resource = arn.split(":")[4], arn.split(":", 5)[5]
        kind, name = resource.split("/", 1)[0], resource.rsplit("/", 1)[1]
        if account != settings.account:
            yield warn(
                NAME,
                f"{arn} ({field}) is in account {account}: it cannot be looked up from {settings.account}; "
                f"if it does not exist, {stack} fails creating its access entry",
                "check it exists in that account (aws iam get-role / get-user there)",
            )
            continue
        found = _lookup(iam, kind, name)
        fix = f"create it, or set {field} to an existing {kind} of account {settings.account}"
        if found is None:
            yield problem(
                NAME,
                f"{arn} ({field}) does not exist: EKS needs an existing principal per access entry, "
                f"{stack} would fail"
                + (
                    " after the EKS cluster is created (and roll it back)"
                    if stack.endswith("-Cluster")
                    else ""
                ),
                fix,
            )
        elif found != arn:
            yield problem(
                NAME,
                f"{arn} ({field}) does not exist; the {kind} {name} of this account is {found} "
                "(another path)",
                f"set {field} to {found}",
            )
        else:
            yield ok(NAME, f"{arn} exists ({field})")

"""The IAM actions `raytrain preflight` needs, and a recorder of the calls it really makes
(botocore's `before-parameter-build` event, emitted for every operation of a client, stubbed or
not), so a test can prove the list covers every call.

All are read-only (Describe*/Get*). `sts:GetCallerIdentity` is not listed: it needs no permission
("No permissions are required to perform this operation", STS API reference). With --role-arn,
the caller also needs `sts:AssumeRole` on that role.
"""

from __future__ import annotations

from typing import Any

IAM_ACTIONS: tuple[str, ...] = (
    "cloudformation:DescribeStacks",
    "ec2:DescribeAddresses",
    "ec2:DescribeCapacityReservations",
    "ec2:DescribeInstanceTypeOfferings",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeInstances",
    "ec2:DescribeVpcs",
    "ecr:DescribeImages",
    "ecr:DescribePullThroughCacheRules",
    "ecr:DescribeRepositoryCreationTemplates",
    "ecr:GetRegistryPolicy",
    "eks:DescribeAddonVersions",
    "eks:DescribeClusterVersions",
    "iam:GetRole",
    "iam:GetUser",
    "servicequotas:GetAWSDefaultServiceQuota",
    "servicequotas:GetServiceQuota",
    # Only with job.hf_token_secret: the gated model's token, on that secret or parameter.
    "secretsmanager:GetSecretValue",
    "ssm:GetParameter",
)
NO_PERMISSION_NEEDED = frozenset({"sts:GetCallerIdentity"})


class CallRecorder:
    """`iam_prefix:Operation` of every call made through the clients it watches."""

    def __init__(self) -> None:
        self.calls: set[str] = set()

    def watch(self, client: Any) -> Any:
        client.meta.events.register("before-parameter-build", self._record)
        return client

    def _record(self, model: Any, **_: Any) -> None:
        # The signing name is the IAM prefix for these services (servicequotas, not service-quotas).
        self.calls.add(f"{model.service_model.signing_name}:{model.name}")

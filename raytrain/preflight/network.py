"""The Network stack's VPC and its NAT gateways' Elastic IPs fit the region's quotas.

The Network stack creates one VPC and one Elastic IP per NAT gateway (`vpc.nat_gateways`; CDK's
NAT gateway provider allocates an AWS::EC2::EIP for each). Both are per-region quotas with a low
default (Amazon VPC User Guide, "Amazon VPC quotas": VPCs per Region, 5, Service Quotas code
L-F678F1CE of service `vpc`; Amazon EC2 User Guide, "Elastic IP addresses": 5 per Region, code
L-0263D0A3 "EC2-VPC Elastic IPs" of service `ec2`). One short fails the Network stack, and the first
deploy with it. What the account already uses is counted (DescribeVpcs, DescribeAddresses); once the
Network stack is deployed its own VPC and addresses are among them, so nothing more is needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from config.settings import Settings
from raytrain.aws import CapacityApi
from raytrain.preflight.account import _stack
from raytrain.preflight.report import Check, ok, problem

VPC_QUOTA = ("vpc", "L-F678F1CE", "VPCs per Region")
EIP_QUOTA = ("ec2", "L-0263D0A3", "EC2-VPC Elastic IPs")


def _check(
    api: CapacityApi,
    name: str,
    quota: tuple[str, str, str],
    *,
    need: int,
    used: int,
    stack: str,
    deployed: bool,
) -> Check:
    service, code, title = quota
    limit = int(api.quota_value(code, service))
    if deployed:
        return ok(name, f"{title}: {used} of {limit} used, {stack}'s among them")
    if used + need <= limit:
        return ok(name, f"{title}: {used} of {limit} used, {stack} needs {need} more")
    return problem(
        name,
        f"{title}: {used} of {limit} used and {stack} needs {need} more: its create would fail",
        f"aws service-quotas request-service-quota-increase --service-code {service} --quota-code {code} "
        f"--desired-value {used + need} (or release unused ones)",
    )


def network_quotas(settings: Settings, api: CapacityApi, cloudformation: Any) -> Iterator[Check]:
    stack = f"{settings.stack_prefix}-Network"
    deployed = _stack(cloudformation, stack) is not None
    vpcs = api.count("describe_vpcs", "Vpcs")
    yield _check(api, "vpc quota", VPC_QUOTA, need=1, used=vpcs, stack=stack, deployed=deployed)
    addresses = api.count("describe_addresses", "Addresses")
    need = settings.vpc.nat_gateways
    yield _check(
        api, "elastic ip quota", EIP_QUOTA, need=need, used=addresses, stack=stack, deployed=deployed
    )

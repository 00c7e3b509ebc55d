"""AWS access for the operator commands: one small class per concern, clients injected.

Everything that talks to AWS goes through `CapacityApi`, so tests hand it moto clients (EC2) and a
stub (Service Quotas: moto's mock only knows the `vpc` service) instead of patching boto3.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.exceptions as bce
from botocore.config import Config

# Standard retry mode backs off on throttling (Describe* calls are rate limited per account).
CLIENT_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5})

# Error codes that mean "these credentials are not usable", whatever the call.
_CREDENTIAL_CODES = {
    "AuthFailure",
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidClientTokenId",
    "RequestExpired",
    "SignatureDoesNotMatch",
    "UnrecognizedClientException",
}

# Error codes that mean "these credentials may not make this call".
_PERMISSION_CODES = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}

CONFIGURE_HINT = (
    "configure AWS credentials first: `aws configure sso` / `aws sso login --profile NAME` "
    "then pass --profile NAME (or set AWS_PROFILE), or set AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY"
)


class AwsError(Exception):
    """An AWS problem the user must fix (credentials, permissions). `str()` is the message."""


def error_code(exc: bce.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def error_message(exc: bce.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", "")) or str(exc)


def credential_problem(exc: BaseException) -> str | None:
    """The user-facing message when `exc` means the credentials are missing or rejected."""
    if isinstance(exc, bce.NoCredentialsError | bce.PartialCredentialsError):
        return f"no AWS credentials found: {CONFIGURE_HINT}"
    if isinstance(exc, bce.ProfileNotFound):
        return f"{exc}: {CONFIGURE_HINT}"
    if isinstance(exc, bce.TokenRetrievalError | bce.SSOError | bce.UnauthorizedSSOTokenError):
        return f"the AWS SSO session has expired or is invalid ({exc}): run `aws sso login`"
    if isinstance(exc, bce.ClientError) and error_code(exc) in _CREDENTIAL_CODES:
        return f"AWS rejected the credentials ({error_code(exc)}: {error_message(exc)}); {CONFIGURE_HINT}"
    return None


@functools.cache
def permission_problem(exc: BaseException) -> str | None:
    """The user-facing message when `exc` is a missing IAM permission."""
    if isinstance(exc, bce.ClientError) and error_code(exc) in _PERMISSION_CODES:
        operation = getattr(exc, "operation_name", "") or "the call"
        return (
            f"missing permission for {operation} ({error_code(exc)}: {error_message(exc)}); "
            "`raytrain capacity --help` lists the permissions needed"
        )
    return None


def fatal_problem(exc: BaseException) -> str | None:
    """Credentials or permission: no later region or zone would do better, so stop."""
    return credential_problem(exc) or permission_problem(exc)


def known_regions() -> tuple[str, ...]:
    """Regions botocore knows for EC2 (offline: from its bundled endpoint data)."""
    return tuple(boto3.session.Session().get_available_regions("ec2"))


def session(profile: str | None) -> boto3.session.Session:
    try:
        return boto3.session.Session(profile_name=profile)
    except bce.ProfileNotFound as exc:
        raise AwsError(f"{exc}: {CONFIGURE_HINT}") from None


@dataclass(frozen=True)
class Zone:
    name: str  # us-west-2b: differs per account
    zone_id: str  # usw2-az1: the same physical zone in every account (Spot scores use it)


class CapacityApi:
    """The EC2 and Service Quotas calls of the capacity finder, for one region."""

    def __init__(self, region: str, ec2: Any, quotas: Any) -> None:
        self.region = region
        self.ec2 = ec2
        self.quotas = quotas
        self._vcpus: dict[str, int] = {}

    @classmethod
    def connect(cls, sess: boto3.session.Session, region: str) -> CapacityApi:
        return cls(
            region,
            sess.client("ec2", region_name=region, config=CLIENT_CONFIG),
            sess.client("service-quotas", region_name=region, config=CLIENT_CONFIG),
        )

    def zones(self) -> list[Zone]:
        resp = self.ec2.describe_availability_zones(
            Filters=[
                {"Name": "zone-type", "Values": ["availability-zone"]},
                {"Name": "state", "Values": ["available"]},
            ]
        )
        zones = [
            Zone(z["ZoneName"], z["ZoneId"])
            for z in resp["AvailabilityZones"]
            # Local and Wavelength zones cannot hold the VPC's subnets; filter again in case a
            # backend ignores the filter.
            if z.get("ZoneType", "availability-zone") == "availability-zone"
            and z.get("State", "available") == "available"
        ]
        return sorted(zones, key=lambda z: z.name)

    def offered_zones(self, instance_type: str) -> set[str]:
        offered: set[str] = set()
        for page in self._pages(
            self.ec2.describe_instance_type_offerings,
            "InstanceTypeOfferings",
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}],
        ):
            offered.update(o["Location"] for o in page if o["InstanceType"] == instance_type)
        return offered

    def quota_value(self, quota_code: str, service_code: str = "ec2") -> float:
        """The applied quota, or AWS's default when the account has never had it changed."""
        try:
            resp = self.quotas.get_service_quota(ServiceCode=service_code, QuotaCode=quota_code)
        except bce.ClientError as exc:
            if error_code(exc) != "NoSuchResourceException":
                raise
            resp = self.quotas.get_aws_default_service_quota(ServiceCode=service_code, QuotaCode=quota_code)
        return float(resp["Quota"]["Value"])

    def count(self, call: str, key: str, **params: Any) -> int:
        """How many items an EC2 Describe call lists (every page)."""
        return sum(len(page) for page in self._pages(getattr(self.ec2, call), key, **params))

    def on_demand_instance_types(self) -> list[str]:
        """Types of the pending/running On-Demand instances, one entry per instance."""
        types: list[str] = []
        for page in self._pages(
            self.ec2.describe_instances,
            "Reservations",
            Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}],
        ):
            for reservation in page:
                for inst in reservation["Instances"]:
                    # On-Demand instances carry no InstanceLifecycle; Spot ("spot") and Capacity
                    # Block ("capacity-block") instances draw on other quotas.
                    if not inst.get("InstanceLifecycle"):
                        types.append(inst["InstanceType"])
        return types

    def vcpus(self, instance_types: set[str]) -> dict[str, int]:
        """Default vCPUs per type: what the vCPU-based On-Demand quotas count."""
        missing = sorted(instance_types - self._vcpus.keys())
        for start in range(0, len(missing), 100):  # the API takes at most 100 types per call
            resp = self.ec2.describe_instance_types(InstanceTypes=missing[start : start + 100])
            for itype in resp["InstanceTypes"]:
                self._vcpus[itype["InstanceType"]] = int(itype["VCpuInfo"]["DefaultVCpus"])
        return {t: self._vcpus[t] for t in instance_types if t in self._vcpus}

    def spot_scores(self, instance_type: str, count: int) -> dict[str, int]:
        """Spot placement score (1-10) per zone id for `count` instances in one zone."""
        scores: dict[str, int] = {}
        for page in self._pages(
            self.ec2.get_spot_placement_scores,
            "SpotPlacementScores",
            InstanceTypes=[instance_type],
            TargetCapacity=count,
            TargetCapacityUnitType="units",
            SingleAvailabilityZone=True,
            RegionNames=[self.region],
        ):
            for item in page:
                if item.get("AvailabilityZoneId"):
                    scores[item["AvailabilityZoneId"]] = int(item["Score"])
        return scores

    def create_probe_reservation(
        self, instance_type: str, zone: str, count: int, token: str, tag: tuple[str, str]
    ) -> str:
        resp = self.ec2.create_capacity_reservation(
            InstanceType=instance_type,
            InstancePlatform="Linux/UNIX",
            AvailabilityZone=zone,
            InstanceCount=count,
            # Targeted: nothing else can launch into it during its second of life.
            InstanceMatchCriteria="targeted",
            EndDateType="unlimited",
            # Idempotency: a retried call after a timeout returns the same reservation.
            ClientToken=token,
            TagSpecifications=[
                {
                    "ResourceType": "capacity-reservation",
                    "Tags": [{"Key": tag[0], "Value": tag[1]}],
                }
            ],
        )
        return str(resp["CapacityReservation"]["CapacityReservationId"])

    def find_reservations(self, tag: tuple[str, str]) -> list[str]:
        """Ids of live reservations carrying `tag` (finds a probe whose id never reached us)."""
        ids: list[str] = []
        for page in self._pages(
            self.ec2.describe_capacity_reservations,
            "CapacityReservations",
            Filters=[
                {"Name": f"tag:{tag[0]}", "Values": [tag[1]]},
                {"Name": "state", "Values": ["active", "pending"]},
            ],
        ):
            ids.extend(r["CapacityReservationId"] for r in page)
        return ids

    def cancel_reservation(self, reservation_id: str) -> None:
        self.ec2.cancel_capacity_reservation(CapacityReservationId=reservation_id)

    def reservation(self, reservation_id: str) -> dict[str, Any] | None:
        """A capacity reservation of this region, or None when the region has no such id."""
        try:
            resp = self.ec2.describe_capacity_reservations(CapacityReservationIds=[reservation_id])
        except bce.ClientError as exc:
            if error_code(exc).startswith("InvalidCapacityReservationId"):
                return None
            raise
        found = resp.get("CapacityReservations", [])
        return dict(found[0]) if found else None

    @staticmethod
    def _pages(call: Any, key: str, **params: Any) -> Iterator[list[Any]]:
        """Follow NextToken by hand: works the same for real, moto and stub clients."""
        while True:
            resp = call(**params)
            yield resp.get(key, [])
            token = resp.get("NextToken")
            if not token:
                return
            params["NextToken"] = token

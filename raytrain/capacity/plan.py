"""Per region and zone: offered, quota room, Spot placement score, probe; ranked into a plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import botocore.exceptions as bce

from config.catalogue import Instance
from config.settings import Settings
from raytrain.aws import (
    AwsError,
    CapacityApi,
    Zone,
    credential_problem,
    error_code,
    error_message,
    fatal_problem,
)
from raytrain.capacity.probe import Prober, ProbeResult
from raytrain.capacity.quotas import QuotaClass, quota_class


@dataclass(frozen=True)
class Need:
    instance: Instance
    count: int  # nodes wanted at once (probe size, quota check)
    min_count: int

    @property
    def vcpus(self) -> int:
        return self.count * self.instance.vcpus

    @property
    def min_vcpus(self) -> int:
        return self.min_count * self.instance.vcpus


@dataclass(frozen=True)
class RegionQuota:
    quota: QuotaClass
    limit: float
    used: int

    @property
    def free(self) -> int:
        return max(int(self.limit) - self.used, 0)

    def increase_command(self, region: str, need_vcpus: int) -> str:
        return (
            f"aws service-quotas request-service-quota-increase --region {region} "
            f"--service-code ec2 --quota-code {self.quota.code} "
            f"--desired-value {self.used + need_vcpus}"
        )


@dataclass
class ZoneResult:
    region: str
    zone: str
    zone_id: str
    offered: bool = False
    quota: RegionQuota | None = None
    score: int | None = None
    probe: ProbeResult | None = None
    fits: bool = False
    reason: str = ""
    current: bool = False  # the environment's GPU zone today
    current_region: bool = False
    # Order of non-fitting zones: what is easiest to fix comes first.
    blocker: int = 0


@dataclass
class Plan:
    zones: list[ZoneResult]
    region_zones: dict[str, list[Zone]]
    quota_requests: dict[str, str]  # region -> command
    notes: list[str]

    @property
    def best(self) -> ZoneResult | None:
        return self.zones[0] if self.zones and self.zones[0].fits else None


_BLOCK_QUOTA, _BLOCK_CAPACITY, _BLOCK_RESERVATION, _BLOCK_NOT_OFFERED, _BLOCK_ERROR = range(1, 6)


def evaluate(
    apis: dict[str, CapacityApi],
    need: Need,
    settings: Settings,
    *,
    probe: bool,
    prober: Prober,
    reservation_id: str | None,
) -> Plan:
    results: list[ZoneResult] = []
    region_zones: dict[str, list[Zone]] = {}
    requests: dict[str, str] = {}
    notes: list[str] = []
    itype = need.instance.name
    qclass = quota_class(itype)
    assert qclass is not None, itype  # checked by the command before any AWS call
    reservation: dict[str, Any] | None = None
    reservation_region: str | None = None
    if reservation_id:
        for region, api in apis.items():
            try:
                reservation = api.reservation(reservation_id)
            except bce.ClientError as exc:
                if fatal_problem(exc):
                    raise
                continue  # e.g. a region not enabled: it shows up as such in the plan
            if reservation is not None:
                reservation_region = region
                break
        if reservation is None:
            raise AwsError(
                f"capacity reservation {reservation_id} was not found in "
                f"{', '.join(apis)} (check the id and --regions)"
            )
    for region, api in apis.items():
        try:
            zones = api.zones()
            offered = api.offered_zones(itype)
            quota = region_quota(api, qclass)
        except bce.ClientError as exc:
            if fatal_problem(exc):
                raise
            results.append(
                ZoneResult(
                    region,
                    "-",
                    "-",
                    reason=f"region unusable: {error_code(exc)}: {error_message(exc)}",
                    blocker=_BLOCK_ERROR,
                )
            )
            continue
        region_zones[region] = zones
        scores, score_note = _scores(api, itype, need.count)
        if score_note:
            notes.append(f"{region}: Spot placement scores unavailable ({score_note})")
        # A quota increase only helps where the type is offered at all.
        if quota.free < need.vcpus and offered:
            requests[region] = quota.increase_command(region, need.vcpus)
        for zone in zones:
            result = ZoneResult(
                region,
                zone.name,
                zone.zone_id,
                offered=zone.name in offered,
                quota=quota,
                score=scores.get(zone.zone_id),
                current=zone.name == settings.gpu_nodes.availability_zone,
                current_region=region == settings.region,
            )
            _judge(
                result,
                need,
                api,
                prober=prober,
                probe=probe,
                reservation=reservation,
                reservation_region=reservation_region,
            )
            results.append(result)
    results.sort(key=_rank)
    return Plan(results, region_zones, requests, notes)


def region_quota(api: CapacityApi, qclass: QuotaClass) -> RegionQuota:
    running = api.on_demand_instance_types()
    same_class = {t for t in running if quota_class(t) == qclass}
    vcpus = api.vcpus(same_class)
    used = sum(vcpus.get(t, 0) for t in running if t in same_class)
    return RegionQuota(qclass, api.quota_value(qclass.code), used)


def _scores(api: CapacityApi, itype: str, count: int) -> tuple[dict[str, int], str]:
    # A signal only: missing permission or the API's daily limit must not stop the plan.
    try:
        return api.spot_scores(itype, count), ""
    except bce.ClientError as exc:
        if credential_problem(exc):
            raise
        return {}, error_code(exc)


def _judge(
    r: ZoneResult,
    need: Need,
    api: CapacityApi,
    *,
    prober: Prober,
    probe: bool,
    reservation: dict[str, Any] | None,
    reservation_region: str | None,
) -> None:
    itype = need.instance.name
    quota = r.quota
    assert quota is not None
    quota_text = f"{quota.free} of {int(quota.limit)} vCPUs free ({quota.quota.code})"
    if not r.offered:
        r.reason, r.blocker = f"{itype} is not offered in this zone", _BLOCK_NOT_OFFERED
        return
    if reservation is not None:
        res_zone = reservation.get("AvailabilityZone")
        if r.region != reservation_region or r.zone != res_zone:
            r.reason = f"capacity reservation {reservation['CapacityReservationId']} is in {res_zone}"
            r.blocker = _BLOCK_RESERVATION
            return
        problem = reservation_problem(reservation, need)
        if problem:
            r.reason, r.blocker = problem, _BLOCK_RESERVATION
            return
    if quota.free < need.vcpus:
        short = f"quota short: {quota_text}, {need.vcpus} needed for {need.count} nodes"
        if 0 < need.min_count < need.count and quota.free >= need.min_vcpus:
            short += f" (min_size {need.min_count} fits)"
        r.reason, r.blocker = short + "; request the increase below", _BLOCK_QUOTA
        return
    if reservation is not None:
        r.fits = True
        r.reason = (
            f"reservation {reservation['CapacityReservationId']}: "
            f"{reservation.get('AvailableInstanceCount', '?')} of "
            f"{reservation.get('TotalInstanceCount', '?')} available; {quota_text}"
        )
        return
    if probe:
        r.probe = prober.probe(api, itype, r.zone, need.count)
        if not r.probe.ok:
            r.reason = f"probe: {r.probe.detail}"
            r.blocker = _BLOCK_QUOTA if r.probe.kind == "quota" else _BLOCK_CAPACITY
            return
    r.fits = True
    r.reason = f"offered; {quota_text}, {need.vcpus} needed"
    if r.probe:
        r.reason += f"; probe {r.probe.detail}"
    elif not probe:
        r.reason += "; capacity not probed (--probe)"


def reservation_problem(reservation: dict[str, Any], need: Need) -> str | None:
    rid = reservation["CapacityReservationId"]
    if reservation.get("InstanceType") != need.instance.name:
        return f"reservation {rid} is for {reservation.get('InstanceType')}, not {need.instance.name}"
    if reservation.get("State") not in ("active", "scheduled"):
        return f"reservation {rid} is {reservation.get('State')}"
    if int(reservation.get("TotalInstanceCount", 0)) < need.count:
        return (
            f"reservation {rid} holds {reservation.get('TotalInstanceCount')} instances, {need.count} needed"
        )
    if reservation.get("InstanceMatchCriteria") != "targeted":
        return None  # open reservations work too; targeted is what the node group names
    return None


def _rank(r: ZoneResult) -> tuple[Any, ...]:
    # Fitting zones first; a probe-confirmed zone beats an unprobed one; then staying where the
    # environment is (a new region means a new VPC, a new zone a replaced node group) beats a
    # better Spot score, which is only a signal for On-Demand capacity.
    return (
        not r.fits,
        r.blocker,
        not (r.probe is not None and r.probe.ok),
        not r.current_region,
        not r.current,
        -(r.score or 0),
        r.region,
        r.zone,
    )

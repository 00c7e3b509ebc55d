"""The GPU type is offered in the pinned zone, and the account's vCPU quota covers the GPU group at
`gpu_nodes.max_size` (the Cluster Autoscaler may start that many). The EC2 and Service Quotas calls
are `raytrain capacity`'s (raytrain/aws.py, raytrain/capacity/)."""

from __future__ import annotations

from collections.abc import Iterator

from config.settings import CapacityType, Settings
from raytrain.aws import CapacityApi
from raytrain.capacity.plan import Need, region_quota, reservation_problem
from raytrain.capacity.quotas import STANDARD, P, QuotaClass, quota_class
from raytrain.preflight.report import Check, ok, problem, warn

# Spot vCPU quotas (Service Quotas, service code "ec2"): "All G and VT Spot Instance Requests",
# "All P Spot Instance Requests", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"
# (EC2 User Guide, "Amazon EC2 service quotas", Spot Instance quotas;
# https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html).
SPOT_QUOTAS: dict[str, QuotaClass] = {
    "L-DB2E81BA": QuotaClass("L-3819A6DF", "All G and VT Spot Instance Requests"),
    P.code: QuotaClass("L-7212CCBC", "All P Spot Instance Requests"),
    STANDARD.code: QuotaClass(
        "L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"
    ),
}


def capacity_checks(settings: Settings, api: CapacityApi) -> Iterator[Check]:
    gpu = settings.gpu_nodes
    yield _offering(settings, api)
    need = Need(gpu.instance, gpu.max_size, gpu.min_size)
    if gpu.capacity_type is CapacityType.CAPACITY_BLOCK or gpu.capacity_reservation_id:
        # Reserved capacity: the reservation, not the On-Demand quota, decides (a Capacity Block's
        # instances do not count against On-Demand quotas; the EC2 User Guide's Capacity Blocks page).
        yield from _reservation(settings, api, need)
    elif gpu.capacity_type is CapacityType.SPOT:
        yield from _spot_quota(settings, api, need)
    else:
        yield from _on_demand_quota(settings, api, need)


def _offering(settings: Settings, api: CapacityApi) -> Check:
    """Every listed type offered in the pinned zone; of a Spot group of several, one not offered is a
    warning (the group launches the others, from fewer Spot pools), none offered a problem."""
    gpu = settings.gpu_nodes
    zone, types = gpu.availability_zone, gpu.types
    offered = [t for t in types if zone in api.offered_zones(t)]
    missing = [t for t in types if t not in offered]
    if not missing:
        return ok(
            "gpu offering", f"{' and '.join(types)} {'is' if len(types) == 1 else 'are'} offered in {zone}"
        )
    fix = f"`raytrain capacity --env {settings.name} --write` pins a zone that offers {types[0]}"
    if not offered:
        return problem(
            "gpu offering",
            f"{' nor '.join(types)} {'is' if len(types) == 1 else 'are'} not offered in {zone}",
            fix,
        )
    return warn(
        "gpu offering",
        f"{', '.join(missing)} not offered in {zone}: the group launches only {', '.join(offered)}, from "
        "fewer Spot capacity pools",
        f"drop {', '.join(missing)} from gpu_nodes.instance_types, or {fix.replace(types[0], 'all of them')}",
    )


def _reservation(settings: Settings, api: CapacityApi, need: Need) -> Iterator[Check]:
    gpu = settings.gpu_nodes
    name, rid, zone = "gpu capacity reservation", gpu.capacity_reservation_id, gpu.availability_zone
    assert rid is not None  # settings: CAPACITY_BLOCK requires it
    reservation = api.reservation(rid)
    if reservation is None:
        yield problem(
            name,
            f"{rid} does not exist in {settings.region}",
            "set gpu_nodes.capacity_reservation_id to a reservation of this region",
        )
        return
    why = reservation_problem(reservation, need)
    if why is None and reservation.get("AvailabilityZone") not in (None, zone):
        why = f"it is in {reservation.get('AvailabilityZone')}, not gpu_nodes.availability_zone {zone}"
    if why:
        yield problem(
            name, why, "reserve what gpu_nodes asks for, or change gpu_nodes to match the reservation"
        )
    else:
        yield ok(name, f"{rid} holds {need.count} x {gpu.instance_type} in {zone}")


def _spot_quota(settings: Settings, api: CapacityApi, need: Need) -> Iterator[Check]:
    """The Spot vCPU quota of every listed type's class: the group may launch max_size nodes of any of
    them (all have the same vCPUs, config/gpu_group.py)."""
    name = "gpu spot vcpu quota"
    classes: dict[str, list[str]] = {}
    for itype in settings.gpu_nodes.types:
        qclass = quota_class(itype)
        if qclass is None:
            yield warn(name, f"no vCPU quota code is known for {itype}", "check it in the console")
            continue
        classes.setdefault(qclass.code, []).append(itype)
    for code, types in classes.items():
        spot = SPOT_QUOTAS[code]
        limit = api.quota_value(spot.code)
        if limit >= need.vcpus:
            yield ok(
                name, f"{spot.name}: {limit:g} vCPUs covers max_size {need.count} x {need.instance.vcpus}"
            )
        else:
            yield problem(
                name,
                f"{spot.name} is {limit:g} vCPUs; max_size {need.count} x {' or '.join(types)} needs "
                f"{need.vcpus}",
                f"aws service-quotas request-service-quota-increase --region {settings.region} "
                f"--service-code ec2 --quota-code {spot.code} --desired-value {need.vcpus}",
            )


def _on_demand_quota(settings: Settings, api: CapacityApi, need: Need) -> Iterator[Check]:
    itype = settings.gpu_nodes.instance_type
    name = "gpu vcpu quota"
    qclass = quota_class(itype)
    if qclass is None:
        yield warn(name, f"no vCPU quota code is known for {itype}", "check it in the console")
        return
    quota = region_quota(api, qclass)
    fix = quota.increase_command(settings.region, need.vcpus)
    if quota.limit < need.vcpus:
        yield problem(
            name,
            f"{qclass.name} is {quota.limit:g} vCPUs; max_size {need.count} x {itype} needs {need.vcpus}",
            fix,
        )
    elif quota.free < need.vcpus:
        yield warn(
            name,
            f"{qclass.name} is {quota.limit:g} vCPUs but {quota.used} are in use: {quota.free} free, "
            f"max_size {need.count} x {itype} needs {need.vcpus}",
            fix,
        )
    else:
        yield ok(
            name, f"{qclass.name}: {quota.free} of {quota.limit:g} vCPUs free, max_size needs {need.vcpus}"
        )

"""`raytrain capacity`: where can the GPU node group launch, and pin the answer into settings.

For each candidate region and zone: is the instance type offered there, does the regional
On-Demand vCPU quota minus current usage leave room for the node group, what is the Spot
placement score (a signal only), and with --probe a definitive answer from a targeted Capacity
Reservation for the wanted count that is cancelled at once. The answer becomes a reviewed setting
(--write) rather than something synthesis computes: a computed AZ would replace the node group on
the next deploy.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from types import FrameType
from typing import Any

import botocore.exceptions as bce
from rich.console import Console
from rich.table import Table
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from config.catalogue import CATALOGUE, Instance
from config.loader import (
    ENVIRONMENTS_DIR,
    SettingsError,
    environment_file,
    load_settings,
    parse_settings,
)
from config.settings import CAPACITY_RESERVATION_RE, Settings
from raytrain.aws import (
    AwsError,
    CapacityApi,
    Zone,
    credential_problem,
    error_code,
    error_message,
    fatal_problem,
    known_regions,
    session,
)

EXIT_FITS = 0
EXIT_NO_FIT = 1
EXIT_USAGE = 2
EXIT_AWS = 3
EXIT_LEAKED = 4
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143

EXIT_CODES_HELP = f"""\
exit codes:
  {EXIT_FITS}    a zone fits (and, with --write, the settings file was updated or already matched)
  {EXIT_NO_FIT}    no zone fits: see the reasons and any quota-increase command printed
  {EXIT_USAGE}    bad arguments or settings (unknown env/region/instance type, invalid result)
  {EXIT_AWS}    AWS access problem (no or rejected credentials, missing permission)
  {EXIT_LEAKED}    a probe reservation could not be cancelled: cancel it with the printed command
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C); probe reservations were cancelled
  {EXIT_TERMINATED}  terminated (SIGTERM); probe reservations were cancelled

A probe reservation is cancelled on every exit path. Ctrl-C or SIGTERM while a create or cancel
call is in flight takes effect when that call returns, so that no reservation is left behind.

IAM permissions: ec2:DescribeAvailabilityZones, ec2:DescribeInstanceTypeOfferings,
ec2:DescribeInstanceTypes, ec2:DescribeInstances, ec2:GetSpotPlacementScores,
servicequotas:GetServiceQuota, servicequotas:GetAWSDefaultServiceQuota; with --probe also
ec2:CreateCapacityReservation, ec2:CancelCapacityReservation, ec2:DescribeCapacityReservations,
ec2:CreateTags; with a capacity reservation id, ec2:DescribeCapacityReservations.
"""


# --- quota classes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class QuotaClass:
    code: str
    name: str


# Running On-Demand vCPU quotas (Service Quotas, service code "ec2"), as listed in the EC2 docs,
# "Amazon EC2 service quotas" > "On-Demand Instance quotas"
# (https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html) and in the
# Service Quotas console under Amazon EC2.
G_VT = QuotaClass("L-DB2E81BA", "Running On-Demand G and VT instances")
P = QuotaClass("L-417A185B", "Running On-Demand P instances")
STANDARD = QuotaClass("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances")

# Keyed by the letters before the generation digit. Longer prefixes such as dl, inf, trn, hpc and
# mac (own quotas) must not fall into d, i, t, h or m; im/is (im4gn, is4gen) are I types.
_FAMILY_QUOTA: dict[str, QuotaClass] = {
    "g": G_VT,
    "gr": G_VT,
    "vt": G_VT,
    "p": P,
    **{letters: STANDARD for letters in ("a", "c", "d", "h", "i", "im", "is", "m", "r", "t", "z")},
}
_FAMILY_LETTERS = re.compile(r"^[a-z]+")


def quota_class(instance_type: str) -> QuotaClass | None:
    """The On-Demand vCPU quota an instance type draws on; None for classes not handled here."""
    match = _FAMILY_LETTERS.match(instance_type)
    return _FAMILY_QUOTA.get(match.group(0)) if match else None


# --- probing -----------------------------------------------------------------------------------

PROBE_TAG_KEY = "raytrain:capacity-probe"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so the same finally blocks cancel probe reservations."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


@contextlib.contextmanager
def _terminate_as_exception() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back while a reservation id is in flight.

    A signal that lands between the create call returning and the id being stored would otherwise
    unwind past the only reference to a live reservation. Blocked signals stay pending and are
    raised as soon as the block ends, i.e. once the id is stored (or the cancel is done).
    """
    if not hasattr(signal, "pthread_sigmask") or (threading.current_thread() is not threading.main_thread()):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    kind: str  # "reserved", "capacity", "quota", "unsupported", "error"
    detail: str


_CAPACITY_CODES = {"InsufficientInstanceCapacity", "InsufficientCapacity"}
_QUOTA_CODES = {"InstanceLimitExceeded", "ReservationCapacityExceeded", "VcpuLimitExceeded"}


def classify_probe_error(exc: bce.ClientError) -> ProbeResult:
    code, message = error_code(exc), error_message(exc)
    if code in _CAPACITY_CODES:
        return ProbeResult(False, "capacity", f"no capacity now ({code})")
    if code in _QUOTA_CODES:
        return ProbeResult(False, "quota", f"quota ({code}): {message}")
    if code == "Unsupported":
        return ProbeResult(False, "unsupported", f"type not supported here ({message})")
    return ProbeResult(False, "error", f"{code}: {message}")


@dataclass
class Prober:
    """Creates and cancels probe reservations; remembers any it could not cancel."""

    leaked: list[tuple[str, str]] = field(default_factory=list)  # (region, reservation id)
    warn: Callable[[str], None] = lambda text: print(text, file=sys.stderr)

    def probe(self, api: CapacityApi, instance_type: str, zone: str, count: int) -> ProbeResult:
        token = uuid.uuid4().hex
        tag = (PROBE_TAG_KEY, token)
        reservation_id: str | None = None
        # True while a reservation may exist whose id we do not hold (interrupted or timed-out
        # create): then the cancel step looks it up by its unique tag.
        unknown = False
        try:
            unknown = True
            with _signals_deferred():
                reservation_id = api.create_probe_reservation(instance_type, zone, count, token, tag)
                unknown = False
            return ProbeResult(True, "reserved", f"reserved {count} and cancelled")
        except bce.ClientError as exc:
            unknown = False  # AWS answered with an error: nothing was created
            if fatal_problem(exc):
                raise
            return classify_probe_error(exc)
        finally:
            if reservation_id is not None or unknown:
                self._release(api, reservation_id, tag)

    def _release(self, api: CapacityApi, reservation_id: str | None, tag: tuple[str, str]) -> None:
        # Deferred again: a second Ctrl-C must not cut the cancel call short.
        with _signals_deferred():
            try:
                ids = [reservation_id] if reservation_id else api.find_reservations(tag)
            except (bce.ClientError, bce.BotoCoreError) as exc:
                self.warn(
                    f"could not look up the probe reservation tagged {tag[0]}={tag[1]} in "
                    f"{api.region}: {exc}; check `aws ec2 describe-capacity-reservations "
                    f"--region {api.region} --filters Name=tag:{tag[0]},Values={tag[1]}`"
                )
                self.leaked.append((api.region, f"tag {tag[0]}={tag[1]}"))
                return
            for rid in ids:
                for attempt in range(3):
                    try:
                        api.cancel_reservation(rid)
                        break
                    except (bce.ClientError, bce.BotoCoreError) as exc:
                        if attempt == 2:
                            self.warn(
                                f"could not cancel probe reservation {rid} in {api.region}: "
                                f"{exc}\n  cancel it now: {cancel_command(api.region, rid)}"
                            )
                            self.leaked.append((api.region, rid))


def cancel_command(region: str, reservation_id: str) -> str:
    return f"aws ec2 cancel-capacity-reservation --region {region} --capacity-reservation-id {reservation_id}"


# --- evaluation --------------------------------------------------------------------------------


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
    assert qclass is not None, itype  # checked by _run before any AWS call
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
            quota = _region_quota(api, qclass)
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


def _region_quota(api: CapacityApi, qclass: QuotaClass) -> RegionQuota:
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
        problem = _reservation_problem(reservation, need)
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


def _reservation_problem(reservation: dict[str, Any], need: Need) -> str | None:
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


# --- output ------------------------------------------------------------------------------------


def render(plan: Plan, need: Need, console: Console) -> None:
    table = Table(
        title=f"Capacity for {need.count} x {need.instance.name} "
        f"({need.vcpus} vCPUs; min_size {need.min_count} = {need.min_vcpus})",
        title_justify="left",
    )
    for column in ("#", "region", "zone", "zone id", "offered", "quota free", "spot", "probe"):
        table.add_column(column, no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("reason")
    for i, r in enumerate(plan.zones, 1):
        table.add_row(
            str(i),
            r.region,
            r.zone + (" *" if r.current else ""),
            r.zone_id,
            "-" if r.zone == "-" else ("yes" if r.offered else "no"),
            f"{r.quota.free}/{int(r.quota.limit)}" if r.quota else "-",
            str(r.score) if r.score is not None else "-",
            (r.probe.kind if r.probe else "-"),
            "[green]fits[/green]" if r.fits else "[red]no[/red]",
            r.reason,
        )
    console.print(table)
    console.print("* = the environment's GPU zone today")
    for note in plan.notes:
        console.print(f"note: {note}")
    if plan.quota_requests:
        console.print("\nQuota short; request the increase (vCPUs = in use + needed):")
        for command in plan.quota_requests.values():
            console.print(f"  {command}", soft_wrap=True)
    best = plan.best
    if best:
        console.print(f"\nBest: {best.region} / {best.zone} ({best.zone_id}): {best.reason}")
    else:
        console.print("\nNo zone fits.")


# --- writing the settings file -----------------------------------------------------------------


def _yaml() -> YAML:
    yaml = YAML()  # round-trip: keeps comments, key order, quoting and flow style
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096  # never re-wrap long lines
    return yaml


def vpc_zones(current: list[str], gpu_zone: str, region_zones: list[str]) -> list[str]:
    """The VPC's zones after pinning `gpu_zone`.

    - It is already one of them: unchanged.
    - Same region: it is appended (no zone the VPC has is taken away from other workloads).
    - New region: as many zones as before, the GPU zone plus the region's first others in name
      order, sorted.
    """
    if gpu_zone in current:
        return list(current)
    region = gpu_zone[:-1]
    if current and all(az[:-1] == region for az in current):
        return [*current, gpu_zone]
    others = [z for z in sorted(region_zones) if z != gpu_zone]
    return sorted([gpu_zone, *others[: max(len(current), 2) - 1]])


def updated_text(
    text: str,
    *,
    region: str,
    gpu_zone: str,
    region_zones: list[str],
    reservation_id: str | None,
) -> tuple[str, list[str]]:
    """The settings file with the new placement, and a line per change."""
    yaml = _yaml()
    data = yaml.load(text)
    changes: list[str] = []

    def put(mapping: CommentedMap, key: str, value: Any, label: str, after: str | None = None) -> None:
        if key in mapping and mapping[key] == value:
            return
        old = mapping.get(key, "(unset)")
        if key in mapping or after is None or after not in mapping:
            mapping[key] = value
        else:
            mapping.insert(list(mapping).index(after) + 1, key, value)
        changes.append(f"{label}: {old} -> {value}")

    put(data, "region", region, "region")
    vpc = data["vpc"]
    new_azs = vpc_zones(list(vpc["availability_zones"]), gpu_zone, region_zones)
    if list(vpc["availability_zones"]) != new_azs:
        changes.append(f"vpc.availability_zones: {list(vpc['availability_zones'])} -> {new_azs}")
        seq = vpc["availability_zones"]
        if isinstance(seq, CommentedSeq):
            # In place, so the list keeps its flow/block style and comments.
            del seq[:]
            seq.extend(new_azs)
        else:
            vpc["availability_zones"] = new_azs
    gpu = data["gpu_nodes"]
    put(gpu, "availability_zone", gpu_zone, "gpu_nodes.availability_zone")
    if reservation_id:
        put(
            gpu,
            "capacity_reservation_id",
            reservation_id,
            "gpu_nodes.capacity_reservation_id",
            after="capacity_type",
        )
        # A reservation made outside a cluster placement group causes capacity errors.
        put(
            gpu,
            "placement_group",
            False,
            "gpu_nodes.placement_group",
            after="capacity_reservation_id",
        )
    out = StringIO()
    yaml.dump(data, out)
    return out.getvalue(), changes


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` in one step: readers see the old file or the new one, never a part."""
    mode = path.stat().st_mode & 0o777
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# --- command -----------------------------------------------------------------------------------


ApiFactory = Callable[[str], CapacityApi]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "capacity",
        help="find where the GPU node group can launch; --write pins it into the settings",
        description=__doc__,
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--env", required=True, help="environment name (config/environments/NAME.yaml)")
    parser.add_argument(
        "--regions",
        help="comma-separated candidate regions (default: the environment's region)",
    )
    parser.add_argument("--instance-type", help="GPU instance type (default: gpu_nodes.instance_type)")
    parser.add_argument(
        "--count",
        type=int,
        help="nodes wanted in one zone (default: gpu_nodes.desired_size, or max_size when 0)",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="create a targeted capacity reservation for --count nodes in each candidate zone and "
        "cancel it at once (billed for seconds at the On-Demand rate)",
    )
    parser.add_argument(
        "--write",
        action="store_true",
        help="write the best region and zone (and --capacity-reservation-id) into the env file",
    )
    parser.add_argument(
        "--capacity-reservation-id",
        help="targeted capacity reservation (cr-...) for the GPU nodes; its zone is the only "
        "candidate, and --write sets it with placement_group false",
    )
    parser.add_argument("--profile", help="AWS profile (default: the usual credential chain)")
    parser.add_argument(
        "--config-dir",
        type=Path,
        default=ENVIRONMENTS_DIR,
        help="directory of the environment files (default: config/environments)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, api_factory: ApiFactory | None = None) -> int:
    console = Console(soft_wrap=False)
    err = Console(stderr=True, soft_wrap=True)  # messages wrap in the terminal, not mid-path
    try:
        return _run(args, console, err, api_factory)
    except SettingsError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        return EXIT_USAGE
    except _UsageError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        return EXIT_USAGE
    except AwsError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False)
        return EXIT_AWS
    except (bce.ClientError, bce.BotoCoreError) as exc:
        message = fatal_problem(exc)
        if message is None:
            if isinstance(exc, bce.ClientError):
                message = f"AWS call failed: {error_code(exc)}: {error_message(exc)}"
            else:
                message = f"AWS call failed: {exc}"
        err.print(f"error: {message}", markup=False, highlight=False)
        return EXIT_AWS
    except Terminated:
        err.print("terminated; probe reservations were cancelled", highlight=False)
        return EXIT_TERMINATED


class _UsageError(Exception):
    pass


def _run(args: argparse.Namespace, console: Console, err: Console, api_factory: ApiFactory | None) -> int:
    settings = load_settings(args.env, args.config_dir)
    itype = args.instance_type or settings.gpu_nodes.instance_type
    if itype not in CATALOGUE:
        raise _UsageError(
            f"{itype!r} is not in the instance catalogue (config/catalogue.py); "
            f"known types: {', '.join(sorted(CATALOGUE))}"
        )
    if quota_class(itype) is None:
        raise _UsageError(f"no On-Demand vCPU quota code is known for {itype} (G, VT, P and standard only)")
    if args.write and itype != settings.gpu_nodes.instance_type:
        raise _UsageError(
            f"--write pins a zone for gpu_nodes.instance_type "
            f"({settings.gpu_nodes.instance_type}); to move to {itype}, change "
            "gpu_nodes.instance_type in the file first"
        )
    gpu = settings.gpu_nodes
    count = args.count if args.count is not None else (gpu.desired_size or gpu.max_size)
    if count < 1:
        raise _UsageError(f"--count must be at least 1 (got {count})")
    reservation_id = args.capacity_reservation_id or gpu.capacity_reservation_id
    if reservation_id and not CAPACITY_RESERVATION_RE.match(reservation_id):
        raise _UsageError(f"{reservation_id!r} is not a capacity reservation id like cr-0123456789abcdef0")
    regions = _regions(args.regions, settings.region)
    need = Need(CATALOGUE[itype], count, min(gpu.min_size, count))

    if api_factory is None:
        sess = session(args.profile)
        _check_account(sess, settings, args.write, err)

        def api_factory(region: str) -> CapacityApi:
            return CapacityApi.connect(sess, region)

    apis = {region: api_factory(region) for region in regions}
    prober = Prober(warn=lambda text: err.print(text, markup=False, highlight=False))
    with _terminate_as_exception():
        plan = evaluate(apis, need, settings, probe=args.probe, prober=prober, reservation_id=reservation_id)
    render(plan, need, console)
    if prober.leaked:
        return EXIT_LEAKED
    best = plan.best
    if best is None:
        return EXIT_NO_FIT
    if args.write:
        _write(
            args,
            settings,
            best=best,
            plan=plan,
            reservation_id=args.capacity_reservation_id,
            console=console,
        )
    else:
        console.print("Nothing written (use --write to pin it into the settings).")
    return EXIT_FITS


def _regions(option: str | None, default: str) -> list[str]:
    regions = [r.strip() for r in option.split(",") if r.strip()] if option else [default]
    known = set(known_regions())
    unknown = [r for r in regions if r not in known]
    if unknown:
        raise _UsageError(
            f"unknown region{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
    return list(dict.fromkeys(regions))


def _check_account(sess: Any, settings: Settings, write: bool, err: Console) -> None:
    # Quotas and usage are per account: an answer for another account must not become settings.
    account = sess.client("sts", region_name=settings.region).get_caller_identity()["Account"]
    if account == settings.account:
        return
    message = (
        f"the credentials are for account {account}, but env {settings.name!r} is for "
        f"account {settings.account}"
    )
    if write:
        raise AwsError(message + "; use credentials for that account (--profile) to --write")
    err.print(f"warning: {message}; quotas and usage shown are the credentials' account's")


def _write(
    args: argparse.Namespace,
    settings: Settings,
    *,
    best: ZoneResult,
    plan: Plan,
    reservation_id: str | None,
    console: Console,
) -> None:
    path = environment_file(args.env, args.config_dir)
    text = path.read_text(encoding="utf-8")
    new_text, changes = updated_text(
        text,
        region=best.region,
        gpu_zone=best.zone,
        region_zones=[z.name for z in plan.region_zones[best.region]],
        reservation_id=reservation_id,
    )
    if not changes:
        console.print(f"{path.name} already pins {best.region} / {best.zone}; nothing written.")
        return
    # Validate what would be written, exactly as synthesis will read it.
    try:
        parse_settings(new_text, name=settings.name, source=path)
    except SettingsError as exc:
        raise SettingsError(f"nothing written: the result would not validate: {exc}") from None
    write_atomically(path, new_text)
    console.print(f"Wrote {path.name}:")
    for change in changes:
        console.print(f"  {change}", markup=False, highlight=False)
    if any(c.startswith("vpc.availability_zones") or c.startswith("region") for c in changes):
        console.print(
            "  note: the VPC's zones changed: its subnets are replaced on the next deploy "
            "(review with `npx cdk diff`)."
        )

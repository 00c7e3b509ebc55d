"""The `raytrain capacity` subcommand: arguments, exit codes, and the run that ties the parts together."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import botocore.exceptions as bce
from rich.console import Console

from config.catalogue import CATALOGUE
from config.loader import (
    SettingsError,
    config_dir_argument,
    env_argument,
    environment_file,
    load_settings,
    parse_settings,
)
from config.settings import CAPACITY_RESERVATION_RE, Settings
from raytrain.aws import (
    AwsError,
    CapacityApi,
    error_code,
    error_message,
    fatal_problem,
    known_regions,
    session,
)
from raytrain.capacity.output import render
from raytrain.capacity.plan import Need, Plan, ZoneResult, evaluate
from raytrain.capacity.probe import Prober, Terminated, terminate_as_exception
from raytrain.capacity.quotas import quota_class
from raytrain.capacity.settings_file import updated_text, write_atomically

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


ApiFactory = Callable[[str], CapacityApi]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "capacity",
        help="find where the GPU node group can launch; --write pins it into the settings",
        # The package's docstring says what the command does (its last paragraph is for developers).
        description="\n\n".join((sys.modules["raytrain.capacity"].__doc__ or "").split("\n\n")[:2]),
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    env_argument(parser)
    parser.add_argument(
        "--regions",
        help="comma-separated candidate regions (default: the environment's region)",
    )
    parser.add_argument("--instance-type", help="GPU instance type (default: gpu_nodes.instance_type)")
    parser.add_argument(
        "--count",
        type=int,
        help="nodes wanted in one zone (default: job.nodes, the GPU nodes one job runs on)",
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
    config_dir_argument(parser)
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
    count = args.count if args.count is not None else settings.job.nodes
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
    with terminate_as_exception():
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

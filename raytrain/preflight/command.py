"""The `raytrain preflight` subcommand: arguments, exit codes, the clients, and the run."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.exceptions as bce

from config.loader import SettingsError, config_dir_argument, env_argument, load_settings
from config.settings import Settings
from raytrain.aws import CLIENT_CONFIG, AwsError, CapacityApi, credential_problem, session
from raytrain.hub_access import Access, model_access
from raytrain.preflight import account, capacity, eks, images, network, principals
from raytrain.preflight.permissions import IAM_ACTIONS, CallRecorder
from raytrain.preflight.registry import RegistryClient
from raytrain.preflight.report import Check, CredentialsRejected, Status, guarded, ok, problem, warn

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_AWS = 3

EXIT_CODES_HELP = f"""\
exit codes:
  {EXIT_OK}  every check is ok (warnings, e.g. extended support, do not fail it)
  {EXIT_PROBLEM}  at least one problem: each names its fix
  {EXIT_USAGE}  bad arguments or settings
  {EXIT_AWS}  AWS access: no or rejected credentials, or credentials of another account

IAM permissions (all read-only): {", ".join(IAM_ACTIONS)}; with --role-arn, sts:AssumeRole on it.
The images are read anonymously from their public registries (HTTPS to public.ecr.aws, quay.io,
registry.k8s.io).
"""


@dataclass
class Clients:
    eks: Any
    ecr: Any
    cloudformation: Any
    capacity: CapacityApi
    iam: Any
    # A gated model's token (job.hf_token_secret): the secret's service and region's client.
    secrets: Callable[[str, str], Any] | None = None
    hub: Any = None  # huggingface_hub.HfApi (tests: one pointed at a stub hub)

    @classmethod
    def connect(cls, sess: boto3.session.Session, region: str, recorder: CallRecorder) -> Clients:
        def client(name: str) -> Any:
            return recorder.watch(sess.client(name, region_name=region, config=CLIENT_CONFIG))

        return cls(
            eks=client("eks"),
            ecr=client("ecr"),
            cloudformation=client("cloudformation"),
            capacity=CapacityApi(region, client("ec2"), client("service-quotas")),
            iam=client("iam"),
            secrets=lambda service, where: recorder.watch(
                sess.client(service, region_name=where, config=CLIENT_CONFIG)
            ),
        )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "preflight",
        help="check the account before the first deploy (read-only): versions, images, capacity, ECR",
        description="\n\n".join((sys.modules["raytrain.preflight"].__doc__ or "").split("\n\n")[:1]),
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    env_argument(parser)
    parser.add_argument("--profile", help="AWS profile (default: the usual credential chain)")
    parser.add_argument(
        "--role-arn",
        help="assume this role in the environment's account first (the pipeline uses the CDK "
        "bootstrap's read-only lookup role)",
    )
    config_dir_argument(parser)
    parser.set_defaults(func=run)


def run(
    args: argparse.Namespace,
    clients: Clients | None = None,
    registry: RegistryClient | None = None,
    today: dt.date | None = None,
) -> int:
    try:
        settings = load_settings(args.env, args.config_dir)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if clients is None:
            clients = _connect(args, settings)
        checks = run_checks(settings, clients, registry or RegistryClient(), today or dt.date.today())
    except (AwsError, CredentialsRejected) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_AWS
    except (bce.ClientError, bce.BotoCoreError) as exc:
        print(f"error: {credential_problem(exc) or exc}", file=sys.stderr)
        return EXIT_AWS
    for check in checks:
        print(check.line())
    counts = {s: sum(c.status is s for c in checks) for s in Status}
    print(
        f"{settings.name}: {counts[Status.OK]} ok, {counts[Status.WARN]} warning(s), "
        f"{counts[Status.PROBLEM]} problem(s)"
    )
    return EXIT_PROBLEM if counts[Status.PROBLEM] else EXIT_OK


def _connect(args: argparse.Namespace, settings: Settings) -> Clients:
    sess = session(args.profile)
    if args.role_arn:
        creds = sess.client("sts", region_name=settings.region).assume_role(
            RoleArn=args.role_arn, RoleSessionName="raytrain-preflight"
        )["Credentials"]
        sess = boto3.session.Session(
            aws_access_key_id=creds["AccessKeyId"],
            aws_secret_access_key=creds["SecretAccessKey"],
            aws_session_token=creds["SessionToken"],
        )
    account_id = sess.client("sts", region_name=settings.region).get_caller_identity()["Account"]
    if account_id != settings.account:
        raise AwsError(
            f"the credentials are for account {account_id}, but env {settings.name!r} is for account "
            f"{settings.account}: use credentials of that account (--profile or --role-arn)"
        )
    return Clients.connect(sess, settings.region, CallRecorder())


def model_check(settings: Settings, clients: Clients) -> list[Check]:
    """The job's model reachable on the hub with its token (raytrain/hub_access.py)."""
    found, detail, fix = model_access(settings, clients.secrets or _no_client, clients.hub)
    if found == Access.OK:
        return [ok("model access", detail)]
    if found == Access.REFUSED:
        return [problem("model access", detail, fix)]
    return [
        warn("model access", detail, "the pods reach the hub through the VPC; check from there if in doubt")
    ]


def _no_client(service: str, region: str) -> Any:
    raise AwsError(f"no {service} client for {region}")


def run_checks(settings: Settings, clients: Clients, registry: RegistryClient, today: dt.date) -> list[Check]:
    """Every check, in the order a deploy meets them."""
    groups = [
        ("cdk bootstrap", lambda: account.bootstrap(settings, clients.cloudformation)),
        (principals.NAME, lambda: principals.access_principals(settings, clients.iam)),
        ("kubernetes version", lambda: eks.version_support(settings, clients.eks, today)),
        ("add-ons", lambda: eks.addon_versions(settings, clients.eks)),
        ("gpu capacity", lambda: capacity.capacity_checks(settings, clients.capacity)),
    ]
    if settings.image_source.prefix is not None:
        groups += [
            ("cache rules", lambda: account.cache_rules(settings, clients.ecr, clients.cloudformation)),
            ("repository creation templates", lambda: account.creation_templates(settings, clients.ecr)),
            ("registry policy", lambda: account.registry_policy(settings, clients.ecr)),
        ]
    groups.append(("images", lambda: images.image_checks(settings, clients.ecr, registry)))
    groups.append(
        ("network quotas", lambda: network.network_quotas(settings, clients.capacity, clients.cloudformation))
    )
    groups.append(("model access", lambda: iter(model_check(settings, clients))))
    checks: list[Check] = []
    for name, group in groups:
        checks += guarded(name, group)
    return checks

"""What every `raytrain job` action shares: exit codes, KubeRay's names, the error, the entry."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from config.loader import SettingsError, load_settings
from config.names import PART_OF, PART_OF_LABEL
from config.settings import Settings
from raytrain import verify
from raytrain.verify import VerifyError

if TYPE_CHECKING:
    from raytrain.job.api import JobApi

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2

# Every object the chart makes carries it, RayJobs deployed or submitted alike (k8s/chart.py).
JOBS_SELECTOR = f"{PART_OF_LABEL}={PART_OF}"

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2

CLUSTER_LABEL = "ray.io/cluster"
NODE_TYPE_LABEL = "ray.io/node-type"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
AUTH_TOKEN_KEY = "auth_token"  # noqa: S105 - a key name, not a secret
DASHBOARD_PORT = 8265
# How the dashboard takes the token (ray/_private/authentication/http_token_authentication.py):
# an `Authorization: Bearer` header, or this cookie, which the dashboard's login page sets.
TOKEN_COOKIE = "ray-authentication-token"  # noqa: S105 - a cookie name


class JobError(Exception):
    """The command cannot do what was asked; `str()` is the message for the user."""


def connect(args: argparse.Namespace, settings: Settings) -> JobApi:
    from raytrain.job.api import JobApi

    return JobApi(verify.connect(args.kubeconfig, args.context, settings))


def consoles(console: Console | None) -> tuple[Console, Console]:
    """(output, errors). On the command line errors go to stderr, so `--dry-run > job.json` or a
    pipe gets only the output; a caller's own console (tests record one) takes both."""
    if console is not None:
        return console, console
    return Console(), Console(stderr=True)


def guarded(
    args: argparse.Namespace,
    console: Console,
    body: Callable[[Settings, JobApi], int],
    *,
    overrides: list[str] | None = None,
    err: Console | None = None,
) -> int:
    """Load the settings (with `--set` overrides), connect, run `body`; every refusal is one line
    (on `err`) and exit 2."""
    err = err or console
    try:
        settings = load_settings(args.env, overrides=overrides)
    except SettingsError as exc:
        err.print(f"[bold red]settings:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return EXIT_UNUSABLE
    try:
        return body(settings, connect(args, settings))
    except (VerifyError, JobError) as exc:
        err.print(
            f"[bold red]raytrain job {args.job_command} ({settings.name}):[/] {escape(str(exc))}",
            highlight=False,
            soft_wrap=True,
        )
        return EXIT_UNUSABLE

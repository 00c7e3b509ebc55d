"""What every `raytrain job` action shares: exit codes, KubeRay's names, the error, the consoles.
The entry (settings loaded, API connected) is raytrain/job/entry.py: api.py imports this module,
so this one imports neither."""

from __future__ import annotations

from rich.console import Console

from config.names import PART_OF, PART_OF_LABEL

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2

# Every object the chart makes carries it, RayJobs deployed or submitted alike (k8s/chart.py).
JOBS_SELECTOR = f"{PART_OF_LABEL}={PART_OF}"

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


def consoles(console: Console | None) -> tuple[Console, Console]:
    """(output, errors). On the command line errors go to stderr, so `--dry-run > job.json` or a
    pipe gets only the output; a caller's own console (tests record one) takes both."""
    if console is not None:
        return console, console
    return Console(), Console(stderr=True)

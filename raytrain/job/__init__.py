"""`raytrain job submit|list|status|logs|stop|delete|dashboard --env NAME`: a training job's own
lifecycle, through the Kubernetes API, beside the infrastructure's (CloudFormation).

- `submit`: render the RayJob with the chart's code (k8s/chart.py) from the environment's
  settings plus `--set job.FIELD=VALUE` overrides, upload the training code as a content-addressed
  zip, create the RayJob; `--wait` follows it to its end. (submit.py)
- `list`: every RayJob of the team, deployed or submitted; `--all-teams` every team's, for a
  cluster admin. (status.py)
- `queue`: the team's Kueue queue: its quota, use and borrowing, each job admitted or pending with
  its position and Kueue's reason. (queue.py)
- `status`: the environment's RayJobs and, for the newest unfinished one (or `--job NAME`), its
  RayCluster and pods, and why pods wait (scheduling, autoscaler events). Exit 1 when that job
  failed. (status.py)
- `logs`: the job's submitter pod (`ray job submit` following the driver), its head or a worker,
  with `--follow`. (logs.py)
- `stop`, `delete`: end a job and release its GPU nodes; delete its record. (control.py)
- `dashboard`: forward the Ray dashboard (8265) of the job's cluster to localhost with
  `kubectl port-forward`, and print what token authentication needs. (dashboard.py)

Everything goes through the Kubernetes API with the kubeconfig `aws eks update-kubeconfig` writes
(as `raytrain verify` does): the caller's EKS access entry decides. Exit 2 when it cannot ask:
bad settings or overrides, no kubeconfig, credentials missing or refused, API unreachable, no
such job. User guide: docs/jobs.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from config.loader import config_dir_argument, env_argument
from raytrain.job.common import DASHBOARD_PORT, JobError
from raytrain.job.control import run_delete, run_stop
from raytrain.job.dashboard import run_dashboard
from raytrain.job.find import cluster_name, kuberay_check_name, select_job
from raytrain.job.logs import run_logs
from raytrain.job.queue import run_queue
from raytrain.job.status import run_list, run_status
from raytrain.job.submit import run_submit

__all__ = ["JobError", "cluster_name", "kuberay_check_name", "register", "select_job"]


def connection(p: argparse.ArgumentParser) -> None:
    env_argument(p)
    config_dir_argument(p)
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current context)")
    p.add_argument(
        "--team",
        help="your team (settings: teams): its namespace and queue; needed where there are several",
    )


def common(p: argparse.ArgumentParser, *, required: bool = False) -> None:
    connection(p)
    help_ = "the RayJob by name" if required else "a RayJob by name (default: the newest unfinished)"
    p.add_argument("--job", metavar="NAME", required=required, help=help_)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "job",
        help="training jobs of an environment: submit, list, status, logs, stop, delete, dashboard",
        description=(__doc__ or "").split("\n\n", 1)[0],
    )
    actions = parser.add_subparsers(dest="job_command", required=True, metavar="ACTION")

    _submit_parser(actions, connection)

    listing = actions.add_parser("list", help="every RayJob of the team (or of every team), newest first")
    connection(listing)
    listing.add_argument(
        "--all-teams",
        action="store_true",
        help="every team's RayJobs in one table (a cluster admin: a team's submitters may list only theirs)",
    )
    listing.set_defaults(func=run_list)

    queue = actions.add_parser(
        "queue", help="the team's Kueue queue: quota, use, borrowing, each job's position and why it waits"
    )
    connection(queue)
    queue.set_defaults(func=run_queue)

    status = actions.add_parser("status", help="the RayJobs, one job's RayCluster and pods, why pods wait")
    common(status)
    status.set_defaults(func=run_status)

    logs = actions.add_parser("logs", help="logs of the job's submitter (default), head or a worker")
    common(logs)
    target = logs.add_mutually_exclusive_group()
    target.add_argument(
        "--submitter",
        action="store_true",
        help="the submitter pod: `ray job submit` following the driver (the default)",
    )
    target.add_argument("--head", action="store_true", help="the Ray head pod")
    target.add_argument(
        "--worker",
        nargs="?",
        const="0",
        metavar="N|POD",
        help="a GPU worker pod: its index in name order (default 0) or its name",
    )
    logs.add_argument("-f", "--follow", action="store_true", help="keep streaming new lines")
    logs.add_argument("--tail", type=int, metavar="LINES", help="only the last LINES lines")
    logs.add_argument(
        "--previous", action="store_true", help="the previous container instance (after a restart)"
    )
    logs.set_defaults(func=run_logs)

    stop = actions.add_parser(
        "stop", help="end a running job and release its GPU workers (also one stopped from Ray)"
    )
    common(stop, required=True)
    stop.add_argument("--wait", action="store_true", help="wait until its objects are gone")
    stop.add_argument("--poll-seconds", type=float, default=2.0, help=argparse.SUPPRESS)
    stop.set_defaults(func=run_stop)

    delete = actions.add_parser("delete", help="delete a RayJob, its cluster and its record")
    common(delete, required=True)
    delete.add_argument("--wait", action="store_true", help="wait until its objects are gone")
    delete.add_argument("--poll-seconds", type=float, default=2.0, help=argparse.SUPPRESS)
    delete.set_defaults(func=run_delete)

    dash = actions.add_parser(
        "dashboard", help="port-forward the Ray dashboard and print what token authentication needs"
    )
    common(dash)
    dash.add_argument("--port", type=int, default=DASHBOARD_PORT, help="local port (default 8265)")
    dash.add_argument(
        "--print-token",
        action="store_true",
        help="print the Ray token itself (default: only the command that reads it)",
    )
    dash.add_argument(
        "--no-forward",
        action="store_true",
        help="print the port-forward command instead of running it",
    )
    dash.set_defaults(func=run_dashboard)


def _submit_parser(actions: Any, connection: Any) -> None:
    submit = actions.add_parser(
        "submit", help="render, upload the code and create a RayJob from the settings (and --set)"
    )
    connection(submit)
    submit.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="job.FIELD=VALUE",
        help="override a job setting for this job (repeatable), e.g. --set job.steps=20",
    )
    submit.add_argument("--name", help="the RayJob's name (default: rs-<run name>-<time>)")
    submit.add_argument(
        "--priority",
        help="low, normal or high (Kueue WorkloadPriorityClasses; default: the team's default_priority)",
    )
    submit.add_argument(
        "--wait", action="store_true", help="follow the job to its end; exit 0 only if it succeeded"
    )
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="print the RayJob as JSON and stop: nothing is uploaded or created",
    )
    submit.add_argument("--poll-seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    submit.set_defaults(func=run_submit)

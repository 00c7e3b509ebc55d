"""`raytrain verify --env NAME`: check a deployed environment end to end, as a pipeline gate.

Reads the environment's settings and the instance catalogue, then asks the Kubernetes API (the
kubeconfig `aws eks update-kubeconfig` writes) whether what Kubernetes reports matches them:

- every GPU node is Ready, labelled `role=gpu-worker` and `nvidia.com/gpu.present=true`, and has
  allocatable `nvidia.com/gpu` and (EFA types) `vpc.amazonaws.com/efa` equal to the catalogue's
  counts; at least `gpu_nodes.min_size` of them exist (the Cluster Autoscaler adds the job's
  nodes while a RayJob runs and removes them after, so none between jobs is expected);
- the NVIDIA and EFA device-plugin DaemonSets have a ready pod on every GPU node (a node missing
  `nvidia.com/gpu.present=true` gets no NVIDIA plugin pod and so advertises no GPUs);
- with node monitoring on (observability.node_monitoring): a ready `dcgm-server` pod (the agent's
  DCGM host engine) on every GPU node, and every GPU node reports `AcceleratedHardwareReady` True
  (without the engine the agent reports a DCGM error there and auto-repair replaces the node);
  with Container Insights on too: whether the add-on's dcgm-exporter on each GPU node runs a
  second, embedded engine beside it (a warning; docs/node-health.md);
- the KubeRay operator Deployment is available;
- the RayCluster is ready with the expected workers, GPUs and EFA requests; a RayJob's state.

Prints a table and exits 0 when every check passes, 1 when one fails, 2 when it cannot check at all
(bad settings, no kubeconfig, API unreachable or refusing).
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from config.loader import SettingsError, env_argument, load_settings
from config.names import STANDING_CLUSTER_NAME
from config.settings import Settings
from raytrain.verify.api import RAY_GROUP, RAY_VERSION, REQUEST_TIMEOUT, Api, VerifyError, connect
from raytrain.verify.checks import FAIL, INFO, PASS, WARN, Check
from raytrain.verify.nodes import (
    check_dcgm_engines,
    check_device_plugins,
    check_node_health,
    check_nodes,
)
from raytrain.verify.ray import check_operator, check_ray, workers_released

__all__ = [
    "FAIL",
    "INFO",
    "PASS",
    "RAY_GROUP",
    "RAY_VERSION",
    "REQUEST_TIMEOUT",
    "STANDING_CLUSTER_NAME",
    "WARN",
    "Api",
    "Check",
    "VerifyError",
    "connect",
    "register",
    "run",
    "verify",
    "workers_released",
]

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2
_STYLE = {PASS: "green", FAIL: "bold red", WARN: "yellow", INFO: "cyan"}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check a deployed environment: GPU/EFA nodes, device plugins, KubeRay, RayCluster",
        description=(__doc__ or "").split("\n\n", 1)[0],
    )
    env_argument(parser)
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current context)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    # Errors on stderr from the command line; a caller's console (tests) takes both.
    err = console or Console(stderr=True)
    console = console or Console()
    try:
        settings = load_settings(args.env)
    except SettingsError as exc:
        err.print(f"[bold red]settings:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return EXIT_UNUSABLE
    try:
        api = connect(args.kubeconfig, args.context, settings)
        checks = verify(api, settings)
    except VerifyError as exc:
        err.print(
            f"[bold red]cannot verify env {settings.name!r}:[/] {escape(str(exc))}",
            highlight=False,
            soft_wrap=True,
        )
        return EXIT_UNUSABLE
    failed = [c for c in checks if c.result == FAIL]
    console.print(render(checks, settings))
    if failed:
        console.print(f"[bold red]{len(failed)} check(s) failed[/] for env {settings.name!r}")
        return EXIT_FAILED
    console.print(f"[green]all checks passed[/] for env {settings.name!r}")
    return EXIT_OK


def render(checks: list[Check], settings: Settings) -> Table:
    table = Table(title=f"raytrain verify: {settings.name} ({settings.cluster.name}, {settings.region})")
    for col in ("check", "object", "result", "detail"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(c.name, c.subject, f"[{_STYLE[c.result]}]{c.result}[/]", c.detail)
    return table


# --- talking to the API -------------------------------------------------------------------------


def verify(api: Api, settings: Settings) -> list[Check]:
    checks: list[Check] = []
    gpu_nodes = check_nodes(api, settings, checks)
    check_device_plugins(api, settings, gpu_nodes, checks)
    if settings.observability.node_monitoring:
        check_node_health(api, gpu_nodes, checks)
        if settings.observability.metrics:
            check_dcgm_engines(api, gpu_nodes, checks)
    check_operator(api, checks)
    check_ray(api, settings, checks)
    return checks

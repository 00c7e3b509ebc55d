"""`raytrain job dashboard`: port-forward the job's Ray dashboard, and what token auth needs."""

from __future__ import annotations

import argparse
import base64
import shlex
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape

from config.settings import Settings
from raytrain.job.api import JobApi
from raytrain.job.common import (
    AUTH_TOKEN_KEY,
    DASHBOARD_PORT,
    EXIT_FAILED,
    EXIT_OK,
    TOKEN_COOKIE,
    JobError,
    consoles,
)
from raytrain.job.entry import guarded
from raytrain.job.find import Target, _meta, _pod_ready, kuberay_check_name


def token_auth(cluster: dict[str, Any] | None) -> tuple[bool, str | None]:
    """(token authentication on, the Secret KubeRay keeps the token in)."""
    if cluster is None:
        return False, None
    auth = (cluster.get("spec") or {}).get("authOptions") or {}
    if auth.get("mode", "disabled") != "token":
        return False, None
    return True, auth.get("secretName") or kuberay_check_name(str(_meta(cluster, "name")))


def kubectl_base(args: argparse.Namespace) -> list[str]:
    cmd = ["kubectl"]
    if args.kubeconfig:
        cmd += ["--kubeconfig", args.kubeconfig]
    if args.context:
        cmd += ["--context", args.context]
    return cmd


def forward_command(args: argparse.Namespace, target: Target) -> list[str]:
    head = target.cluster_pods("head")
    if not head or not _pod_ready(head[0]):
        state = "no head pod" if not head else f"head pod {_meta(head[0], 'name')} is not ready"
        raise JobError(f"{target.describe()}: {state}; `raytrain job status` shows the cluster's state")
    return [
        *kubectl_base(args),
        "-n",
        target.namespace,
        "port-forward",
        f"pod/{_meta(head[0], 'name')}",
        f"{args.port}:{DASHBOARD_PORT}",
        "--address",
        "127.0.0.1",
    ]


def token_lines(args: argparse.Namespace, target: Target) -> list[str]:
    enabled, secret_name = token_auth(target.cluster)
    if not enabled or secret_name is None:
        return ["Token authentication is off for this cluster: the dashboard needs no token."]
    ns = target.namespace
    read = (
        f"{shlex.join(kubectl_base(args))} -n {ns} get secret {secret_name} "
        f"-o jsonpath='{{.data.{AUTH_TOKEN_KEY}}}' | base64 -d"
    )
    lines = [
        f"Token authentication is on (authOptions.mode: token): KubeRay keeps the token in Secret "
        f"{ns}/{secret_name}, key {AUTH_TOKEN_KEY}.",
        f"- Browser: the dashboard asks for the token once and keeps it in the '{TOKEN_COOKIE}' cookie.",
        f'- Ray CLI/SDK: export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$({read})"',
        f"  then e.g. ray job list --address http://127.0.0.1:{args.port}",
        f"- HTTP: send 'Authorization: Bearer <token>' (read it with: {read})",
    ]
    secret = target.api.secret(ns, secret_name)
    if secret is None:
        lines.append(
            f"[yellow]Secret {ns}/{secret_name} does not exist yet[/] (KubeRay creates it with the cluster)."
        )
    elif args.print_token:
        raw = (secret.get("data") or {}).get(AUTH_TOKEN_KEY)
        if raw is None:
            lines.append(f"[yellow]Secret {ns}/{secret_name} has no key {AUTH_TOKEN_KEY}[/]")
        else:
            lines.append(f"token: {base64.b64decode(raw).decode()}")
    return lines


def run_dashboard(
    args: argparse.Namespace,
    console: Console | None = None,
    runner: Callable[[list[str]], int] | None = None,
) -> int:
    console, err = consoles(console)

    def body(settings: Settings, api: JobApi) -> int:
        target = Target(api, settings, args.job)
        if target.cluster_name is None:
            raise JobError(f"no RayJob and no standing RayCluster in namespace {target.namespace!r}")
        if target.cluster is None:
            raise JobError(
                f"RayCluster {target.namespace}/{target.cluster_name} of {target.describe()} does not "
                "exist (removed when the job finished, or not created yet)"
            )
        cmd = forward_command(args, target)
        console.print(f"Ray dashboard of {escape(target.describe())}: http://127.0.0.1:{args.port}")
        for line in token_lines(args, target):
            console.print(line, highlight=False, soft_wrap=True)
        console.print(f"port-forward: {escape(shlex.join(cmd))}", highlight=False, soft_wrap=True)
        if args.no_forward:
            return EXIT_OK
        if runner is None and shutil.which("kubectl") is None:
            raise JobError(
                "kubectl is not on PATH: install it, or run the port-forward command above yourself"
            )
        console.print("forwarding; Ctrl-C stops it")
        rc = (runner or _run)(cmd)
        return EXIT_OK if rc in (0, 130) else EXIT_FAILED

    return guarded(args, console, body, err=err)


def _run(cmd: list[str]) -> int:
    try:
        return subprocess.call(cmd)  # noqa: S603 - argv list, no shell
    except KeyboardInterrupt:
        return 130

"""`raytrain job status|logs|dashboard --env NAME`: what an operator types after a deploy.

- `status`: the environment's RayJobs (newest first) and, for the newest (or `--job NAME`), its
  RayCluster and pods, as tables. Exit 1 when that job failed.
- `logs`: the logs of the job's submitter pod (default: `ray job submit` following the driver, so
  the training progress), its head (`--head`) or a worker (`--worker [N|POD]`), with `--follow`.
- `dashboard`: forwards the Ray dashboard (8265) of the job's cluster to localhost with
  `kubectl port-forward`, and prints what token authentication needs.

Everything is read through the Kubernetes API with the kubeconfig `aws eks update-kubeconfig`
writes (as `raytrain verify` does). Exit 2 when it cannot ask: bad settings, no kubeconfig,
credentials missing or refused, API unreachable, no such job.

Names the commands rely on, all KubeRay's or Kubernetes' own contract (KubeRay v1.7.0 sources):
- pods of a Ray cluster carry `ray.io/cluster=<cluster>` and `ray.io/node-type=head|worker`
  (ray-operator/controllers/ray/utils/constant.go);
- in K8sJobMode the submitter is a Kubernetes Job named like the RayJob
  (rayjob_controller.go createNewK8sJob), whose pods Kubernetes labels
  `batch.kubernetes.io/job-name=<job>`;
- with `authOptions.mode: token` and no `secretName`, KubeRay creates the Secret
  `CheckName(<cluster name>)` in the cluster's namespace with the token under the key
  `auth_token` (raycluster_controller.go reconcileAuthSecret, utils.CheckName).
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from config.loader import SettingsError, load_settings
from config.names import STANDING_CLUSTER_NAME
from config.settings import ClusterMode, Settings
from raytrain import verify
from raytrain.verify import RAY_GROUP, RAY_VERSION, REQUEST_TIMEOUT, VerifyError

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


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "job",
        help="the RayJob of an environment: status, logs, Ray dashboard",
        description=(__doc__ or "").split("\n\n", 1)[0],
    )
    actions = parser.add_subparsers(dest="job_command", required=True, metavar="ACTION")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--env", required=True, help="environment name (config/environments/NAME.yaml)")
        p.add_argument("--job", metavar="NAME", help="a RayJob by name (default: the newest)")
        p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
        p.add_argument("--context", help="kubeconfig context (default: the current context)")

    status = actions.add_parser("status", help="the RayJob, its RayCluster and pods, as tables")
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


# --- the API --------------------------------------------------------------------------------------


class JobApi:
    """The reads these commands need, as plain dicts, on top of verify's client and error mapping."""

    def __init__(self, api: verify.Api) -> None:
        self.api = api
        self.host = api.host

    def rayjobs(self, namespace: str) -> list[dict[str, Any]]:
        jobs = self.api.ray_objects(namespace, "rayjobs")
        if jobs is None:
            raise JobError(
                f"the API at {self.host} has no RayJob resource: is the KubeRay operator installed "
                "(the Cluster stack)?"
            )
        return jobs

    def raycluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.api._call(
            f"reading RayCluster {namespace}/{name}",
            self.api.custom.get_namespaced_custom_object,
            RAY_GROUP,
            RAY_VERSION,
            namespace,
            "rayclusters",
            name,
        )

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.api.pods(namespace, selector)

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.api._call(
            f"reading Secret {namespace}/{name}", self.api.core.read_namespaced_secret, name, namespace
        )

    def log_chunks(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None,
        follow: bool,
        tail: int | None,
        previous: bool,
    ) -> Iterator[bytes]:
        """The container's log as it arrives (the API streams it while `follow` is set)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        kwargs: dict[str, Any] = {"follow": follow, "previous": previous}
        if container:
            kwargs["container"] = container
        if tail is not None:
            kwargs["tail_lines"] = tail
        try:
            # No timeout while following (the client takes none or both): a quiet training step
            # is not a dead server, and the lookups before this one proved the server answers.
            timeout: Any = None if follow else REQUEST_TIMEOUT
            resp: Any = self.api.core.read_namespaced_pod_log(
                pod, namespace, _preload_content=False, _request_timeout=timeout, **kwargs
            )
            try:
                yield from resp.stream(4096, decode_content=True)
            finally:
                resp.release_conn()
        except ApiException as exc:
            if exc.status in (401, 403):
                raise JobError(_refused(self.host, f"reading logs of {namespace}/{pod}", exc)) from None
            detail = _status_message(exc)
            raise JobError(f"logs of {namespace}/{pod}: HTTP {exc.status} {detail}") from None
        except (HTTPError, OSError) as exc:
            raise JobError(f"the log stream from {self.host} broke ({type(exc).__name__}: {exc})") from None


def _refused(host: str, what: str, exc: Any) -> str:
    return (
        f"the API server at {host} refused {what} (HTTP {exc.status} {exc.reason}): check your AWS "
        "credentials and that your IAM principal has an EKS access entry (cluster.admin_principal_arns)"
    )


def _status_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def _connect(args: argparse.Namespace, settings: Settings) -> JobApi:
    return JobApi(verify.connect(args.kubeconfig, args.context, settings))


# --- finding the job, its cluster and pods ---------------------------------------------------------


def _meta(obj: dict[str, Any], key: str, default: Any = None) -> Any:
    return (obj.get("metadata") or {}).get(key, default)


def _created(obj: dict[str, Any]) -> str:
    return str(_meta(obj, "creationTimestamp", "") or "")


_FINISHED = ("Complete", "Failed")


def select_job(jobs: list[dict[str, Any]], name: str | None, namespace: str) -> dict[str, Any] | None:
    """`--job NAME`, else the newest unfinished RayJob (a data-preparation job that ended after the
    training job started is not the one to watch), else the newest; None when there is none."""
    if name:
        for job in jobs:
            if _meta(job, "name") == name:
                return job
        present = ", ".join(sorted(str(_meta(j, "name")) for j in jobs)) or "none"
        raise JobError(f"no RayJob {name!r} in namespace {namespace!r}; present: {present}")
    running = [j for j in jobs if (j.get("status") or {}).get("jobDeploymentStatus") not in _FINISHED]
    pool = running or jobs
    return max(pool, key=lambda j: (_created(j), str(_meta(j, "name")))) if pool else None


def cluster_name(job: dict[str, Any] | None, settings: Settings) -> str | None:
    """The RayCluster the job runs on: the one KubeRay made for it, or the standing one it selects."""
    if job is not None:
        status_name = (job.get("status") or {}).get("rayClusterName")
        if status_name:
            return str(status_name)
        selector = (job.get("spec") or {}).get("clusterSelector") or {}
        if selector.get(CLUSTER_LABEL):
            return str(selector[CLUSTER_LABEL])
    if settings.job.cluster is ClusterMode.STANDING:
        return STANDING_CLUSTER_NAME
    return None


def kuberay_check_name(name: str) -> str:
    """KubeRay's utils.CheckName (v1.7.0): what it names per-cluster objects such as the auth Secret."""
    max_length = 50
    if len(name) > max_length:
        name = name[len(name) - max_length :]
    if name[0].isdigit() or not name[0].isalnum():
        name = "r" + name[1:]
    return name


def _pod_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )


def _restarts(pod: dict[str, Any]) -> int:
    return sum(
        int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or []
    )


def _role(pod: dict[str, Any]) -> str:
    labels = _meta(pod, "labels") or {}
    if JOB_NAME_LABEL in labels:
        return "submitter"
    return str(labels.get(NODE_TYPE_LABEL, "?"))


def _by_name(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(pods, key=lambda p: str(_meta(p, "name")))


class Target:
    """One job's objects, looked up once."""

    def __init__(self, api: JobApi, settings: Settings, job_name: str | None) -> None:
        self.api, self.settings = api, settings
        self.namespace = settings.workload.namespace
        self.jobs = api.rayjobs(self.namespace)
        self.job = select_job(self.jobs, job_name, self.namespace)
        self.cluster_name = cluster_name(self.job, settings)
        self.cluster = api.raycluster(self.namespace, self.cluster_name) if self.cluster_name else None

    def cluster_pods(self, node_type: str) -> list[dict[str, Any]]:
        if not self.cluster_name:
            return []
        selector = f"{CLUSTER_LABEL}={self.cluster_name},{NODE_TYPE_LABEL}={node_type}"
        return _by_name(self.api.pods(self.namespace, selector))

    def submitter_pods(self) -> list[dict[str, Any]]:
        if self.job is None:
            return []
        return _by_name(self.api.pods(self.namespace, f"{JOB_NAME_LABEL}={_meta(self.job, 'name')}"))

    def describe(self) -> str:
        if self.job is not None:
            return f"RayJob {self.namespace}/{_meta(self.job, 'name')}"
        return f"namespace {self.namespace!r}"


# --- status ---------------------------------------------------------------------------------------

_STATE_STYLE = {
    "SUCCEEDED": "green",
    "Complete": "green",
    "RUNNING": "cyan",
    "Running": "cyan",
    "ready": "green",
    "FAILED": "bold red",
    "Failed": "bold red",
    "STOPPED": "yellow",
    "Suspended": "yellow",
}


def _styled(value: Any) -> str:
    text = escape(str(value)) if value not in (None, "") else "-"
    style = _STATE_STYLE.get(str(value))
    return f"[{style}]{text}[/]" if style else text


# Ray's job supervisor (ray/dashboard/modules/job/job_supervisor.py) reports a failed entry point
# as this header and the tail of its logs, and KubeRay copies it into the RayJob's status.message
# (rayjob_controller.go: `Status.Message = jobInfo.Message`). The training and preparation CLIs
# end a refused input with one line (docs/data-errors.md): show that line and the exit code.
_ENTRYPOINT_FAILED = re.compile(r"^Job entrypoint command failed with exit code (-?\d+)(?:, [^\n]*:\n|\.)")


def message_cell(message: Any) -> str:
    """The status message as the table shows it: for a failed entry point, its exit code and the
    last line it printed, not 20,000 characters of log."""
    text = str(message or "")
    m = _ENTRYPOINT_FAILED.match(text)
    if not m:
        return _styled(message)
    lines = [line for line in text[m.end() :].splitlines() if line.strip()]
    return escape(f"exit code {m.group(1)}: {lines[-1].strip() if lines else 'no logs'}")


def job_failed(job: dict[str, Any]) -> bool:
    status = job.get("status") or {}
    return status.get("jobDeploymentStatus") == "Failed" or status.get("jobStatus") == "FAILED"


def status_tables(target: Target) -> list[Table]:
    ns = target.namespace
    jobs = Table(title=f"RayJobs in {ns} ({target.settings.cluster.name}, {target.settings.region})")
    for col in ("job", "deployment", "ray job", "started", "ended", "cluster", "message"):
        jobs.add_column(col, overflow="fold")
    for job in sorted(target.jobs, key=lambda j: (_created(j), str(_meta(j, "name"))), reverse=True):
        st = job.get("status") or {}
        mark = "▶ " if job is target.job else "  "
        jobs.add_row(
            mark + escape(str(_meta(job, "name"))),
            _styled(st.get("jobDeploymentStatus")),
            _styled(st.get("jobStatus")),
            _styled(st.get("startTime")),
            _styled(st.get("endTime")),
            _styled(st.get("rayClusterName")),
            message_cell(st.get("message")),
        )
    tables = [jobs]

    if target.cluster_name:
        cl = Table(title=f"RayCluster {ns}/{target.cluster_name}")
        for col in ("state", "workers ready", "head", "conditions"):
            cl.add_column(col, overflow="fold")
        if target.cluster is None:
            cl.add_row("[yellow]not found[/]", "-", "-", "removed with its job, or not created yet")
        else:
            st = target.cluster.get("status") or {}
            desired = st.get("desiredWorkerReplicas")
            conds = ", ".join(
                f"{c.get('type')}={c.get('status')}" for c in st.get("conditions") or [] if c.get("type")
            )
            head = st.get("head") or {}
            workers = f"{st.get('readyWorkerReplicas', 0)}/{desired if desired is not None else '?'}"
            if verify.workers_released(target.cluster):
                workers = "released (job ended; head kept for inspection)"
            cl.add_row(
                _styled(st.get("state")),
                workers,
                escape(str(head.get("podName") or head.get("podIP") or "-")),
                escape(conds) or "-",
            )
        tables.append(cl)

    pods = target.submitter_pods() + target.cluster_pods("head") + target.cluster_pods("worker")
    pt = Table(title="Pods")
    for col in ("pod", "role", "phase", "ready", "restarts", "node"):
        pt.add_column(col, overflow="fold")
    for pod in pods:
        st = pod.get("status") or {}
        pt.add_row(
            escape(str(_meta(pod, "name"))),
            _role(pod),
            _styled(st.get("phase")),
            "[green]yes[/]" if _pod_ready(pod) else "[yellow]no[/]",
            str(_restarts(pod)),
            escape(str((pod.get("spec") or {}).get("nodeName") or "-")),
        )
    if not pods:
        pt.add_row("-", "-", "-", "-", "-", "no pods (finished and cleaned up, or not started)")
    tables.append(pt)
    return tables


def run_status(args: argparse.Namespace, console: Console | None = None) -> int:
    console = console or Console()

    def body(settings: Settings, api: JobApi) -> int:
        target = Target(api, settings, args.job)
        for table in status_tables(target):
            console.print(table)
        if target.job is None:
            console.print(f"no RayJob in namespace {target.namespace!r} yet (the Workload stack applies it)")
            return EXIT_OK
        if job_failed(target.job):
            console.print(f"[bold red]{escape(target.describe())} failed[/]")
            return EXIT_FAILED
        return EXIT_OK

    return _guarded(args, console, body)


# --- logs -----------------------------------------------------------------------------------------


def _container(pod: dict[str, Any]) -> str | None:
    containers = (pod.get("spec") or {}).get("containers") or []
    return str(containers[0]["name"]) if containers else None


def pick_pod(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    if args.head:
        pods, what = target.cluster_pods("head"), "head pod"
    elif args.worker is not None:
        pods, what = target.cluster_pods("worker"), "worker pod"
        names = [str(_meta(p, "name")) for p in pods]
        if args.worker in names:
            return pods[names.index(args.worker)]
        if not args.worker.isdigit():
            raise JobError(
                f"no worker pod {args.worker!r} in {target.describe()}; present: {names or 'none'}"
            )
        index = int(args.worker)
        if index >= len(pods):
            raise JobError(
                f"--worker {index}: {target.describe()} has {len(pods)} worker pod(s): {names or 'none'}"
            )
        return pods[index]
    else:
        # Newest attempt first: the Job retries its submitter pod up to its backoff limit.
        pods = sorted(target.submitter_pods(), key=_created, reverse=True)
        what = "submitter pod"
    if not pods:
        raise JobError(
            f"no {what} for {target.describe()}: not started yet, or removed when the job finished "
            "(`raytrain job status` shows what exists)"
        )
    return pods[0]


def run_logs(args: argparse.Namespace, console: Console | None = None) -> int:
    console = console or Console()
    out = sys.stdout

    def body(settings: Settings, api: JobApi) -> int:
        target = Target(api, settings, args.job)
        pod = pick_pod(target, args)
        name = str(_meta(pod, "name"))
        console.print(f"[dim]logs of {target.namespace}/{escape(name)} ({_role(pod)})[/]", highlight=False)
        decoder = _Utf8()
        for chunk in api.log_chunks(
            target.namespace,
            name,
            container=_container(pod),
            follow=args.follow,
            tail=args.tail,
            previous=args.previous,
        ):
            out.write(decoder(chunk))
            out.flush()
        out.write(decoder(b"", final=True))
        out.flush()
        return EXIT_OK

    return _guarded(args, console, body)


class _Utf8:
    """Decodes a byte stream whose chunks may split a multi-byte character."""

    def __init__(self) -> None:
        import codecs

        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, data: bytes, final: bool = False) -> str:
        return str(self._dec.decode(data, final=final))


# --- dashboard ------------------------------------------------------------------------------------


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
    console = console or Console()

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

    return _guarded(args, console, body)


def _run(cmd: list[str]) -> int:
    try:
        return subprocess.call(cmd)  # noqa: S603 - argv list, no shell
    except KeyboardInterrupt:
        return 130


# --- shared entry ---------------------------------------------------------------------------------


def _guarded(args: argparse.Namespace, console: Console, body: Callable[[Settings, JobApi], int]) -> int:
    try:
        settings = load_settings(args.env)
    except SettingsError as exc:
        console.print(f"[bold red]settings:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return EXIT_UNUSABLE
    try:
        return body(settings, _connect(args, settings))
    except (VerifyError, JobError) as exc:
        console.print(
            f"[bold red]raytrain job {args.job_command} ({settings.name}):[/] {escape(str(exc))}",
            highlight=False,
            soft_wrap=True,
        )
        return EXIT_UNUSABLE

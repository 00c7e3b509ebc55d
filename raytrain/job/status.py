"""`raytrain job status`: the environment's RayJobs, and one job's RayCluster and pods."""

from __future__ import annotations

import argparse
import re
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from config.names import ORIGIN_LABEL, RUN_NAME_LABEL
from config.settings import ClusterMode, Settings
from config.startup import PODS_READY_TIMEOUT_SECONDS
from raytrain import verify
from raytrain.job.api import JobApi
from raytrain.job.common import EXIT_FAILED, EXIT_OK, JOBS_SELECTOR, JobError, consoles
from raytrain.job.entry import guarded
from raytrain.job.find import Target, _created, _meta, _pod_ready, _restarts, _role, finished, gpu_nodes_held
from raytrain.job.queue import entry, queue_state
from training.reporting import progress

# Events that say why a pod waits: the scheduler's, and the Cluster Autoscaler's (it reports on
# the pod whether it started a node for it, and why not, e.g. "max node group size reached").
_WAIT_EVENTS = ("FailedScheduling", "NotTriggerScaleUp", "TriggeredScaleUp", "FailedCreate")

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
    for col in ("job", "from", "deployment", "ray job", "started", "ended", "cluster", "message"):
        jobs.add_column(col, overflow="fold")
    for job in sorted(target.jobs, key=lambda j: (_created(j), str(_meta(j, "name"))), reverse=True):
        st = job.get("status") or {}
        mark = "▶ " if job is target.job else "  "
        jobs.add_row(
            mark + escape(str(_meta(job, "name"))),
            escape(str((_meta(job, "labels") or {}).get(ORIGIN_LABEL, "-"))),
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


def waiting_lines(target: Target) -> list[str]:
    """Why the job's pods are Pending: their scheduling condition, the latest scheduler and
    autoscaler events, and the GPU nodes other unfinished jobs hold against gpu_nodes.max_size."""
    pods = target.submitter_pods() + target.cluster_pods("head") + target.cluster_pods("worker")
    pending = [p for p in pods if (p.get("status") or {}).get("phase") == "Pending"]
    lines = []
    for pod in pending:
        name = str(_meta(pod, "name"))
        conds = (pod.get("status") or {}).get("conditions") or []
        unscheduled = [c for c in conds if c.get("type") == "PodScheduled" and c.get("status") == "False"]
        why = unscheduled[0].get("message") if unscheduled else "scheduled; starting (image pull, init)"
        lines.append(f"[yellow]{escape(name)} is Pending:[/] {escape(str(why))}")
        events = [
            e for e in target.api.events(target.namespace, "Pod", name) if e.get("reason") in _WAIT_EVENTS
        ]
        events.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
        for event in events[-3:]:
            source = (event.get("source") or {}).get("component") or event.get("reportingComponent") or "-"
            lines.append(
                f"  {escape(str(source))} {event.get('reason')}: {escape(str(event.get('message')))}"
            )
    settings = target.settings
    if pending and target.job is not None and settings.job.cluster is ClusterMode.OWN:
        others = {
            str(_meta(j, "name")): gpu_nodes_held(j)
            for j in target.jobs
            if j is not target.job and not finished(j) and gpu_nodes_held(j)
        }
        mine = gpu_nodes_held(target.job)
        if others and sum(others.values()) + mine > settings.gpu_nodes.max_size:
            held = ", ".join(f"{k} ({v})" for k, v in sorted(others.items()))
            lines.append(
                f"[yellow]waiting for GPU nodes:[/] this job needs {mine}, other unfinished jobs hold "
                f"{sum(others.values())} ({held}) of gpu_nodes.max_size {settings.gpu_nodes.max_size}; "
                "Kueue requeues it if its pods are not ready within "
                f"{PODS_READY_TIMEOUT_SECONDS} s of admission (waitForPodsReady, config/startup.py)"
            )
    return lines


# Lines of the driver's log read for its progress lines: one per step (--log-every 1), the
# evaluations and checkpoints between them.
PROGRESS_TAIL = 400


def progress_text(target: Target) -> str | None:
    """The job's progress as its driver last printed it (training/reporting/progress.py), read from the newest
    submitter pod's log (`ray job submit` follows the driver there): step, percent, loss, the latest
    held-out loss, tokens/s and the ETA. None before the first step, or without a log to read."""
    pods = sorted(target.submitter_pods(), key=_created, reverse=True)
    if not pods:
        return None
    containers = (pods[0].get("spec") or {}).get("containers") or [{}]
    try:
        chunks = target.api.log_chunks(target.namespace, str(_meta(pods[0], "name")),
                                       container=containers[0].get("name"), follow=False,
                                       tail=PROGRESS_TAIL, previous=False)  # fmt: skip
        text = b"".join(chunks).decode("utf-8", errors="replace")
    except JobError:  # not started yet: the pods table says so
        return None
    p = progress.latest(text.splitlines())
    if p is None:
        return None
    parts = [f"step {p['step']}/{p['steps']} ({p['percent']}%)"]
    if "loss" in p:
        parts.append(f"loss {p['loss']:.4f}")
    if "eval_loss" in p:
        parts.append(f"held-out loss {p['eval_loss']:.4f} (step {p['eval_step']})")
    if "tokens_per_s" in p:
        parts.append(f"{p['tokens_per_s']:,.0f} tokens/s")
    if p.get("preemptions"):  # stop notices, counted apart from failures, with the steps each cost
        lost = ", ".join("?" if x is None else str(x) for x in p["preemptions"])
        parts.append(f"preempted {len(p['preemptions'])}x (steps lost: {lost})")
    if "eta" in p and not finished(target.job or {}):
        parts.append(f"ETA {p['eta']}")
    return "progress: " + ", ".join(parts)


def run_list(args: argparse.Namespace, console: Console | None = None) -> int:
    console, err = consoles(console)
    every = getattr(args, "all_teams", False)

    def body(settings: Settings, api: JobApi) -> int:
        teams = settings.team_list if every else (settings.active_team,)
        if every:
            _check_may_list(api, settings)
        where = ", ".join(t.namespace for t in teams)
        table = Table(
            title=f"RayJobs of {settings.name} in {where} ({settings.cluster.name}, {settings.region})"
        )
        columns = ("job", "from", "run", "GPU nodes", "deployment", "ray job", "created", "ended")
        for col in ("team", *columns) if every else columns:
            table.add_column(col, overflow="fold")
        found = [(team, job) for team in teams for job in api.rayjobs(team.namespace, JOBS_SELECTOR)]
        for team, job in sorted(
            found, key=lambda tj: (_created(tj[1]), str(_meta(tj[1], "name"))), reverse=True
        ):
            st, labels = job.get("status") or {}, _meta(job, "labels") or {}
            cells = [
                escape(str(_meta(job, "name"))),
                escape(str(labels.get(ORIGIN_LABEL, "-"))),
                escape(str(labels.get(RUN_NAME_LABEL, "-"))),
                str(gpu_nodes_held(job) or "-"),
                _styled(st.get("jobDeploymentStatus")),
                _styled(st.get("jobStatus")),
                _styled(_created(job)),
                _styled(st.get("endTime")),
            ]
            table.add_row(*([escape(team.name)] if every else []), *cells)
        console.print(table)
        if not found:
            console.print(
                f"no RayJob in namespace(s) {where}: `raytrain job submit --env {settings.name}` starts one"
            )
        return EXIT_OK

    return guarded(args, console, body, err=err)


def _check_may_list(api: JobApi, settings: Settings) -> None:
    """--all-teams lists every team's namespace: only for a caller RBAC lets list RayJobs in each
    (a cluster admin's access entry). A team's submitters are bound in their own namespace only
    (k8s/rbac.py), so for them it is refused up front, naming the namespace, not half-listed."""
    for team in settings.team_list:
        if not api.may("list", verify.RAY_GROUP, "rayjobs", team.namespace):
            raise JobError(
                f"--all-teams: your access entry may not list RayJobs in {team.namespace} (team "
                f"{team.name}): a team's submitters see only their own namespace; every team's jobs "
                "are for cluster admins (cluster.admin_principal_arns). Use --team TEAM"
            )


def _queue_line(api: JobApi, target: Target) -> str | None:
    """Where the job stands in its Kueue queue (raytrain/job/queue.py); nothing where Kueue is
    not there to ask (an API without its Workload resource)."""
    if target.job is None:
        return None
    try:
        workloads = api.workloads(target.namespace)
    except JobError:
        return None
    return queue_state([entry(w) for w in workloads], str(target.job["metadata"]["name"]))


def run_status(args: argparse.Namespace, console: Console | None = None) -> int:
    console, err = consoles(console)

    def body(settings: Settings, api: JobApi) -> int:
        target = Target(api, settings, args.job)
        for table in status_tables(target):
            console.print(table)
        for line in waiting_lines(target):
            console.print(line, highlight=False, soft_wrap=True)
        shown = progress_text(target)
        if shown is not None:
            console.print(escape(shown), highlight=False, soft_wrap=True)
        queued = _queue_line(api, target)
        if queued is not None:
            console.print(escape(queued), highlight=False, soft_wrap=True)
        if target.job is None:
            console.print(
                f"no RayJob in namespace {target.namespace!r} yet: `raytrain job submit --env "
                f"{settings.name}` starts one (or the Workload stack, where job.deploy is true)"
            )
            return EXIT_OK
        if job_failed(target.job):
            console.print(f"[bold red]{escape(target.describe())} failed[/]")
            return EXIT_FAILED
        return EXIT_OK

    return guarded(args, console, body, err=err)

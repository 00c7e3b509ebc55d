"""`raytrain job queue --env NAME [--team T]`: the team's Kueue queue, as its submitters may see it.

Its quota from the settings (the ClusterQueue k8s/kueue.py builds from them), what it uses and
reserves now from its LocalQueue's status (GPUs by flavor, Kueue's own accounting), and each job in
it: admitted, or pending with its position and Kueue's reason. Everything is read in the team's
namespace (a Role there allows it: k8s/rbac.py); ClusterQueues and the other teams' jobs are
cluster-wide or in their namespaces, which a team's submitters cannot read, so the position is
within the team's own queue.

Position: Kueue orders a ClusterQueue's pending workloads by priority, higher first, then by their
queue timestamp, earlier first (kueue v0.19.2 pkg/cache/queue/cluster_queue.go baseCompareFunc);
with requeuingStrategy timestamp Eviction (cdk_constructs/kueue.py) an evicted workload's timestamp
is its eviction's (pkg/workload Ordering.GetQueueOrderTimestamp).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from config.names import GPU_RESOURCE
from config.settings import Settings
from raytrain.job.api import JobApi
from raytrain.job.common import EXIT_OK, consoles
from raytrain.job.entry import guarded


@dataclass(frozen=True)
class Entry:
    """One RayJob's Workload in the queue."""

    job: str
    priority_class: str
    priority: int
    admitted: bool
    reserved: bool
    since: datetime
    reason: str


def _condition(workload: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (workload.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _time(text: str | None) -> datetime:
    if not text:
        return datetime.min.replace(tzinfo=UTC)
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def entry(workload: dict[str, Any]) -> Entry:
    meta, spec = workload.get("metadata") or {}, workload.get("spec") or {}
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("kind") == "RayJob"]
    job = owners[0]["name"] if owners else meta.get("name", "?")
    admitted = (_condition(workload, "Admitted") or {}).get("status") == "True"
    reserved_cond = _condition(workload, "QuotaReserved") or {}
    reserved = reserved_cond.get("status") == "True"
    evicted = _condition(workload, "Evicted")
    since = _time((evicted or {}).get("lastTransitionTime") or meta.get("creationTimestamp"))
    if admitted:
        reason = "admitted"
    elif reserved:
        # Quota held, waiting for the provisioning check (the autoscaler raising the GPU group).
        checks = (workload.get("status") or {}).get("admissionChecks") or []
        waiting = [f"{c.get('name')}: {c.get('state')} {c.get('message') or ''}".strip() for c in checks]
        reason = "quota reserved, " + ("; ".join(waiting) or "waiting for admission checks")
    else:
        reason = reserved_cond.get("message") or (evicted or {}).get("message") or "waiting for quota"
    ref = spec.get("priorityClassRef") or {}
    return Entry(
        job=job,
        priority_class=str(ref.get("name") or spec.get("priorityClassName") or "-"),
        priority=int(spec.get("priority") or 0),
        admitted=admitted,
        reserved=reserved,
        since=since,
        reason=str(reason),
    )


def pending_order(entries: list[Entry]) -> list[Entry]:
    """Kueue's order of a ClusterQueue's pending workloads (module docstring)."""
    return sorted(
        (e for e in entries if not e.admitted and not e.reserved), key=lambda e: (-e.priority, e.since, e.job)
    )


def gpus_in(status: dict[str, Any], key: str) -> int:
    total = 0
    for flavor in status.get(key) or []:
        for resource in flavor.get("resources") or []:
            if resource.get("name") == GPU_RESOURCE:
                total += int(str(resource.get("total") or 0))
    return total


def queue_lines(settings: Settings, local_queue: dict[str, Any] | None) -> list[str]:
    team, gpu = settings.active_team, settings.gpu_nodes
    per_node = gpu.instance.gpus
    borrow = (
        "any idle quota" if team.borrowing_limit_nodes is None else f"{team.borrowing_limit_nodes} node(s)"
    )
    lend = "all of it" if team.lending_limit_nodes is None else f"{team.lending_limit_nodes} node(s)"
    lines = [
        f"team {team.name}: queue {team.queue} in namespace {team.namespace}; quota {team.gpu_nodes} "
        f"{gpu.instance_type} node(s) ({team.gpu_nodes * per_node} GPUs), may borrow {borrow}, lends "
        f"{lend}; default priority {team.default_priority}",
    ]
    if local_queue is None:
        lines.append(f"no LocalQueue {team.namespace}/{team.queue}: the Cluster stack has not created it yet")
        return lines
    status = local_queue.get("status") or {}
    used, reserved = gpus_in(status, "flavorsUsage"), gpus_in(status, "flavorsReservation")
    over = max(0, reserved - team.gpu_nodes * per_node)
    lines.append(
        f"in use: {used} GPUs ({used // per_node} node(s)); reserved: {reserved} GPUs"
        + (f", {over} of them borrowed from the cohort" if over else "")
        + f"; {status.get('admittedWorkloads', 0)} admitted, {status.get('pendingWorkloads', 0)} pending"
    )
    return lines


def run_queue(args: argparse.Namespace, console: Console | None = None) -> int:
    console, err = consoles(console)

    def body(settings: Settings, api: JobApi) -> int:
        team = settings.active_team
        local_queue = api.local_queue(team.namespace, team.queue)
        entries = [entry(w) for w in api.workloads(team.namespace)]
        for line in queue_lines(settings, local_queue):
            console.print(escape(line), highlight=False, soft_wrap=True)
        now = datetime.now(UTC)
        table = Table("#", "job", "priority", "state", "waiting", "why", show_lines=False)
        running = [e for e in entries if e.admitted or e.reserved]
        for e in running:
            state = "admitted" if e.admitted else "reserved"
            table.add_row("", e.job, e.priority_class, state, _age(now, e.since), escape(e.reason))
        for position, e in enumerate(pending_order(entries), start=1):
            table.add_row(
                str(position), e.job, e.priority_class, "pending", _age(now, e.since), escape(e.reason)
            )
        if entries:
            console.print(table)
        else:
            console.print("no jobs in the queue", highlight=False)
        return EXIT_OK

    return guarded(args, console, body, err=err)


def _age(now: datetime, since: datetime) -> str:
    seconds = max(0, int((now - since).total_seconds()))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def queue_state(entries: list[Entry], job: str) -> str | None:
    """`job status`'s line on a job's place in its queue: "admitted", "quota reserved, ...", or
    "queued: N jobs ahead" with Kueue's reason; None when Kueue has no Workload for it (not queued,
    e.g. on a standing cluster, or already gone)."""
    mine = next((e for e in entries if e.job == job), None)
    if mine is None:
        return None
    if mine.admitted:
        return "queue: admitted"
    if mine.reserved:
        return f"queue: {mine.reason}"
    ahead = [e.job for e in pending_order(entries)].index(job)
    return f"queued: {ahead} job{'s' if ahead != 1 else ''} ahead in its team's queue; Kueue: {mine.reason}"

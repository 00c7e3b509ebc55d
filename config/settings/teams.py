"""Teams that share the cluster: each one a Kueue queue with a quota, a namespace and its submitters.

```yaml
teams:
  research:                       # the team's name: its ClusterQueue, LocalQueue, namespace ray-research
    submitters: [arn:aws:iam::111122223333:role/Research]
    gpu_nodes: 1                  # nominal quota: GPU nodes of the GPU node group
    borrowing_limit_nodes: 1      # idle quota it may borrow from the others (unset: any; 0: none)
    lending_limit_nodes: null     # its own idle quota the others may borrow (unset: all; 0: none)
    default_priority: normal      # low | normal | high (WorkloadPriorityClasses)
```

No `teams:` section means one implicit team, `default`: the Ray namespace (workload.namespace), the
submitters of cluster.job_submitter_principals and the whole GPU node group as its quota, so a file
written before teams existed deploys what it did, with its jobs now admitted whole by Kueue.

The checks that need the rest of the file (quotas against gpu_nodes.max_size, principals against
the admins) are in `config/settings/root.py` (`team_problems`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import Field, field_validator

from config.names import team_submitter_group
from config.settings.base import SettingsModel
from config.settings.infrastructure import IAM_PRINCIPAL_RE

# Kueue WorkloadPriorityClasses, lowest first: a higher value is admitted first and may preempt a
# lower one (Kueue docs, "Workload Priority Class"). Written once: the chart creates them, the
# settings and `raytrain job submit --priority` accept their names.
PRIORITIES: dict[str, int] = {"low": 100, "normal": 1000, "high": 10000}
DEFAULT_PRIORITY = "normal"
# The implicit team's name (no `teams:` section).
IMPLICIT_TEAM = "default"
# A team's name is its ClusterQueue's and LocalQueue's name and the suffix of its namespace
# (ray-<team>, a DNS-1123 label of at most 63) and of its IAM role's name: kept short.
TEAM_NAME_RE = re.compile(r"^[a-z]([a-z0-9-]{0,18}[a-z0-9])?$")
TEAM_NAMESPACE_PREFIX = "ray-"


class TeamSettings(SettingsModel):
    """One team: who submits, how many GPU nodes it is guaranteed, what it may borrow and lend."""

    # IAM roles/users that run `raytrain job --team <this team>`: a STANDARD access entry each, in
    # the team's Kubernetes group, bound to a Role in the team's namespace only.
    submitters: list[str] = Field(min_length=1)
    # Nominal quota in nodes of the GPU node group: Kueue reserves this many nodes' GPUs, EFA
    # interfaces, CPU and memory for the team (k8s/kueue.py turns nodes into resources).
    gpu_nodes: int = Field(ge=0)
    # GPU nodes beyond its quota the team may borrow while other teams leave theirs idle (Kueue
    # ClusterQueue borrowingLimit). Unset: as much as is idle; 0: never borrows.
    borrowing_limit_nodes: int | None = Field(default=None, ge=0)
    # Of its own quota, how much the others may borrow while it is idle (Kueue lendingLimit).
    # Unset: all of it; 0: lends nothing.
    lending_limit_nodes: int | None = Field(default=None, ge=0)
    # The priority of the team's jobs when `raytrain job submit` names none.
    default_priority: str = DEFAULT_PRIORITY

    @field_validator("submitters")
    @classmethod
    def _submitters(cls, arns: list[str]) -> list[str]:
        for arn in arns:
            if not IAM_PRINCIPAL_RE.match(arn):
                raise ValueError(
                    f"{arn!r} is not an IAM role or user ARN like arn:aws:iam::111122223333:role/Research"
                )
        if len(set(arns)) != len(arns):
            raise ValueError(f"principals repeat: {arns}")
        return arns

    @field_validator("default_priority")
    @classmethod
    def _priority(cls, value: str) -> str:
        problem = priority_problem(value)
        if problem:
            raise ValueError(problem)
        return value


def priority_problem(value: str) -> str | None:
    """Why `value` names no priority (None: it does)."""
    if value in PRIORITIES:
        return None
    return f"{value!r} is not a priority; valid: {', '.join(PRIORITIES)} (lowest first)"


def team_name_problem(name: str) -> str | None:
    if TEAM_NAME_RE.match(name):
        return None
    return (
        f"{name!r} cannot name a team: use 1-20 lowercase letters, digits and hyphens, starting with "
        "a letter and not ending with a hyphen (it names the team's queues, namespace and IAM role)"
    )


@dataclass(frozen=True)
class Team:
    """A team as the rest of the app uses it: names resolved, the implicit team included."""

    name: str
    namespace: str
    submitters: tuple[str, ...]
    gpu_nodes: int
    borrowing_limit_nodes: int | None
    lending_limit_nodes: int | None
    default_priority: str
    implicit: bool = False

    @property
    def queue(self) -> str:
        """Its LocalQueue (in its namespace) and ClusterQueue share the team's name."""
        return self.name

    @property
    def submitter_group(self) -> str:
        """The Kubernetes group its submitters' access entries map to (config/names.py)."""
        return team_submitter_group(self.name, implicit=self.implicit)

    def most_nodes(self, total: int) -> int:
        """The most GPU nodes the team can ever be given: its quota plus what it may borrow,
        never more than the node group holds."""
        borrow = total if self.borrowing_limit_nodes is None else self.borrowing_limit_nodes
        return min(total, self.gpu_nodes + borrow)


def queue_summary(team: Team, max_size: int, teams: int) -> str:
    """One line on the queue a job of `team` lands in and what it may borrow (raytrain plan, cost)."""
    borrow = (
        "any idle node" if team.borrowing_limit_nodes is None else f"{team.borrowing_limit_nodes} node(s)"
    )
    return (
        f"queue: the job lands in team {team.name}'s queue (quota {team.gpu_nodes} of {max_size} GPU "
        f"nodes, may borrow {borrow}, at most {team.most_nodes(max_size)}); {teams} team(s) share "
        "the GPU group"
    )


def team_namespace(name: str) -> str:
    return f"{TEAM_NAMESPACE_PREFIX}{name}"


def teams_of(settings: Any) -> tuple[Team, ...]:
    """The teams of a `Settings`, in file order; the implicit team where there is no section."""
    if not settings.teams:
        return (
            Team(
                name=IMPLICIT_TEAM,
                namespace=settings.workload.namespace,
                submitters=tuple(settings.cluster.job_submitter_principals),
                gpu_nodes=settings.gpu_nodes.max_size,
                borrowing_limit_nodes=None,
                lending_limit_nodes=None,
                default_priority=DEFAULT_PRIORITY,
                implicit=True,
            ),
        )
    return tuple(
        Team(
            name=name,
            namespace=team_namespace(name),
            submitters=tuple(team.submitters),
            gpu_nodes=team.gpu_nodes,
            borrowing_limit_nodes=team.borrowing_limit_nodes,
            lending_limit_nodes=team.lending_limit_nodes,
            default_priority=team.default_priority,
        )
        for name, team in settings.teams.items()
    )


Problem = tuple[tuple[str, ...], str]


def team_problem(settings: Any) -> Problem | None:
    """The first thing wrong with the teams against the rest of the file: (field path, message)."""
    teams: dict[str, TeamSettings] = settings.teams
    if not teams:
        return None
    problem = _section_problem(settings)
    if problem is not None:
        return problem
    seen: dict[str, str] = {}
    for name, team in teams.items():
        problem = _submitters_problem(settings, name, team, seen) or _limits_problem(settings, name, team)
        if problem is not None:
            return problem
    return _totals_problem(settings)


def _section_problem(settings: Any) -> Problem | None:
    if settings.cluster.job_submitter_principals:
        return (
            ("cluster", "job_submitter_principals"),
            "is set beside `teams:`: with teams, each team's submitters are listed under "
            "teams.<name>.submitters (they see and run only their team's jobs); move them there",
        )
    if settings.job.cluster != "own":
        return (
            ("job", "cluster"),
            "is 'standing', but with `teams:` every job goes through Kueue, which admits only RayJobs "
            "that bring their own cluster (a RayJob with a clusterSelector is not managed: "
            "kueue v0.19.2 pkg/controller/jobs/rayjob/rayjob_webhook.go); use job.cluster: own",
        )
    return None


def _submitters_problem(settings: Any, name: str, team: TeamSettings, seen: dict[str, str]) -> Problem | None:
    admins = set(settings.cluster.admin_principal_arns)
    for arn in team.submitters:
        if arn in admins:
            return (
                ("teams", name, "submitters"),
                f"{arn} is also in cluster.admin_principal_arns: an IAM principal has one access "
                "entry, and an admin already sees every team; list it once",
            )
        if arn in seen:
            return (
                ("teams", name, "submitters"),
                f"{arn} is a submitter of team {seen[arn]!r} too: an IAM principal has one access "
                "entry, so one Kubernetes group and one team; give each team its own role",
            )
        seen[arn] = name
    if team_namespace(name) == settings.workload.namespace:
        return (
            ("teams", name),
            f"its namespace {team_namespace(name)} is workload.namespace: rename the team or the namespace",
        )
    return None


def _limits_problem(settings: Any, name: str, team: TeamSettings) -> Problem | None:
    total = settings.gpu_nodes.max_size
    if team.lending_limit_nodes is not None and team.lending_limit_nodes > team.gpu_nodes:
        return (
            ("teams", name, "lending_limit_nodes"),
            f"{team.lending_limit_nodes} is more than the team's own quota (gpu_nodes: "
            f"{team.gpu_nodes}); it can lend at most {team.gpu_nodes}",
        )
    others = total - team.gpu_nodes
    if team.borrowing_limit_nodes is not None and team.borrowing_limit_nodes > others:
        return (
            ("teams", name, "borrowing_limit_nodes"),
            f"{team.borrowing_limit_nodes} is more than the other teams' quota could ever lend "
            f"(gpu_nodes.max_size {total} - its own {team.gpu_nodes} = {others}); set at most "
            f"{others}, or leave it unset to borrow whatever is idle",
        )
    if team.gpu_nodes == 0 and team.borrowing_limit_nodes == 0:
        return (
            ("teams", name, "gpu_nodes"),
            "is 0 and borrowing_limit_nodes is 0: the team could never run a job; give it a quota "
            "or let it borrow",
        )
    return None


def _totals_problem(settings: Any) -> Problem | None:
    teams: dict[str, TeamSettings] = settings.teams
    total = settings.gpu_nodes.max_size
    quota = sum(t.gpu_nodes for t in teams.values())
    if quota > total:
        shares = ", ".join(f"{n} {t.gpu_nodes}" for n, t in teams.items())
        return (
            ("teams",),
            f"the teams' gpu_nodes add up to {quota} ({shares}), more than the GPU node group can "
            f"ever hold (gpu_nodes.max_size {total}): a quota is a guarantee, so lower them to at most "
            f"{total} in all and let teams borrow idle nodes (borrowing_limit_nodes) instead",
        )
    first, *_ = teams_of(settings)
    if settings.job.deploy and settings.job.nodes > first.most_nodes(total):
        return (
            ("job", "nodes"),
            f"{settings.job.nodes}: the deployed job runs in the first team's queue ({first.name}), "
            f"which can be given at most {first.most_nodes(total)} nodes (gpu_nodes "
            f"{first.gpu_nodes} + what it may borrow); Kueue would never admit it",
        )
    return None

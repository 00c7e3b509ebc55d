"""Namespaced RBAC of the Ray namespace: what `raytrain job` may do, and what the Workload stack's
job drainer may do, each as a Role bound to the Kubernetes group an EKS access entry maps its IAM
principals to (config/names.py). Nothing cluster-wide: no node, no other namespace.

The rules are data (`SUBMITTER_RULES`, `DRAINER_RULES`) so tests can evaluate every request the
commands make against them (tests/test_submitter_rbac.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cdk8s_plus_27 import k8s as kube
from constructs import Construct

from config.names import JOB_DRAINER_GROUP, JOBS_ANCHOR
from config.settings import Settings

RBAC_GROUP = "rbac.authorization.k8s.io"
SUBMITTER_ROLE = "ray-train-job-submitter"
DRAINER_ROLE = "ray-train-job-drainer"


@dataclass(frozen=True)
class Rule:
    """One PolicyRule: (API group, resource or resource/subresource, verbs, resource names)."""

    api_group: str
    resource: str
    verbs: tuple[str, ...]
    names: tuple[str, ...] = field(default=())

    def to_json(self) -> kube.PolicyRule:
        return kube.PolicyRule(
            api_groups=[self.api_group],
            resources=[self.resource],
            verbs=list(self.verbs),
            resource_names=list(self.names) or None,
        )


# Every request `raytrain job` makes (raytrain/job/api.py, and the kubectl commands `job dashboard`
# runs or prints), and nothing else.
SUBMITTER_RULES = (
    # list/status/find: list and get; submit: create (dryRun=All first, then for real);
    # stop/delete: delete (foreground propagation).
    Rule("ray.io", "rayjobs", ("get", "list", "create", "delete")),
    # status/dashboard read a job's cluster; stop of a job ended from Ray suspends its workers.
    Rule("ray.io", "rayclusters", ("get", "patch")),
    # submit reads the jobs anchor's uid for the RayJob's ownerReference; only that ConfigMap.
    Rule("", "configmaps", ("get",), (JOBS_ANCHOR,)),
    # status/logs/dashboard list pods by label; `kubectl port-forward pod/NAME` reads the pod.
    Rule("", "pods", ("get", "list")),
    Rule("", "pods/log", ("get",)),
    # port-forward: SPDY upgrades with POST (create); WebSockets, kubectl's default since 1.31,
    # with GET (get), and since Kubernetes 1.35 the API server also checks `create` on that GET
    # (AuthorizePodWebsocketUpgradeCreatePermission, kubernetes/kubernetes#134577): both verbs.
    Rule("", "pods/portforward", ("get", "create")),
    # status: why pods wait (the scheduler's and the Cluster Autoscaler's events).
    Rule("", "events", ("list",)),
    # dashboard: the Ray token KubeRay keeps in a Secret named after each job's cluster (the names
    # are not known in advance, so no resourceNames). The namespace holds no other Secrets: service
    # account tokens are not created as Secrets since Kubernetes 1.24, and the Ray service account
    # mounts none (k8s/chart.py).
    Rule("", "secrets", ("get",)),
    # queue: the team's LocalQueue (quota in use) and Kueue's Workloads of its jobs (position, why
    # pending); both namespaced, so a team sees only its own (k8s/kueue.py).
    Rule("kueue.x-k8s.io", "localqueues", ("get",)),
    # stop: deactivates a running job's Workload (spec.active), so that it checkpoints on notice.
    Rule("kueue.x-k8s.io", "workloads", ("list", "patch")),
)

# The drainer (cdk_constructs/job_drain.py): delete the submitted RayJobs and watch them go.
DRAINER_RULES = (Rule("ray.io", "rayjobs", ("list", "delete")),)


def _role(chart: Construct, ns: str, name: str, group: str, rules: tuple[Rule, ...]) -> None:
    kube.KubeRole(
        chart,
        f"role-{name}",
        metadata=kube.ObjectMeta(name=name, namespace=ns),
        rules=[r.to_json() for r in rules],
    )
    kube.KubeRoleBinding(
        chart,
        f"binding-{name}",
        metadata=kube.ObjectMeta(name=name, namespace=ns),
        role_ref=kube.RoleRef(api_group=RBAC_GROUP, kind="Role", name=name),
        subjects=[kube.Subject(kind="Group", name=group, api_group=RBAC_GROUP)],
    )


def job_roles(chart: Construct, settings: Settings) -> None:
    """The submitters' and the drainer's Roles in the namespace of the settings' team
    (Settings.for_team), the submitters' bound to that team's group only: a team's submitters can
    do nothing in another team's namespace (no binding there names their group)."""
    ns = settings.workload.namespace
    _role(chart, ns, SUBMITTER_ROLE, settings.active_team.submitter_group, SUBMITTER_RULES)
    _role(chart, ns, DRAINER_ROLE, JOB_DRAINER_GROUP, DRAINER_RULES)

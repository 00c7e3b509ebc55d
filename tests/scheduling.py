"""Would a pod land on a node group? The kube-scheduler's filters that decide it, evaluated offline.

For a pod template and a node group (its labels, taints and allocatable), the filters the scheduler
runs that depend only on those (kubernetes.io docs: "Assigning Pods to Nodes", "Taints and
Tolerations", "Resource Management for Pods and Containers"; plugins NodeAffinity,
TaintToleration, NodeResourcesFit):

- every `nodeSelector` pair is a label of the node;
- `requiredDuringSchedulingIgnoredDuringExecution`: at least one nodeSelectorTerm whose every
  matchExpression holds (In, NotIn, Exists, DoesNotExist, Gt, Lt; NotIn and DoesNotExist hold
  for a missing label);
- every NoSchedule / NoExecute taint of the node is tolerated (PreferNoSchedule only scores).
  DaemonSet pods get the DaemonSet controller's own tolerations added (not-ready, unreachable,
  disk-/memory-/pid-pressure, unschedulable; network-unavailable with hostNetwork: "DaemonSet",
  section "Taints and tolerations");
- requests: per resource, max(sum over containers, largest init container) plus overhead; a
  container with limits and no requests requests its limits.

A reason is returned, naming the selector, expression or taint that keeps the pod away, so a
failing test says which agent cannot run where, and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from config.catalogue import Instance

# Labels kubelet and EKS put on every node of a managed node group, beside the group's own
# (kubernetes.io docs "Well-Known Labels, Annotations and Taints"; EKS User Guide, managed node
# groups: eks.amazonaws.com/nodegroup, eks.amazonaws.com/capacityType).
ARCH = {"x86_64": "amd64", "arm64": "arm64"}

# DaemonSet controller tolerations (pkg/controller/daemon/util, "DaemonSet" concept page).
_DAEMONSET_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]
_HOST_NETWORK_TOLERATION = {
    "key": "node.kubernetes.io/network-unavailable",
    "operator": "Exists",
    "effect": "NoSchedule",
}

# Custom resources the CloudWatch agent operator turns into DaemonSets.
_OPERATOR_DAEMONSETS = ("AmazonCloudWatchAgent", "DcgmExporter", "NeuronMonitor")

# EKS API's taint effects (AWS::EKS::Nodegroup Taints) as Kubernetes spells them.
EKS_TAINT_EFFECTS = {
    "NO_SCHEDULE": "NoSchedule",
    "NO_EXECUTE": "NoExecute",
    "PREFER_NO_SCHEDULE": "PreferNoSchedule",
}


@dataclass(frozen=True)
class Taint:
    key: str
    value: str | None
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value or ''}:{self.effect}"


@dataclass(frozen=True)
class NodeGroup:
    """What a node of a group offers the scheduler."""

    name: str
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    # cpu in cores, memory in bytes, extended resources and pods as counts.
    allocatable: dict[str, Decimal]


def node_group(
    name: str,
    instance: Instance,
    *,
    labels: dict[str, str],
    taints: list[dict[str, Any]],
    zone: str,
    capacity_type: str,
    gpu_resource: str,
    efa_resource: str,
    efa: bool,
) -> NodeGroup:
    """A node group as the synthesized AWS::EKS::Nodegroup (`Labels`, `Taints`) and the catalogue
    (allocatable CPU, memory, pods; GPUs and EFA interfaces once the device plugins advertise them)
    describe it, with the labels kubelet and EKS add."""
    all_labels = {
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": ARCH[instance.arch],
        "node.kubernetes.io/instance-type": instance.name,
        "topology.kubernetes.io/zone": zone,
        "eks.amazonaws.com/nodegroup": name,
        "eks.amazonaws.com/capacityType": capacity_type,
        **labels,
    }
    allocatable = {
        "cpu": Decimal(instance.allocatable_cpu_millis()) / 1000,
        "memory": Decimal(instance.allocatable_memory_mib()) * 1024 * 1024,
        "pods": Decimal(instance.max_pods),
    }
    if instance.gpus:
        allocatable[gpu_resource] = Decimal(instance.gpus)
    if efa and instance.efa:
        allocatable[efa_resource] = Decimal(instance.efa_interfaces)
    return NodeGroup(
        name,
        all_labels,
        tuple(Taint(t["Key"], t.get("Value"), EKS_TAINT_EFFECTS[t["Effect"]]) for t in taints),
        allocatable,
    )


@dataclass(frozen=True)
class PodTemplate:
    """A pod some object makes: `owner` names it in messages (kind, namespace/name, source)."""

    owner: str
    kind: str
    spec: dict[str, Any]
    replicas: int = 1
    extra_tolerations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tolerations(self) -> list[dict[str, Any]]:
        return list(self.spec.get("tolerations") or []) + self.extra_tolerations


def pod_templates(documents: list[dict[str, Any]], source: str, namespace: str = "-") -> list[PodTemplate]:
    """Every pod template of rendered objects: workloads (DaemonSet, Deployment, StatefulSet,
    Job), and a RayCluster's (or a RayJob's own cluster's) head and worker groups. `namespace`
    is the release's, which Helm gives objects whose template names none."""
    out: list[PodTemplate] = []
    for doc in documents:
        kind, meta = doc.get("kind"), doc.get("metadata") or {}
        where = f"{meta.get('namespace', namespace)}/{meta.get('name')}"
        spec = doc.get("spec") or {}
        if kind in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
            pod = spec["template"]["spec"]
            extra = []
            if kind == "DaemonSet":
                extra = list(_DAEMONSET_TOLERATIONS)
                if pod.get("hostNetwork"):
                    extra.append(_HOST_NETWORK_TOLERATION)
            out.append(
                PodTemplate(f"{kind} {where} ({source})", kind, pod, int(spec.get("replicas", 1)), extra)
            )
        elif kind in _OPERATOR_DAEMONSETS and spec.get("mode", "daemonset") == "daemonset":
            # The CloudWatch agent operator makes a DaemonSet of each from the custom resource's
            # own nodeSelector, affinity, tolerations and resources (CRDs of
            # aws/amazon-cloudwatch-agent-operator, as the observability chart renders them).
            pod = {k: spec[k] for k in ("nodeSelector", "affinity", "tolerations") if k in spec}
            pod["containers"] = [{"name": meta.get("name"), "resources": spec.get("resources") or {}}]
            if spec.get("hostNetwork"):
                pod["hostNetwork"] = True
            extra = list(_DAEMONSET_TOLERATIONS) + (
                [_HOST_NETWORK_TOLERATION] if spec.get("hostNetwork") else []
            )
            out.append(PodTemplate(f"DaemonSet {where} ({kind}, {source})", "DaemonSet", pod, 1, extra))
        elif kind in ("RayCluster", "RayJob"):
            cluster = spec if kind == "RayCluster" else spec.get("rayClusterSpec")
            if not cluster:
                continue
            head = cluster["headGroupSpec"]["template"]["spec"]
            out.append(PodTemplate(f"{kind} {where} head ({source})", "RayHead", head))
            for group in cluster.get("workerGroupSpecs") or []:
                out.append(
                    PodTemplate(
                        f"{kind} {where} worker group {group['groupName']} ({source})",
                        "RayWorker",
                        group["template"]["spec"],
                        int(group.get("replicas", 1)),
                    )
                )
    return out


# --- the filters ------------------------------------------------------------------------------------


def _expression_holds(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], list(expr.get("values") or [])
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present:
            return False
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    raise ValueError(f"unknown node selector operator {op!r} in {expr}")


def _show(expr: dict[str, Any]) -> str:
    values = expr.get("values")
    shown = f" {values}" if values and len(values) <= 4 else (f" [{len(values)} values]" if values else "")
    return f"{expr['key']} {expr['operator']}{shown}"


def _affinity_reason(pod: dict[str, Any], labels: dict[str, str]) -> str | None:
    required = ((pod.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return None
    failures = []
    for term in terms:
        if term.get("matchFields"):
            raise ValueError(f"matchFields (node names) cannot be evaluated for a node group: {term}")
        broken = [e for e in term.get("matchExpressions") or [] if not _expression_holds(e, labels)]
        if not broken:
            return None
        failures.append(" and ".join(_show(e) for e in broken))
    return "required node affinity: no term matches (" + "; ".join(failures) + ")"


def _tolerates(toleration: dict[str, Any], taint: Taint) -> bool:
    """Kubernetes' Toleration.ToleratesTaint: empty key with Exists tolerates every taint."""
    effect = toleration.get("effect")
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.key:
        return False
    if operator == "Exists":
        return True
    if not key:  # an empty key is only valid with Exists
        return False
    return (toleration.get("value") or "") == (taint.value or "")


def why_not(pod: PodTemplate, group: NodeGroup) -> str | None:
    """Why the pod cannot land on a node of the group (labels and taints); None when it can."""
    spec = pod.spec
    for key, value in (spec.get("nodeSelector") or {}).items():
        have = group.labels.get(key)
        if have != value:
            return (
                f"nodeSelector {key}={value} (the node has {key}={have})"
                if have
                else (f"nodeSelector {key}={value} (the node has no label {key})")
            )
    reason = _affinity_reason(spec, group.labels)
    if reason:
        return reason
    for taint in group.taints:
        if taint.effect == "PreferNoSchedule":
            continue
        if not any(_tolerates(t, taint) for t in pod.tolerations):
            return f"taint {taint} is not tolerated"
    return None


def _amount(resource: str, quantity: Any) -> Decimal:
    return Decimal(parse_quantity(str(quantity)))


def requests(pod: PodTemplate) -> dict[str, Decimal]:
    """The pod's effective requests (what NodeResourcesFit counts), per resource."""

    def of(container: dict[str, Any]) -> dict[str, Decimal]:
        resources = container.get("resources") or {}
        asked = dict(resources.get("limits") or {})  # limits without requests: requests = limits
        asked.update(resources.get("requests") or {})
        return {r: _amount(r, q) for r, q in asked.items()}

    total: dict[str, Decimal] = {}
    for container in pod.spec.get("containers") or []:
        for r, q in of(container).items():
            total[r] = total.get(r, Decimal(0)) + q
    for container in pod.spec.get("initContainers") or []:
        for r, q in of(container).items():
            total[r] = max(total.get(r, Decimal(0)), q)
    for r, q in (pod.spec.get("overhead") or {}).items():
        total[r] = total.get(r, Decimal(0)) + _amount(r, q)
    total["pods"] = Decimal(1)
    return total


def shortfall(group: NodeGroup, pods: list[PodTemplate]) -> list[str]:
    """Resources the pods together ask for beyond one node's allocatable, as lines."""
    asked: dict[str, Decimal] = {}
    for pod in pods:
        for r, q in requests(pod).items():
            asked[r] = asked.get(r, Decimal(0)) + q
    return [
        f"{r}: {show(r, asked[r])} asked, {show(r, group.allocatable.get(r, Decimal(0)))} allocatable "
        f"on {group.name}"
        for r in sorted(asked)
        if asked[r] > group.allocatable.get(r, Decimal(0))
    ]


def show(resource: str, amount: Decimal) -> str:
    """An amount as Kubernetes writes it: CPU in millicores, memory in MiB, counts as integers."""
    if resource == "cpu":
        return f"{int(amount * 1000)}m"
    if resource == "memory" or resource.startswith("hugepages-"):
        return f"{int(amount / 2**20)}Mi"
    return str(int(amount))

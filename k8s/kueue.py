"""Kueue's objects for the teams (config/settings/teams.py), in the v1beta2 API (served and stored
by v0.19; the only version v0.20 serves): ResourceFlavors from the node groups, a ClusterQueue per
team in one cohort, a LocalQueue in each team's namespace, the WorkloadPriorityClasses, the
ProvisioningRequest admission check that asks the Cluster Autoscaler for a job's GPU nodes before
the job is admitted, and, where the settings turn on topology-aware placement (`topology`, only
for GPU types with EC2 topology data), the Topology the GPU flavor names.

Plain dicts (the API's own field names): the cluster stack applies them after Kueue's chart, and
tests validate each against the CRD rendered from that chart (schema and CEL rules).

What Kueue counts: every pod set of a RayJob (kueue v0.19.2 pkg/controller/jobs/rayjob/
rayjob_controller.go PodSets): the head, each worker group, and in K8sJobMode the submitter. A
ClusterQueue must cover every resource those pods request, or the job is inadmissible. So the
quota has two flavors: `system` (the head and the submitter, on system nodes: CPU and memory) and
the GPU flavor (workers: GPUs, EFA interfaces, CPU and memory of whole nodes).
"""

from __future__ import annotations

from typing import Any

from config.names import (
    ACCELERATOR_LABEL,
    EFA_RESOURCE,
    GPU_NODE_LABELS,
    GPU_RESOURCE,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    PART_OF,
    PART_OF_LABEL,
    SUBMITTER_CPU_MILLIS,
    SUBMITTER_MEMORY_MIB,
    SYSTEM_NODE_LABELS,
    accelerator_label_value,
)
from config.settings import Settings
from config.settings.teams import PRIORITIES, Team
from config.topology import HOSTNAME_LABEL, layer_label, network_layers

API = "kueue.x-k8s.io/v1beta2"
COHORT = "ray-train"
SYSTEM_FLAVOR = "system"
# The label a RayJob carries to be queued (and managed at all: manageJobsWithoutQueueName is off).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# The admission check and its ProvisioningRequestConfig.
PROVISIONING_CHECK = "gpu-nodes"
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
# The Cluster Autoscaler's provisioning class that scales up (cluster-autoscaler/apis/
# provisioningrequest/autoscaling.x-k8s.io/v1/types.go, tag cluster-autoscaler-1.35.2):
# check-capacity.autoscaling.x-k8s.io only checks the nodes that exist, so with GPU groups at zero
# it never provisions; best-effort-atomic-scale-up.autoscaling.x-k8s.io runs the scale-up
# orchestrator all-or-nothing (provisioningrequest/besteffortatomic/provisioning_class.go:
# ScaleUp(..., allOrNothing=true)): it raises a group only if every pod of the request fits within
# the groups' max sizes, and reports Provisioned=true once the increase is requested. "Atomic" ends
# there on AWS: AwsNodeGroup.AtomicIncreaseSize returns ErrNotImplemented (cloudprovider/aws/
# aws_cloud_provider.go) and the executor falls back to a plain IncreaseSize (core/scaleup/
# orchestrator/executor.go increaseSize), one SetDesiredCapacity that EC2 may fill in part.
PROVISIONING_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"


def gpu_flavor_name(settings: Settings) -> str:
    """The GPU flavor is named after the node group's instance type (g6.12xlarge -> g6-12xlarge),
    with `-tas` when it carries a topology: a flavor's topologyName, node labels and tolerations
    cannot change once it has a topology (CRD transition rules: "topologyName is immutable when
    topologyName is set"), so turning placement on or off makes a new flavor instead."""
    name = settings.gpu_nodes.instance_type.replace(".", "-")
    return f"{name}-tas" if settings.topology.on else name


def topology_name(settings: Settings) -> str:
    """`aws-network-<layers>`: a Topology's levels cannot change (CRD: "field is immutable"), so a
    type with another number of layers gets another Topology."""
    return f"aws-network-{network_layers(settings.gpu_nodes.instance_type)}"


def topology(settings: Settings) -> dict[str, Any]:
    """Kueue's Topology of the GPU nodes: EKS's network-node-layer labels top-down (config/topology.py),
    then the host. With `kubernetes.io/hostname` lowest, Kueue assigns pods to nodes itself, which
    it needs to respect node taints and to replace a failed node ("Taints on nodes are only
    respected if this label is the lowest topology level", site/static/examples/tas/
    sample-gpu-queues.yaml; "Hot swap support", TAS concepts, v0.19.2)."""
    layers = network_layers(settings.gpu_nodes.instance_type)
    levels = [layer_label(i) for i in range(1, layers + 1)] + [HOSTNAME_LABEL]
    return {
        "apiVersion": API,
        "kind": "Topology",
        "metadata": _meta(topology_name(settings)),
        "spec": {"levels": [{"nodeLabel": label} for label in levels]},
    }


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {PART_OF_LABEL: PART_OF}}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def resource_flavors(settings: Settings) -> list[dict[str, Any]]:
    """A flavor per node group, with the labels the node group sets and, for the GPU group, its
    taint: Kueue assigns a pod set only to a flavor whose nodeLabels its node selector/affinity
    does not contradict and whose nodeTaints it tolerates, and then adds the flavor's nodeLabels
    to the pods' node selector (kueue v0.19.2 pkg/scheduler/flavorassigner/flavorassigner.go,
    checkFlavorForPodSets / flavorSelector; site docs concepts/cluster_queue "ResourceFlavor").
    The head (system node selector, no GPU toleration) can only be given `system`; the workers
    (GPU node selector and toleration) only the GPU flavor. No `tolerations` on the flavors: the
    pods already carry theirs (k8s/cluster.py), and a flavor's would be added to every pod of it."""
    gpu = settings.gpu_nodes.instance
    assert gpu.gpu_model is not None
    return [
        {
            "apiVersion": API,
            "kind": "ResourceFlavor",
            "metadata": _meta(SYSTEM_FLAVOR),
            "spec": {"nodeLabels": dict(SYSTEM_NODE_LABELS)},
        },
        {
            "apiVersion": API,
            "kind": "ResourceFlavor",
            "metadata": _meta(gpu_flavor_name(settings)),
            "spec": {
                # The labels of cdk_constructs/node_groups.py gpu_node_labels.
                "nodeLabels": {**GPU_NODE_LABELS, ACCELERATOR_LABEL: accelerator_label_value(gpu.gpu_model)},
                "nodeTaints": [{"key": GPU_TAINT_KEY, "value": GPU_TAINT_VALUE, "effect": "NoSchedule"}],
                # Topology-aware scheduling on this flavor (settings `topology`): Kueue then reads
                # the nodes' topology labels and places workers that ask for it.
                **({"topologyName": topology_name(settings)} if settings.topology.on else {}),
            },
        },
    ]


def covered_resources(settings: Settings) -> list[str]:
    resources = ["cpu", "memory", GPU_RESOURCE]
    if settings.gpu_nodes.efa:
        resources.append(EFA_RESOURCE)
    return resources


def node_resources(settings: Settings, nodes: int) -> dict[str, int]:
    """What `nodes` GPU workers request, by resource (k8s/cluster.py: one worker per node, with the
    node's GPUs, EFA interfaces, and its CPU and memory less the DaemonSets' headroom)."""
    gpu, work = settings.gpu_nodes.instance, settings.workload
    amounts = {
        "cpu": nodes * work.worker_cpu_millis(gpu),
        "memory": nodes * work.worker_memory_mib(gpu),
        GPU_RESOURCE: nodes * gpu.gpus,
    }
    if settings.gpu_nodes.efa:
        amounts[EFA_RESOURCE] = nodes * gpu.efa_interfaces
    return amounts


def _quantity(resource: str, amount: int) -> str | int:
    if resource == "cpu":
        return f"{amount}m"
    if resource == "memory":
        return f"{amount}Mi"
    return amount


def job_headroom(settings: Settings) -> dict[str, int]:
    """CPU (millicores) and memory (MiB) of one job's pods beside the workers: head and submitter."""
    work = settings.workload
    return {
        "cpu": work.head_cpu_millis + SUBMITTER_CPU_MILLIS,
        "memory": work.head_memory_mib + SUBMITTER_MEMORY_MIB,
    }


def _flavor_quota(
    name: str, resources: list[str], nominal: dict[str, int], *, borrow: dict[str, int] | None,
    lend: dict[str, int] | None,
) -> dict[str, Any]:  # fmt: skip
    quotas = []
    for resource in resources:
        quota: dict[str, Any] = {
            "name": resource,
            "nominalQuota": _quantity(resource, nominal.get(resource, 0)),
        }
        if borrow is not None:
            quota["borrowingLimit"] = _quantity(resource, borrow.get(resource, 0))
        if lend is not None:
            quota["lendingLimit"] = _quantity(resource, lend.get(resource, 0))
        quotas.append(quota)
    return {"name": name, "resources": quotas}


def cluster_queue(settings: Settings, team: Team) -> dict[str, Any]:
    """The team's ClusterQueue: its nominal quota of GPU nodes, what it may borrow and lend in the
    cohort, headroom on the system flavor for the heads and submitters of the most jobs it can run
    at once (one per GPU node it can be given), preemption by priority, and the provisioning check
    on the GPU flavor."""
    total = settings.gpu_nodes.max_size
    resources = covered_resources(settings)
    jobs = max(1, team.most_nodes(total))
    headroom = {k: v * jobs for k, v in job_headroom(settings).items()}
    borrow = (
        None if team.borrowing_limit_nodes is None else node_resources(settings, team.borrowing_limit_nodes)
    )
    lend = None if team.lending_limit_nodes is None else node_resources(settings, team.lending_limit_nodes)
    gpu_flavor = gpu_flavor_name(settings)
    return {
        "apiVersion": API,
        "kind": "ClusterQueue",
        "metadata": _meta(team.queue),
        "spec": {
            "cohortName": COHORT,
            # Only the team's own namespace may point a LocalQueue at it.
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": team.namespace}},
            # A job that does not fit now does not hold back smaller ones behind it.
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {
                    "coveredResources": resources,
                    "flavors": [
                        _flavor_quota(SYSTEM_FLAVOR, resources, headroom, borrow=None, lend=None),
                        _flavor_quota(
                            gpu_flavor,
                            resources,
                            node_resources(settings, team.gpu_nodes),
                            borrow=borrow,
                            lend=lend,
                        ),
                    ],
                }
            ],
            "preemption": {
                # Quota lent to others comes back: their borrowed jobs are preempted, whatever
                # their priority, when this team needs its own nominal quota.
                "reclaimWithinCohort": "Any",
                # Borrowing does not preempt other teams' jobs.
                "borrowWithinCohort": {"policy": "Never"},
                # Within the team, a higher priority job preempts lower ones.
                "withinClusterQueue": "LowerPriority",
            },
            "admissionChecksStrategy": {
                "admissionChecks": [{"name": PROVISIONING_CHECK, "onFlavors": [gpu_flavor]}]
            },
        },
    }


def local_queue(team: Team) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "LocalQueue",
        "metadata": _meta(team.queue, team.namespace),
        "spec": {"clusterQueue": team.queue},
    }


def priority_classes() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": API,
            "kind": "WorkloadPriorityClass",
            "metadata": _meta(name),
            "value": value,
            "description": (
                f"ray-train {name} priority: a higher one is admitted first and may preempt lower ones"
            ),
        }
        for name, value in PRIORITIES.items()
    ]


def provisioning_check() -> list[dict[str, Any]]:
    """The admission check: before Kueue admits a job, it creates a ProvisioningRequest for the job's
    GPU pods and waits for the Cluster Autoscaler to report it Provisioned (kueue v0.19.2
    pkg/controller/admissionchecks/provisioning/controller.go). Only GPUs are managed resources:
    the pods of a request are those asking for them (the workers), the head and submitter go to
    system nodes that exist. A request the autoscaler cannot satisfy is retried with backoff and
    the job requeued."""
    return [
        {
            "apiVersion": API,
            "kind": "ProvisioningRequestConfig",
            "metadata": _meta(PROVISIONING_CHECK),
            "spec": {
                "provisioningClassName": PROVISIONING_CLASS,
                "managedResources": [GPU_RESOURCE],
                "retryStrategy": {
                    "backoffLimitCount": 3,
                    "backoffBaseSeconds": 60,
                    "backoffMaxSeconds": 1800,
                },
            },
        },
        {
            "apiVersion": API,
            "kind": "AdmissionCheck",
            "metadata": _meta(PROVISIONING_CHECK),
            "spec": {
                "controllerName": PROVISIONING_CONTROLLER,
                "parameters": {
                    "apiGroup": "kueue.x-k8s.io",
                    "kind": "ProvisioningRequestConfig",
                    "name": PROVISIONING_CHECK,
                },
            },
        },
    ]


def cluster_objects(settings: Settings) -> list[dict[str, Any]]:
    """The cluster-scoped objects: the Topology (where placement is on), flavors, priorities, the
    provisioning check, a ClusterQueue per team."""
    return [
        *([topology(settings)] if settings.topology.on else []),
        *resource_flavors(settings),
        *priority_classes(),
        *provisioning_check(),
        *(cluster_queue(settings, team) for team in settings.team_list),
    ]


def queue_objects(settings: Settings) -> list[dict[str, Any]]:
    """Everything Kueue needs for the environment's teams, LocalQueues last (their namespaces and
    ClusterQueues first)."""
    return [*cluster_objects(settings), *(local_queue(team) for team in settings.team_list)]

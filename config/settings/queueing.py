"""What Kueue needs from the rest of the file: topology-aware placement, and the checks that tie the
queues to the node groups and the job (called from `config/settings/root.py`).

```yaml
topology:                 # Kueue topology-aware scheduling of a job's GPU workers (docs/teams.md)
  placement: preferred    # none (default) | preferred | required
  layer: 3                # network layer to keep the workers within; unset: the lowest one
```

Only for GPU node types that have EC2 instance-topology data (config/topology.py); refused by name
elsewhere (g6 has none).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from config.catalogue import CATALOGUE
from config.names import SUBMITTER_CPU_MILLIS, SUBMITTER_MEMORY_MIB
from config.settings.base import SettingsModel
from config.startup import PODS_READY_TIMEOUT_SECONDS, min_start_timeout_seconds
from config.topology import layer_label, network_layers, topology_types

Problem = tuple[tuple[str, ...], str]


class Placement(StrEnum):
    # No topology request: Kueue places the workers on any nodes of the GPU flavor.
    NONE = "none"
    # Kueue keeps the workers within one domain of `layer` if they fit there, else the next layer
    # up, else spread ("kueue.x-k8s.io/podset-preferred-topology", Kueue TAS concepts, v0.19.2).
    PREFERRED = "preferred"
    # All workers within one domain of `layer`, or the job is not admitted
    # ("kueue.x-k8s.io/podset-required-topology").
    REQUIRED = "required"


TOPOLOGY_ANNOTATIONS = {
    Placement.PREFERRED: "kueue.x-k8s.io/podset-preferred-topology",
    Placement.REQUIRED: "kueue.x-k8s.io/podset-required-topology",
}


class TopologySettings(SettingsModel):
    placement: Placement = Placement.NONE
    # 1 is the top of the network hierarchy (least selective), 3 the bottom on most types, 4 on
    # types with four layers (p6-b200, p6-b300). Unset: the type's lowest layer.
    layer: int | None = Field(default=None, ge=1, le=4)

    @property
    def on(self) -> bool:
        return self.placement is not Placement.NONE

    def level_label(self, instance_type: str) -> str:
        """The node label of the layer the workers are kept within."""
        return layer_label(self.layer or network_layers(instance_type))

    def worker_annotations(self, instance_type: str) -> dict[str, str]:
        """The worker pod template's annotations that ask Kueue for the placement (none: none).
        Kueue reads them per pod set from the RayJob's worker group template (Kueue TAS concepts,
        "User-facing APIs", v0.19.2)."""
        if not self.on:
            return {}
        return {TOPOLOGY_ANNOTATIONS[self.placement]: self.level_label(instance_type)}


def queueing_problem(settings: Any) -> Problem | None:
    """The first thing that keeps Kueue's queues from working with these node groups and job."""
    return (
        _start_budget_problem(settings) or _system_headroom_problem(settings) or _topology_problem(settings)
    )


def _start_budget_problem(settings: Any) -> Problem | None:
    job = settings.job
    if job.cluster != "own" or job.start_timeout_seconds >= min_start_timeout_seconds():
        return None
    return (
        ("job", "start_timeout_seconds"),
        f"{job.start_timeout_seconds} is not above Kueue's waitForPodsReady timeout "
        f"({PODS_READY_TIMEOUT_SECONDS} s, config/startup.py) plus a minute: the job would fail "
        f"instead of being requeued when its nodes start slowly; set at least {min_start_timeout_seconds()}",
    )


def jobs_at_once(settings: Any) -> int:
    """The most queued jobs that can run at once: each holds at least one GPU node (the head and
    submitter of each run on system nodes)."""
    return int(settings.gpu_nodes.max_size)


def heads_per_system_node(settings: Any) -> int:
    """How many jobs' head + submitter pairs one system node holds (allocatable CPU and memory)."""
    system = CATALOGUE[settings.system_nodes.instance_type]
    work = settings.workload
    by_cpu = system.allocatable_cpu_millis() // (work.head_cpu_millis + SUBMITTER_CPU_MILLIS)
    by_memory = system.allocatable_memory_mib() // (work.head_memory_mib + SUBMITTER_MEMORY_MIB)
    return int(min(by_cpu, by_memory))


def _system_headroom_problem(settings: Any) -> Problem | None:
    """Kueue counts each job's head and submitter on the `system` flavor (k8s/kueue.py): the system
    node group must be able to hold them for every job that can run at once, or admitted jobs
    wait on a pending head while holding their GPU nodes."""
    jobs = jobs_at_once(settings)
    per_node = heads_per_system_node(settings)
    system = settings.system_nodes
    need = -(-jobs // per_node) if per_node else None
    if need is not None and need <= system.max_size:
        return None
    work = settings.workload
    pair = (
        f"head {work.head_cpu_millis}m/{work.head_memory_mib} MiB + submitter "
        f"{SUBMITTER_CPU_MILLIS}m/{SUBMITTER_MEMORY_MIB} MiB"
    )
    fix = f"raise it to {need}" if need is not None else "use a larger system_nodes.instance_type"
    return (
        ("system_nodes", "max_size" if per_node else "instance_type"),
        f"{system.max_size} {system.instance_type} node(s) hold {per_node * system.max_size} job(s)' "
        f"Ray head and submitter ({pair}, {per_node} per node), but {jobs} jobs can run at once "
        f"(one per GPU node, gpu_nodes.max_size {jobs}); {fix}, or lower workload.head_cpu_millis / "
        "head_memory_mib",
    )


def _topology_problem(settings: Any) -> Problem | None:
    topology: TopologySettings = settings.topology
    if not topology.on and topology.layer is None:
        return None
    instance_type = settings.gpu_nodes.instance_type
    layers = network_layers(instance_type)
    if not layers:
        field = "placement" if topology.on else "layer"
        return (
            ("topology", field),
            f"is set, but {instance_type} has no EC2 instance-topology data, so its nodes carry no "
            "topology.k8s.aws/network-node-layer-* labels; topology-aware placement needs one of "
            f"{', '.join(topology_types())}; remove it (placement: none)",
        )
    if topology.layer is not None and topology.layer > layers:
        return (
            ("topology", "layer"),
            f"{topology.layer}: {instance_type} has {layers} network layers (1 = top to {layers} = "
            f"closest); set 1-{layers}",
        )
    if settings.job.cluster != "own":
        return (
            ("topology", "placement"),
            "needs job.cluster: own: only queued RayJobs (their own cluster) are placed by Kueue",
        )
    return None

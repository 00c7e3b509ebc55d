"""GPU nodes, their device plugins and their health agent (the node monitoring agent's DCGM host
engine and the AcceleratedHardwareReady condition auto-repair acts on)."""

from __future__ import annotations

from typing import Any

from config.names import (
    ACCELERATED_HARDWARE_CONDITION,
    CLOUDWATCH_NAMESPACE,
    DCGM_EXPORTER_IMAGE,
    DCGM_REMOTE_ENGINE_ENV,
    DCGM_REMOTE_ENGINE_FLAG,
    DCGM_SERVER,
    DCGM_SERVER_LABELS,
    DEVICE_PLUGIN_NAMESPACE,
    EFA_DEVICE_PLUGIN_CHART,
    EFA_RESOURCE,
    GPU_NODE_LABELS,
    GPU_NODE_ROLE,
    GPU_PRESENT_LABEL,
    GPU_RESOURCE,
    NODE_MONITORING_NAMESPACE,
    NODE_ROLE_LABEL,
    NVIDIA_DEVICE_PLUGIN_CHART,
)
from config.settings import Settings
from raytrain.verify.api import Api
from raytrain.verify.checks import (
    FAIL,
    INFO,
    INSTANCE_TYPE_LABEL,
    PASS,
    WARN,
    ZONE_LABEL,
    Check,
    _condition,
    _condition_detail,
    _find_daemonset,
    _labels,
    _name,
    _pod_ready,
    _quantity,
    _selector,
)


def _is_gpu_node(node: dict[str, Any], settings: Settings) -> bool:
    """A GPU node by role label, by instance type, or by a GPU in its capacity: a node that lost
    its label must still be found (and failed), not silently skipped."""
    labels = _labels(node)
    capacity = (node.get("status") or {}).get("capacity") or {}
    return (
        labels.get(NODE_ROLE_LABEL) == GPU_NODE_ROLE
        or labels.get(INSTANCE_TYPE_LABEL) in settings.gpu_nodes.types
        or _quantity(capacity.get(GPU_RESOURCE)) > 0
    )


def check_nodes(api: Api, settings: Settings, checks: list[Check]) -> list[dict[str, Any]]:
    gpu = settings.gpu_nodes
    itype = gpu.instance
    nodes = [n for n in api.nodes() if _is_gpu_node(n, settings)]
    ready = [n for n in nodes if _condition(n, "Ready") == "True"]
    want = gpu.min_size
    subject = f"{' | '.join(gpu.types)} × {len(nodes)} (min {gpu.min_size}, max {gpu.max_size}, autoscaled)"
    if not nodes and want == 0:
        # Scaled to zero between jobs, as intended: nothing to prove now.
        checks.append(
            Check(
                "GPU nodes",
                subject,
                INFO,
                f"none running (min_size 0): the Cluster Autoscaler starts {settings.job.nodes} when a "
                "RayJob's workers are pending; verify again while a job runs to check them",
            )
        )
    elif len(ready) < want:
        checks.append(
            Check(
                "GPU nodes",
                subject,
                FAIL,
                f"{len(ready)} ready of {len(nodes)} found; min_size is {want}",
            )
        )
    else:
        checks.append(Check("GPU nodes", subject, PASS, f"{len(ready)} ready"))

    for node in nodes:
        name = _name(node)
        labels = _labels(node)
        alloc = (node.get("status") or {}).get("allocatable") or {}
        problems: list[str] = []
        if _condition(node, "Ready") != "True":
            problems.append(f"not Ready (Ready={_condition(node, 'Ready')})")
        for key, value in GPU_NODE_LABELS.items():
            if labels.get(key) != value:
                problems.append(f"label {key}={value} missing (has {labels.get(key)!r})")
        if labels.get(INSTANCE_TYPE_LABEL) not in (None, *gpu.types):
            problems.append(
                f"instance type {labels[INSTANCE_TYPE_LABEL]}, settings say {' or '.join(gpu.types)}"
            )
        if labels.get(ZONE_LABEL) not in (None, gpu.availability_zone):
            problems.append(f"in {labels[ZONE_LABEL]}, settings pin {gpu.availability_zone}")
        gpus = _quantity(alloc.get(GPU_RESOURCE))
        if gpus != itype.gpus:
            problems.append(f"allocatable {GPU_RESOURCE} {gpus}, catalogue {itype.gpus}")
        efa = _quantity(alloc.get(EFA_RESOURCE))
        if gpu.efa and efa != itype.efa_interfaces:
            # The group's launch template's interfaces: of several types, the ones all have.
            problems.append(f"allocatable {EFA_RESOURCE} {efa}, catalogue {itype.efa_interfaces}")
        detail = "; ".join(problems) or (
            f"Ready; {GPU_RESOURCE} {gpus}" + (f", {EFA_RESOURCE} {efa}" if gpu.efa else "")
        )
        checks.append(Check("GPU node", name, FAIL if problems else PASS, detail))
    return nodes


def check_device_plugins(
    api: Api, settings: Settings, gpu_nodes: list[dict[str, Any]], checks: list[Check]
) -> None:
    daemonsets = api.daemonsets(DEVICE_PLUGIN_NAMESPACE) or []
    wanted = [("NVIDIA device plugin", NVIDIA_DEVICE_PLUGIN_CHART)]
    if settings.gpu_nodes.efa:
        wanted.append(("EFA device plugin", EFA_DEVICE_PLUGIN_CHART))
    node_names = sorted(_name(n) for n in gpu_nodes)
    for title, name in wanted:
        ds = _find_daemonset(daemonsets, name)
        if ds is None:
            checks.append(Check(title, f"{DEVICE_PLUGIN_NAMESPACE}/*{name}*", FAIL, "DaemonSet not found"))
            continue
        subject = f"{DEVICE_PLUGIN_NAMESPACE}/{_name(ds)}"
        pods = api.pods(DEVICE_PLUGIN_NAMESPACE, _selector(ds))
        ready_on = {(p.get("spec") or {}).get("nodeName") for p in pods if _pod_ready(p)}
        missing = [n for n in node_names if n not in ready_on]
        status = ds.get("status") or {}
        counts = f"{status.get('numberReady', 0)}/{status.get('desiredNumberScheduled', 0)} ready"
        if missing:
            checks.append(
                Check(
                    title,
                    subject,
                    FAIL,
                    f"no ready pod on {len(missing)} of {len(node_names)} GPU node(s): "
                    f"{', '.join(missing)} ({counts}; a node needs "
                    f"{GPU_PRESENT_LABEL}={GPU_NODE_LABELS[GPU_PRESENT_LABEL]} and the plugin's toleration)",
                )
            )
        else:
            checks.append(
                Check(title, subject, PASS, f"ready on all {len(node_names)} GPU node(s) ({counts})")
            )


def check_node_health(api: Api, gpu_nodes: list[dict[str, Any]], checks: list[Check]) -> None:
    """The node monitoring agent's GPU side on every GPU node: its DCGM host engine runs there,
    and the agent reports the node's accelerated hardware healthy. Auto-repair acts on a False
    AcceleratedHardwareReady (a DCGM engine that cannot be reached reads as a GPU fault)."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(DCGM_SERVER_LABELS.items()))
    pods = api.pods(NODE_MONITORING_NAMESPACE, selector)
    ready_on = {(p.get("spec") or {}).get("nodeName") for p in pods if _pod_ready(p)}
    names = sorted(_name(n) for n in gpu_nodes)
    missing = [n for n in names if n not in ready_on]
    subject = f"{NODE_MONITORING_NAMESPACE}/{DCGM_SERVER}"
    if missing:
        checks.append(
            Check(
                "DCGM host engine",
                subject,
                FAIL,
                f"no ready pod on {len(missing)} of {len(names)} GPU node(s): {', '.join(missing)} "
                "(the add-on's dcgmAgent.tolerations must tolerate the GPU taint); the agent reports "
                f"a DCGM error on {ACCELERATED_HARDWARE_CONDITION} and auto-repair replaces the node",
            )
        )
    else:
        checks.append(Check("DCGM host engine", subject, PASS, f"ready on all {len(names)} GPU node(s)"))
    for node in gpu_nodes:
        healthy = _condition(node, ACCELERATED_HARDWARE_CONDITION) == "True"
        checks.append(
            Check(
                "GPU health",
                _name(node),
                PASS if healthy else FAIL,
                _condition_detail(node, ACCELERATED_HARDWARE_CONDITION),
            )
        )


def _image_repository(image: str) -> str:
    """The last path segment of an image reference, without tag or digest."""
    return image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]


def remote_engine(container: dict[str, Any]) -> str | None:
    """The host engine a dcgm-exporter container is told to use, if any: its
    --remote-hostengine-info / -r flag (`--flag=value` or `--flag value`, urfave/cli) or that
    flag's environment variable (NVIDIA/dcgm-exporter pkg/cmd/app.go). None: an embedded engine."""
    flags = (f"--{DCGM_REMOTE_ENGINE_FLAG}", "-r")
    args = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in flags:
            if eq:
                return value
            if i + 1 < len(args):
                return args[i + 1]
    for env in container.get("env") or []:
        if env.get("name") == DCGM_REMOTE_ENGINE_ENV and env.get("value"):
            return str(env["value"])
    return None


def check_dcgm_engines(api: Api, gpu_nodes: list[dict[str, Any]], checks: list[Check]) -> None:
    """One DCGM host engine per GPU node: the CloudWatch add-on's dcgm-exporter must be a client of
    the node monitoring agent's `dcgm-server` (the stack points it there:
    cdk_constructs/dcgm_engine.py); without a remote engine it runs an embedded one beside
    dcgm-server, which NVIDIA does not support (NVIDIA/DCGM#108, NVIDIA/dcgm-exporter#7). A warning,
    not a failure: auto-repair's health checks use dcgm-server either way."""
    exporters: dict[str, tuple[str, str | None, bool]] = {}
    for pod in api.pods(CLOUDWATCH_NAMESPACE, ""):
        spec = pod.get("spec") or {}
        for container in spec.get("containers") or []:
            if _image_repository(str(container.get("image") or "")) != DCGM_EXPORTER_IMAGE:
                continue
            exporters[str(spec.get("nodeName"))] = (_name(pod), remote_engine(container), _pod_ready(pod))
    for node in gpu_nodes:
        found = exporters.get(_name(node))
        if found is None:
            continue  # no exporter on this node: dcgm-server is its only engine
        exporter, remote, ready = found
        subject = f"{CLOUDWATCH_NAMESPACE}/{exporter}"
        if remote and ready:
            detail = f"one: {DCGM_SERVER}; {subject} is its client at {remote}"
            checks.append(Check("DCGM engines", _name(node), PASS, detail))
        elif remote:
            checks.append(
                Check(
                    "DCGM engines",
                    _name(node),
                    WARN,
                    f"{subject} (client of the engine at {remote}) is not ready: no GPU metrics from "
                    f"this node; it exits when it cannot reach {DCGM_SERVER} there "
                    "(kubectl logs; docs/node-health.md)",
                )
            )
        else:
            checks.append(
                Check(
                    "DCGM engines",
                    _name(node),
                    WARN,
                    f"two: {DCGM_SERVER} and the embedded engine of {subject} (no "
                    f"--{DCGM_REMOTE_ENGINE_FLAG}; NVIDIA does not support two engines on one "
                    "machine, and only one can hold the profiling module); point it at dcgm-server "
                    "again with the patch in docs/node-health.md",
                )
            )

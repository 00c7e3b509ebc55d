"""`raytrain verify --env NAME`: check a deployed environment end to end, as a pipeline gate.

Reads the environment's settings and the instance catalogue, then asks the Kubernetes API (the
kubeconfig `aws eks update-kubeconfig` writes) whether what Kubernetes reports matches them:

- every GPU node is Ready, labelled `role=gpu-worker` and `nvidia.com/gpu.present=true`, and has
  allocatable `nvidia.com/gpu` and (EFA types) `vpc.amazonaws.com/efa` equal to the catalogue's
  counts; at least `gpu_nodes.min_size` of them exist (the Cluster Autoscaler adds the job's
  nodes while a RayJob runs and removes them after, so none between jobs is expected);
- the NVIDIA and EFA device-plugin DaemonSets have a ready pod on every GPU node (a node missing
  `nvidia.com/gpu.present=true` gets no NVIDIA plugin pod and so advertises no GPUs);
- with node monitoring on (observability.node_monitoring): a ready `dcgm-server` pod (the agent's
  DCGM host engine) on every GPU node, and every GPU node reports `AcceleratedHardwareReady` True
  (without the engine the agent reports a DCGM error there and auto-repair replaces the node);
- the KubeRay operator Deployment is available;
- the RayCluster is ready with the expected workers, GPUs and EFA requests; a RayJob's state.

Prints a table and exits 0 when every check passes, 1 when one fails, 2 when it cannot check at all
(bad settings, no kubeconfig, API unreachable or refusing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from config.loader import SettingsError, load_settings
from config.names import (
    ACCELERATED_HARDWARE_CONDITION,
    DCGM_SERVER,
    DCGM_SERVER_LABELS,
    DEVICE_PLUGIN_NAMESPACE,
    EFA_DEVICE_PLUGIN_CHART,
    EFA_RESOURCE,
    GPU_NODE_LABELS,
    GPU_NODE_ROLE,
    GPU_PRESENT_LABEL,
    GPU_RESOURCE,
    KUBERAY_NAMESPACE,
    KUBERAY_RELEASE,
    NODE_MONITORING_NAMESPACE,
    NODE_ROLE_LABEL,
    NVIDIA_DEVICE_PLUGIN_CHART,
    STANDING_CLUSTER_NAME,
)
from config.settings import ClusterMode, Settings

# The operator's Deployment is named after its Helm release (the chart's fullnameOverride is unset);
# each device plugin's DaemonSet after its release, which is its chart's name.
KUBERAY_OPERATOR_DEPLOYMENT = KUBERAY_RELEASE

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"
RAY_GROUP, RAY_VERSION = "ray.io", "v1"
REQUEST_TIMEOUT = (5, 30)  # connect, read (seconds)

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2

PASS, FAIL, WARN, INFO = "PASS", "FAIL", "WARN", "INFO"
_STYLE = {PASS: "green", FAIL: "bold red", WARN: "yellow", INFO: "cyan"}


class VerifyError(Exception):
    """Verification cannot run at all; `str()` is the message for the user."""


@dataclass
class Check:
    name: str
    subject: str
    result: str
    detail: str


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check a deployed environment: GPU/EFA nodes, device plugins, KubeRay, RayCluster",
        description=(__doc__ or "").split("\n\n", 1)[0],
    )
    parser.add_argument("--env", required=True, help="environment name (config/environments/NAME.yaml)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: the current context)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    console = console or Console()
    try:
        settings = load_settings(args.env)
    except SettingsError as exc:
        console.print(f"[bold red]settings:[/] {exc}", highlight=False, soft_wrap=True)
        return EXIT_UNUSABLE
    try:
        api = connect(args.kubeconfig, args.context, settings)
        checks = verify(api, settings)
    except VerifyError as exc:
        console.print(
            f"[bold red]cannot verify env {settings.name!r}:[/] {exc}", highlight=False, soft_wrap=True
        )
        return EXIT_UNUSABLE
    failed = [c for c in checks if c.result == FAIL]
    console.print(render(checks, settings))
    if failed:
        console.print(f"[bold red]{len(failed)} check(s) failed[/] for env {settings.name!r}")
        return EXIT_FAILED
    console.print(f"[green]all checks passed[/] for env {settings.name!r}")
    return EXIT_OK


def render(checks: list[Check], settings: Settings) -> Table:
    table = Table(title=f"raytrain verify: {settings.name} ({settings.cluster.name}, {settings.region})")
    for col in ("check", "object", "result", "detail"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(c.name, c.subject, f"[{_STYLE[c.result]}]{c.result}[/]", c.detail)
    return table


# --- talking to the API -------------------------------------------------------------------------


class Api:
    """The few reads verify needs, as plain dicts, through the official client."""

    def __init__(self, api_client: Any) -> None:
        # Imported where used: every `raytrain` command imports this module to register it.
        from kubernetes import client

        self._client = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.host = api_client.configuration.host

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call the API; None for 404; VerifyError for anything that makes checking impossible."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            # Raw JSON, not the client's models: those reject objects missing fields they declare
            # required (node systemInfo, …), which is the client's strictness, not the cluster's fault.
            resp = fn(*args, _request_timeout=REQUEST_TIMEOUT, _preload_content=False, **kwargs)
            out = json.loads(resp.data)
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status in (401, 403):
                raise VerifyError(
                    f"the API server at {self.host} refused {what} (HTTP {exc.status} {exc.reason}): "
                    "check your AWS credentials and that your IAM principal has an EKS access entry "
                    "(cluster.admin_principal_arns)"
                ) from None
            raise VerifyError(f"{what} failed at {self.host}: HTTP {exc.status} {exc.reason}") from None
        except (HTTPError, OSError, ValueError) as exc:
            raise VerifyError(
                f"cannot reach the Kubernetes API at {self.host} ({type(exc).__name__}: {exc}); "
                "is the cluster up, the endpoint reachable from here (cluster.public_access_cidrs), "
                "and the kubeconfig current (aws eks update-kubeconfig)?"
            ) from None
        if not isinstance(out, dict):
            raise VerifyError(f"{what}: the API at {self.host} answered {type(out).__name__}, not an object")
        return out

    def nodes(self) -> list[dict[str, Any]]:
        return self._call("listing nodes", self.core.list_node)["items"]

    def daemonsets(self, namespace: str) -> list[dict[str, Any]] | None:
        out = self._call(
            f"listing DaemonSets in {namespace}", self.apps.list_namespaced_daemon_set, namespace
        )
        return None if out is None else out["items"]

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        out = self._call(
            f"listing pods in {namespace}",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=selector,
        )
        return [] if out is None else out["items"]

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(
            f"reading Deployment {namespace}/{name}",
            self.apps.read_namespaced_deployment,
            name,
            namespace,
        )

    def ray_objects(self, namespace: str, plural: str) -> list[dict[str, Any]] | None:
        """None when the CRD is not installed (the API answers 404 for the resource)."""
        out = self._call(
            f"listing {plural} in {namespace}",
            self.custom.list_namespaced_custom_object,
            RAY_GROUP,
            RAY_VERSION,
            namespace,
            plural,
        )
        return None if out is None else out.get("items", [])


@contextlib.contextmanager
def _exec_plugin_errors() -> Iterator[list[str]]:
    """What the kubernetes client logs while it runs the kubeconfig's exec credential plugin.

    On a failed plugin (`aws eks get-token` without credentials exits 255) the client does not raise:
    `KubeConfigLoader._load_from_exec_plugin` (kubernetes/config/kube_config.py) calls
    `logging.error(...)` on the root logger, which with no handler configures logging and prints
    `ERROR:root:exec: ...`, and carries on without a token. A handler on the root logger for the
    load both collects those messages and keeps logging from configuring itself."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name == "root" and f"kubernetes{os.sep}config" in record.pathname:
                messages.append(record.getMessage())
            elif logging.lastResort is not None:  # anything else: shown as without this handler
                logging.lastResort.handle(record)

    root = logging.getLogger()
    handler = Collect(logging.WARNING)
    root.addHandler(handler)
    try:
        yield messages
    finally:
        root.removeHandler(handler)


def connect(kubeconfig: str | None, context: str | None, settings: Settings) -> Api:
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    hint = f"aws eks update-kubeconfig --name {settings.cluster.name} --region {settings.region}"
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
    shown = path or "~/.kube/config"
    if path is not None and not os.path.isfile(os.path.expanduser(path)):
        raise VerifyError(f"no kubeconfig at {shown}; write one with: {hint}")
    cfg = client.Configuration()
    try:
        with _exec_plugin_errors() as exec_errors:
            config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
    except ConfigException as exc:
        raise VerifyError(f"kubeconfig {shown}: {exc}; write one with: {hint}") from None
    except OSError as exc:  # e.g. the exec credential plugin (aws) is not installed
        raise VerifyError(f"kubeconfig {shown}: {exc}") from None
    if exec_errors:
        raise VerifyError(
            f"kubeconfig {shown}: its credential command failed ({' '.join(exec_errors[0].split())}); "
            f"it needs AWS credentials for account {settings.account}: `aws sso login --profile NAME` "
            "and export AWS_PROFILE=NAME (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
        )
    # One retry: a gate should fail in seconds when the endpoint is closed, not after minutes.
    cfg.retries = 1
    # urllib3 logs a warning before that retry; the failure, if it comes, is reported in one line.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    return Api(client.ApiClient(cfg))


# --- the checks ---------------------------------------------------------------------------------


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", "?"))


def _condition(obj: dict[str, Any], kind: str) -> str | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def _quantity(value: Any) -> int:
    """Extended resources (GPUs, EFA) are whole numbers; absent means 0."""
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        return 0


def verify(api: Api, settings: Settings) -> list[Check]:
    checks: list[Check] = []
    gpu_nodes = check_nodes(api, settings, checks)
    check_device_plugins(api, settings, gpu_nodes, checks)
    if settings.observability.node_monitoring:
        check_node_health(api, gpu_nodes, checks)
    check_operator(api, checks)
    check_ray(api, settings, checks)
    return checks


def _is_gpu_node(node: dict[str, Any], settings: Settings) -> bool:
    """A GPU node by role label, by instance type, or by a GPU in its capacity: a node that lost
    its label must still be found (and failed), not silently skipped."""
    labels = _labels(node)
    capacity = (node.get("status") or {}).get("capacity") or {}
    return (
        labels.get(NODE_ROLE_LABEL) == GPU_NODE_ROLE
        or labels.get(INSTANCE_TYPE_LABEL) == settings.gpu_nodes.instance_type
        or _quantity(capacity.get(GPU_RESOURCE)) > 0
    )


def check_nodes(api: Api, settings: Settings, checks: list[Check]) -> list[dict[str, Any]]:
    gpu = settings.gpu_nodes
    itype = gpu.instance
    nodes = [n for n in api.nodes() if _is_gpu_node(n, settings)]
    ready = [n for n in nodes if _condition(n, "Ready") == "True"]
    want = gpu.min_size
    subject = f"{gpu.instance_type} × {len(nodes)} (min {gpu.min_size}, max {gpu.max_size}, autoscaled)"
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
        if labels.get(INSTANCE_TYPE_LABEL) not in (None, gpu.instance_type):
            problems.append(f"instance type {labels[INSTANCE_TYPE_LABEL]}, settings say {gpu.instance_type}")
        if labels.get(ZONE_LABEL) not in (None, gpu.availability_zone):
            problems.append(f"in {labels[ZONE_LABEL]}, settings pin {gpu.availability_zone}")
        gpus = _quantity(alloc.get(GPU_RESOURCE))
        if gpus != itype.gpus:
            problems.append(f"allocatable {GPU_RESOURCE} {gpus}, catalogue {itype.gpus}")
        efa = _quantity(alloc.get(EFA_RESOURCE))
        if gpu.efa and efa != itype.efa_interfaces:
            problems.append(f"allocatable {EFA_RESOURCE} {efa}, catalogue {itype.efa_interfaces}")
        detail = "; ".join(problems) or (
            f"Ready; {GPU_RESOURCE} {gpus}" + (f", {EFA_RESOURCE} {efa}" if gpu.efa else "")
        )
        checks.append(Check("GPU node", name, FAIL if problems else PASS, detail))
    return nodes


def _selector(ds: dict[str, Any]) -> str:
    match = ((ds.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(match.items()))


def _find_daemonset(daemonsets: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The plugin's own DaemonSet, by name or app label (not the chart's MPS/GFD helpers)."""
    found = [
        ds
        for ds in daemonsets
        if (name in _name(ds) or name in _labels(ds).get("app.kubernetes.io/name", ""))
        and not any(x in _name(ds) for x in ("mps", "feature-discovery"))
    ]
    return min(found, key=lambda ds: len(_name(ds))) if found else None


def _pod_ready(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and _condition(pod, "Ready") == "True"


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


def _condition_detail(obj: dict[str, Any], kind: str) -> str:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            why = ": ".join(str(cond[k]) for k in ("reason", "message") if cond.get(k))
            return f"{kind}={cond.get('status')}" + (f" ({why})" if why else "")
    return f"{kind} not reported"


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


def check_operator(api: Api, checks: list[Check]) -> None:
    subject = f"{KUBERAY_NAMESPACE}/{KUBERAY_OPERATOR_DEPLOYMENT}"
    dep = api.deployment(KUBERAY_NAMESPACE, KUBERAY_OPERATOR_DEPLOYMENT)
    if dep is None:
        checks.append(Check("KubeRay operator", subject, FAIL, "Deployment not found"))
        return
    status = dep.get("status") or {}
    available = _condition(dep, "Available") == "True" and (status.get("availableReplicas") or 0) >= 1
    pod_spec = ((dep.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers: list[dict[str, Any]] = pod_spec.get("containers") or []
    detail = f"available {status.get('availableReplicas') or 0}/{status.get('replicas') or 0}"
    if containers and containers[0].get("image"):
        detail += f"; {containers[0]['image']}"
    checks.append(Check("KubeRay operator", subject, PASS if available else FAIL, detail))


def _worker_groups(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    return list(((cluster.get("spec") or {}).get("workerGroupSpecs")) or [])


def _container_limits(group: dict[str, Any]) -> dict[str, Any]:
    containers = (((group.get("template") or {}).get("spec") or {}).get("containers")) or [{}]
    resources = containers[0].get("resources") or {}
    return resources.get("limits") or resources.get("requests") or {}


def check_ray(api: Api, settings: Settings, checks: list[Check]) -> None:
    ns = settings.workload.namespace
    clusters = api.ray_objects(ns, "rayclusters")
    jobs = api.ray_objects(ns, "rayjobs")
    if clusters is None:
        checks.append(Check("RayCluster", f"{ns}/*", FAIL, "RayCluster CRD (ray.io/v1) not installed"))
        return
    standing = settings.job.cluster is ClusterMode.STANDING
    names = {_name(c) for c in clusters}
    if standing and STANDING_CLUSTER_NAME not in names:
        checks.append(
            Check(
                "RayCluster",
                f"{ns}/{STANDING_CLUSTER_NAME}",
                FAIL,
                f"not found (job.cluster is standing); present: {', '.join(sorted(names)) or 'none'}",
            )
        )
    if not clusters and not standing:
        checks.append(
            Check(
                "RayCluster",
                f"{ns}/*",
                INFO,
                "none running: job.cluster is 'own', so each RayJob brings its cluster",
            )
        )
    want_gpus = settings.num_workers
    for cluster in sorted(clusters, key=_name):
        checks.append(_check_cluster(cluster, ns, settings, want_gpus))
    by_name = {_name(c): c for c in clusters}
    for job in sorted(jobs or [], key=_name):
        status = job.get("status") or {}
        deploy, state = status.get("jobDeploymentStatus"), status.get("jobStatus")
        failed = deploy == "Failed" or state == "FAILED"
        detail = f"deployment {deploy or '-'}, job {state or '-'}"
        if status.get("message"):
            detail += f": {status['message']}"
        held = by_name.get(status.get("rayClusterName") or "")
        if state == "STOPPED" and not standing and held is not None and not workers_released(held):
            # Stopped from Ray (`ray job stop`, the dashboard): KubeRay 1.7's deletion rules can name
            # only SUCCEEDED, FAILED and deployment Failed (RayJob CRD), so nothing frees this
            # job's cluster: its GPU nodes stay until the RayJob is deleted.
            failed = True
            detail += (
                f"; stopped from Ray, its cluster {_name(held)} still holds its GPU workers (no "
                f"deletion rule fires for STOPPED): kubectl -n {ns} delete rayjob {_name(job)}"
            )
        checks.append(Check("RayJob", f"{ns}/{_name(job)}", FAIL if failed else INFO, detail))
    if jobs is not None and not jobs:
        checks.append(Check("RayJob", f"{ns}/*", INFO, "none"))


def workers_released(cluster: dict[str, Any]) -> bool:
    """Every worker group is suspended: the job's deletion rule has deleted the GPU workers and
    the head stays for inspection (k8s/job.py). KubeRay sets `suspend` on worker groups only for a
    RayJob's DeleteWorkers ("not a user-facing API and is only used by RayJob DeletionStrategy",
    RayCluster CRD, v1.7.0)."""
    groups = _worker_groups(cluster)
    return bool(groups) and all(g.get("suspend") is True for g in groups)


def _check_cluster(cluster: dict[str, Any], ns: str, settings: Settings, want_gpus: int) -> Check:
    gpu = settings.gpu_nodes
    status = cluster.get("status") or {}
    groups = _worker_groups(cluster)
    if workers_released(cluster):
        head = "head pod ready" if _condition(cluster, "HeadPodReady") == "True" else "head pod not ready"
        return Check(
            "RayCluster",
            f"{ns}/{_name(cluster)}",
            INFO,
            f"its job has ended: GPU workers released, {head}; the cluster goes after "
            f"job.ttl_seconds_after_finished ({settings.job.ttl_seconds_after_finished} s)",
        )
    replicas = sum(int(g.get("replicas") or 0) for g in groups)
    ready_workers = int(status.get("readyWorkerReplicas") or 0)
    problems: list[str] = []
    state = status.get("state")
    provisioned = _condition(cluster, "RayClusterProvisioned")
    # KubeRay >= 1.2 reports conditions; `state` is kept for older operators.
    if not (provisioned == "True" or (provisioned is None and state == "ready")):
        problems.append(f"not ready (state {state or '-'}, RayClusterProvisioned {provisioned or '-'})")
    if _condition(cluster, "HeadPodReady") == "False":
        problems.append("head pod not ready")
    if ready_workers < replicas:
        problems.append(f"{ready_workers}/{replicas} workers ready")
    spec_gpus = 0
    for g in groups:
        limits = _container_limits(g)
        per_pod = _quantity(limits.get(GPU_RESOURCE))
        spec_gpus += per_pod * int(g.get("replicas") or 0)
        efa = _quantity(limits.get(EFA_RESOURCE))
        if gpu.efa and per_pod and efa < 1:
            problems.append(
                f"worker group {g.get('groupName')!r} requests no {EFA_RESOURCE}: its pods get no "
                "EFA device and NCCL falls back to TCP sockets"
            )
    if spec_gpus != want_gpus:
        problems.append(
            f"workers request {spec_gpus} GPUs, the job has {want_gpus} "
            f"(job.nodes {settings.job.nodes} × {gpu.instance.gpus})"
        )
    detail = "; ".join(problems) or f"ready; {ready_workers}/{replicas} workers, {spec_gpus} GPUs"
    return Check("RayCluster", f"{ns}/{_name(cluster)}", FAIL if problems else PASS, detail)

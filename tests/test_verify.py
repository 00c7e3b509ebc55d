"""`raytrain verify` against a fake Kubernetes API server on 127.0.0.1.

The official client does the real work (kubeconfig, URLs, query strings, JSON decoding into its
models); the server answers the paths it calls with objects shaped like an EKS cluster's.
"""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from rich.console import Console

from config.loader import load_settings
from config.settings import ClusterMode, Settings
from raytrain import cli, verify

ENV = "dev"


# --- a recorded cluster, built from the environment's own settings --------------------------------


def _node(name: str, settings: Settings, *, gpu_node: bool) -> dict[str, Any]:
    gpu = settings.gpu_nodes
    itype = gpu.instance if gpu_node else settings.system_nodes.instance_type
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": gpu.instance_type if gpu_node else itype,
        "topology.kubernetes.io/zone": gpu.availability_zone if gpu_node else "us-west-2a",
        "eks.amazonaws.com/nodegroup": "gpu" if gpu_node else "system",
    }
    alloc = {"cpu": "47810m", "memory": "183000000Ki", "pods": "234", "ephemeral-storage": "190Gi"}
    conditions = [
        {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
        {"type": "Ready", "status": "True", "reason": "KubeletReady"},
    ]
    if gpu_node:
        # What the node monitoring agent sets on a healthy GPU node.
        conditions.append(
            {
                "type": "AcceleratedHardwareReady",
                "status": "True",
                "reason": "NvidiaAcceleratedHardwareIsReady",
                "message": "Monitoring for the Nvidia AcceleratedHardware system is active",
            }
        )
        labels |= {"role": "gpu-worker", "nvidia.com/gpu.present": "true"}
        alloc |= {"nvidia.com/gpu": str(gpu.instance.gpus)}
        if gpu.efa:
            alloc |= {"vpc.amazonaws.com/efa": str(gpu.instance.efa_interfaces)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "uid": f"uid-{name}"},
        "spec": {
            "providerID": f"aws:///{labels['topology.kubernetes.io/zone']}/i-0{abs(hash(name)) % 10**16:016d}"
        },
        "status": {
            "capacity": dict(alloc),
            "allocatable": alloc,
            "conditions": conditions,
            "nodeInfo": {
                "kubeletVersion": "v1.35.2-eks-1a2b3c4",
                "containerRuntimeVersion": "containerd://2.1.4",
            },
        },
    }


def _daemonset(name: str, match: dict[str, str], ready: int, desired: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "kube-system", "labels": dict(match)},
        "spec": {
            "selector": {"matchLabels": match},
            "template": {
                "metadata": {"labels": match},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            },
        },
        "status": {
            "currentNumberScheduled": desired,
            "desiredNumberScheduled": desired,
            "numberMisscheduled": 0,
            "numberReady": ready,
        },
    }


def _pod(name: str, node: str, labels: dict[str, str], ready: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "kube-system", "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


NVIDIA_LABELS = {
    "app.kubernetes.io/name": "nvidia-device-plugin",
    "app.kubernetes.io/instance": "nvidia-device-plugin",
}
EFA_LABELS = {"name": "aws-efa-k8s-device-plugin"}
# The node monitoring agent's DCGM host engine (its chart's templates/dcgm-daemonset.yaml).
DCGM_LABELS = {"k8s-app": "dcgm-server", "version": "v1"}


def _ray_cluster(
    settings: Settings, name: str, ready_workers: int, efa_request: bool = True
) -> dict[str, Any]:
    gpu = settings.gpu_nodes
    limits: dict[str, Any] = {"cpu": "44", "memory": "170Gi", "nvidia.com/gpu": gpu.instance.gpus}
    if efa_request and gpu.efa:
        limits["vpc.amazonaws.com/efa"] = gpu.instance.efa_interfaces
    n = settings.job.nodes
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name, "namespace": settings.workload.namespace},
        "spec": {
            "rayVersion": settings.workload.ray_version,
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "ray-head"}]}},
            },
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "replicas": n,
                    "minReplicas": n,
                    "maxReplicas": n,
                    "rayStartParams": {"num-gpus": str(gpu.instance.gpus)},
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "ray-worker", "resources": {"limits": limits, "requests": limits}}
                            ]
                        }
                    },
                }
            ],
        },
        "status": {
            "state": "ready",
            "readyWorkerReplicas": ready_workers,
            "availableWorkerReplicas": ready_workers,
            "desiredWorkerReplicas": n,
            "conditions": [
                {"type": "HeadPodReady", "status": "True", "reason": "HeadPodRunningAndReady"},
                {
                    "type": "RayClusterProvisioned",
                    "status": "True" if ready_workers >= n else "False",
                    "reason": "AllPodRunningAndReadyFirstTime",
                },
            ],
        },
    }


def healthy_cluster(settings: Settings, gpu_nodes: int | None = None) -> dict[str, Any]:
    """A cluster running a job: the job's GPU nodes (or `gpu_nodes` of them) up and healthy."""
    count = settings.job.nodes if gpu_nodes is None else gpu_nodes
    gpu_names = [f"ip-10-0-1{i}-{20 + i}.us-west-2.compute.internal" for i in range(count)]
    nodes = [_node("ip-10-0-0-11.us-west-2.compute.internal", settings, gpu_node=False)]
    nodes += [_node(n, settings, gpu_node=True) for n in gpu_names]
    pods = [_pod(f"nvidia-device-plugin-{i}", n, NVIDIA_LABELS) for i, n in enumerate(gpu_names)]
    pods += [_pod(f"aws-efa-k8s-device-plugin-{i}", n, EFA_LABELS) for i, n in enumerate(gpu_names)]
    pods += [_pod(f"dcgm-server-{i}", n, DCGM_LABELS) for i, n in enumerate(gpu_names)]
    pods += [_pod("aws-node-x", nodes[0]["metadata"]["name"], {"k8s-app": "aws-node"})]
    k = len(gpu_names)
    daemonsets = [
        _daemonset("aws-node", {"k8s-app": "aws-node"}, k + 1, k + 1),
        _daemonset(
            "nvidia-device-plugin-mps-control-daemon",
            {"app.kubernetes.io/name": "nvidia-device-plugin", "mps": "1"},
            0,
            0,
        ),
        _daemonset("nvidia-device-plugin", NVIDIA_LABELS, k, k),
        _daemonset("aws-efa-k8s-device-plugin", EFA_LABELS, k, k),
        _daemonset("dcgm-server", DCGM_LABELS, k, k),
    ]
    operator = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "kuberay-operator", "namespace": "kuberay-system"},
        "spec": {
            "replicas": 1,
            "template": {
                "spec": {
                    "containers": [{"name": "kuberay-operator", "image": "quay.io/kuberay/operator:v1.7.0"}]
                }
            },
        },
        "status": {
            "replicas": 1,
            "availableReplicas": 1,
            "readyReplicas": 1,
            "conditions": [{"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"}],
        },
    }
    ns = settings.workload.namespace
    cluster = _ray_cluster(settings, "qwen25-fsdp2-5f3a9c-raycluster-8kq2x", settings.job.nodes)
    cluster["metadata"]["ownerReferences"] = [
        {"kind": "RayJob", "name": "qwen25-fsdp2-5f3a9c", "apiVersion": "ray.io/v1", "uid": "u"}
    ]
    job = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "qwen25-fsdp2-5f3a9c", "namespace": ns},
        "spec": {"entrypoint": "python -m training"},
        "status": {
            "jobDeploymentStatus": "Running",
            "jobStatus": "RUNNING",
            "rayClusterName": cluster["metadata"]["name"],
        },
    }
    return {
        "/api/v1/nodes": _list("NodeList", "v1", nodes),
        "/apis/apps/v1/namespaces/kube-system/daemonsets": _list("DaemonSetList", "apps/v1", daemonsets),
        "/api/v1/namespaces/kube-system/pods": _list("PodList", "v1", pods),
        "/apis/apps/v1/namespaces/kuberay-system/deployments/kuberay-operator": operator,
        f"/apis/ray.io/v1/namespaces/{ns}/rayclusters": _list("RayClusterList", "ray.io/v1", [cluster]),
        f"/apis/ray.io/v1/namespaces/{ns}/rayjobs": _list("RayJobList", "ray.io/v1", [job]),
    }


def _list(kind: str, api_version: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": "4242"}, "items": items}


# --- the fake API server ------------------------------------------------------------------------


class FakeApi(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes: dict[str, Any] = {}
        self.requests: list[str] = []
        self.auth: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeApi

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urlparse(self.path)
        self.server.requests.append(self.path)
        self.server.auth.append(self.headers.get("Authorization"))
        body = self.server.routes.get(url.path)
        if body is None:
            self._send(
                404,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": "NotFound",
                    "code": 404,
                },
            )
            return
        body = copy.deepcopy(body)
        selector = parse_qs(url.query).get("labelSelector", [""])[0]
        if selector and "items" in body:
            want = dict(part.split("=", 1) for part in selector.split(","))
            body["items"] = [
                i
                for i in body["items"]
                if all(i["metadata"].get("labels", {}).get(k) == v for k, v in want.items())
            ]
        self._send(200, body)

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def api_server(serve_kube_api: Callable[[FakeApi], FakeApi]) -> FakeApi:
    return serve_kube_api(FakeApi())


@pytest.fixture
def settings() -> Settings:
    return load_settings(ENV)


def run_verify(tmp_path: Path, server: FakeApi, *extra: str) -> tuple[int, str]:
    kubeconfig = server.kubeconfig
    console = Console(record=True, width=250, force_terminal=False)
    parser = cli.build_parser()
    args = parser.parse_args(["verify", "--env", ENV, "--kubeconfig", str(kubeconfig), *extra])
    rc = verify.run(args, console=console)
    return rc, console.export_text()


def rows(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip("│ ").startswith(name)]


# --- the cases ----------------------------------------------------------------------------------


def test_registered_in_the_cli() -> None:
    assert "raytrain.verify" in cli.COMMAND_MODULES
    args = cli.build_parser().parse_args(["verify", "--env", "dev", "--context", "c"])
    assert args.func is verify.run and args.context == "c" and args.kubeconfig is None


def test_healthy_cluster_passes(tmp_path: Path, api_server: FakeApi, settings: Settings) -> None:
    api_server.routes = healthy_cluster(settings)
    rc, text = run_verify(tmp_path, api_server)
    assert rc == 0, text
    assert "all checks passed" in text and "FAIL" not in text
    gpu_rows = rows(text, "GPU node ")
    assert len(gpu_rows) == settings.job.nodes
    assert all("PASS" in r and f"nvidia.com/gpu {settings.gpu_nodes.instance.gpus}" in r for r in gpu_rows)
    assert "kube-system/nvidia-device-plugin " in text  # the plugin, not its MPS helper DaemonSet
    assert "kuberay-system/kuberay-operator" in text
    assert "deployment Running, job RUNNING" in text
    # The real client made the calls, with the kubeconfig's token and the plugins' pod selectors.
    assert set(api_server.auth) == {"Bearer test-token"}
    assert any("labelSelector=name%3Daws-efa-k8s-device-plugin" in r for r in api_server.requests)


def test_missing_efa_fails(tmp_path: Path, api_server: FakeApi, settings: Settings) -> None:
    routes = healthy_cluster(settings)
    for node in routes["/api/v1/nodes"]["items"]:
        if "nvidia.com/gpu" in node["status"]["allocatable"]:
            node["status"]["allocatable"]["vpc.amazonaws.com/efa"] = "0"
    api_server.routes = routes
    rc, text = run_verify(tmp_path, api_server)
    assert rc == 1, text
    want = settings.gpu_nodes.instance.efa_interfaces
    gpu_rows = rows(text, "GPU node ")
    assert gpu_rows and all(
        "FAIL" in r and f"vpc.amazonaws.com/efa 0, catalogue {want}" in r for r in gpu_rows
    )
    assert "check(s) failed" in text


def test_missing_label_fails_node_and_device_plugin(
    tmp_path: Path, api_server: FakeApi, settings: Settings
) -> None:
    routes = healthy_cluster(settings)
    gpu_nodes = [n for n in routes["/api/v1/nodes"]["items"] if "role" in n["metadata"]["labels"]]
    victim = gpu_nodes[0]
    name = victim["metadata"]["name"]
    # Without nvidia.com/gpu.present the NVIDIA plugin schedules no pod there, so no GPUs either.
    del victim["metadata"]["labels"]["nvidia.com/gpu.present"]
    victim["status"]["allocatable"].pop("nvidia.com/gpu")
    victim["status"]["capacity"].pop("nvidia.com/gpu")
    pods = routes["/api/v1/namespaces/kube-system/pods"]["items"]
    routes["/api/v1/namespaces/kube-system/pods"]["items"] = [
        p for p in pods if not (p["spec"]["nodeName"] == name and p["metadata"]["name"].startswith("nvidia"))
    ]
    api_server.routes = routes
    rc, text = run_verify(tmp_path, api_server)
    assert rc == 1, text
    (row,) = [r for r in rows(text, "GPU node ") if name in r]
    assert "FAIL" in row and "label nvidia.com/gpu.present=true missing" in row
    assert f"allocatable nvidia.com/gpu 0, catalogue {settings.gpu_nodes.instance.gpus}" in row
    (plugin,) = rows(text, "NVIDIA device plugin")
    assert "FAIL" in plugin and name in plugin
    (efa_plugin,) = rows(text, "EFA device plugin")
    assert "PASS" in efa_plugin


def test_node_without_role_label_is_still_checked(
    api_server: FakeApi, settings: Settings, tmp_path: Path
) -> None:
    routes = healthy_cluster(settings)
    victim = next(n for n in routes["/api/v1/nodes"]["items"] if "role" in n["metadata"]["labels"])
    del victim["metadata"]["labels"]["role"]
    api_server.routes = routes
    rc, text = run_verify(tmp_path, api_server)
    assert rc == 1
    assert "label role=gpu-worker missing" in text


def test_standing_cluster_and_worker_requests(
    api_server: FakeApi, settings: Settings, tmp_path: Path
) -> None:
    standing = settings.model_copy(
        update={"job": settings.job.model_copy(update={"cluster": ClusterMode.STANDING})}
    )
    routes = healthy_cluster(settings)
    ns = settings.workload.namespace
    # The standing cluster is missing its EFA request and one worker is not ready.
    bad = _ray_cluster(settings, verify.STANDING_CLUSTER_NAME, settings.job.nodes - 1, efa_request=False)
    routes[f"/apis/ray.io/v1/namespaces/{ns}/rayclusters"]["items"] = [bad]
    routes[f"/apis/ray.io/v1/namespaces/{ns}/rayjobs"]["items"] = []
    api_server.routes = routes
    api = verify.connect(str(api_server.kubeconfig), None, standing)
    checks = {(c.name, c.subject): c for c in verify.verify(api, standing)}
    rc = checks[("RayCluster", f"{ns}/{verify.STANDING_CLUSTER_NAME}")]
    assert rc.result == verify.FAIL
    assert "requests no vpc.amazonaws.com/efa" in rc.detail
    assert f"{settings.job.nodes - 1}/{settings.job.nodes} workers ready" in rc.detail
    assert checks[("RayJob", f"{ns}/*")].result == verify.INFO
    # Standing mode with no cluster at all is a failure, not a note.
    routes[f"/apis/ray.io/v1/namespaces/{ns}/rayclusters"]["items"] = []
    missing = {(c.name, c.subject): c for c in verify.verify(api, standing)}
    assert missing[("RayCluster", f"{ns}/{verify.STANDING_CLUSTER_NAME}")].result == verify.FAIL


def test_failed_rayjob_and_missing_operator(api_server: FakeApi, settings: Settings, tmp_path: Path) -> None:
    routes = healthy_cluster(settings)
    ns = settings.workload.namespace
    job = routes[f"/apis/ray.io/v1/namespaces/{ns}/rayjobs"]["items"][0]
    job["status"] = {
        "jobDeploymentStatus": "Failed",
        "jobStatus": "FAILED",
        "message": "NCCL transport gate failed",
    }
    del routes["/apis/apps/v1/namespaces/kuberay-system/deployments/kuberay-operator"]
    api_server.routes = routes
    rc, text = run_verify(tmp_path, api_server)
    assert rc == 1
    (op,) = rows(text, "KubeRay operator")
    assert "FAIL" in op and "Deployment not found" in op
    (job_row,) = rows(text, "RayJob")
    assert "FAIL" in job_row and "NCCL transport gate failed" in job_row


def test_own_cluster_mode_without_a_job_is_a_note(
    api_server: FakeApi, settings: Settings, tmp_path: Path
) -> None:
    if settings.job.cluster is not ClusterMode.OWN:
        settings = settings.model_copy(
            update={"job": settings.job.model_copy(update={"cluster": ClusterMode.OWN})}
        )
    routes = healthy_cluster(settings)
    ns = settings.workload.namespace
    routes[f"/apis/ray.io/v1/namespaces/{ns}/rayclusters"]["items"] = []
    routes[f"/apis/ray.io/v1/namespaces/{ns}/rayjobs"]["items"] = []
    api_server.routes = routes
    api = verify.connect(str(api_server.kubeconfig), None, settings)
    checks = verify.verify(api, settings)
    assert not [c for c in checks if c.result == verify.FAIL]
    assert any(c.name == "RayCluster" and c.result == verify.INFO for c in checks)


def test_scaled_to_zero_is_not_a_failure(api_server: FakeApi, settings: Settings, tmp_path: Path) -> None:
    """Between jobs the autoscaler leaves no GPU node (min_size 0): a note, not a failure."""
    zero = settings.model_copy(update={"gpu_nodes": settings.gpu_nodes.model_copy(update={"min_size": 0})})
    routes = healthy_cluster(zero, gpu_nodes=0)
    ns = zero.workload.namespace
    routes[f"/apis/ray.io/v1/namespaces/{ns}/rayclusters"]["items"] = []
    routes[f"/apis/ray.io/v1/namespaces/{ns}/rayjobs"]["items"] = []
    api_server.routes = routes
    api = verify.connect(str(api_server.kubeconfig), None, zero)
    checks = verify.verify(api, zero)
    (nodes,) = [c for c in checks if c.name == "GPU nodes"]
    assert nodes.result == verify.INFO and "none running (min_size 0)" in nodes.detail
    assert not [c for c in checks if c.result == verify.FAIL]


def test_fewer_nodes_than_the_minimum_fail(api_server: FakeApi, settings: Settings, tmp_path: Path) -> None:
    one = settings.model_copy(update={"gpu_nodes": settings.gpu_nodes.model_copy(update={"min_size": 1})})
    api_server.routes = healthy_cluster(one, gpu_nodes=0)
    api = verify.connect(str(api_server.kubeconfig), None, one)
    (nodes,) = [c for c in verify.verify(api, one) if c.name == "GPU nodes"]
    assert nodes.result == verify.FAIL and "min_size is 1" in nodes.detail


def test_bad_env_prints_the_settings_message(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["verify", "--env", "no-such-env"])
    stdout, out = capsys.readouterr()  # the one line on stderr, nothing on stdout
    assert rc == 2 and stdout == ""
    assert "no such environment file" in out and "known environments" in out


def test_no_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["verify", "--env", ENV, "--kubeconfig", str(tmp_path / "nope")])
    stdout, out = capsys.readouterr()
    assert rc == 2 and stdout == ""
    assert "no kubeconfig at" in out and "aws eks update-kubeconfig --name" in out


def test_unknown_context(kubeconfig: Callable[[str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    kc = kubeconfig("http://127.0.0.1:9")
    rc = cli.main(["verify", "--env", ENV, "--kubeconfig", str(kc), "--context", "prod"])
    assert rc == 2
    assert "prod" in capsys.readouterr().err


def test_unreachable_api(kubeconfig: Callable[[str], Path], capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kc = kubeconfig(f"http://127.0.0.1:{port}")
    rc = cli.main(["verify", "--env", ENV, "--kubeconfig", str(kc)])
    out = capsys.readouterr().err
    assert rc == 2
    assert "cannot reach the Kubernetes API" in out


def test_forbidden(tmp_path: Path, api_server: FakeApi, capsys: pytest.CaptureFixture[str]) -> None:
    class Forbidden(_Handler):
        def do_GET(self) -> None:
            self._send(403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403})

    api_server.RequestHandlerClass = Forbidden
    rc, text = run_verify(tmp_path, api_server)
    assert rc == 2
    assert "refused" in text and "access entry" in text


def test_cluster_whose_job_ended_is_a_note(api_server: FakeApi, settings: Settings, tmp_path: Path) -> None:
    """After a job ends its deletion rule suspends the worker groups (pods deleted, GPU nodes left
    to the autoscaler) and the head stays for inspection: not a failure."""
    zero = settings.model_copy(update={"gpu_nodes": settings.gpu_nodes.model_copy(update={"min_size": 0})})
    routes = healthy_cluster(zero, gpu_nodes=0)  # the autoscaler has removed the empty GPU nodes
    ns = zero.workload.namespace
    (cluster,) = routes[f"/apis/ray.io/v1/namespaces/{ns}/rayclusters"]["items"]
    for group in cluster["spec"]["workerGroupSpecs"]:
        group["suspend"] = True
    cluster["status"] |= {"readyWorkerReplicas": 0, "desiredWorkerReplicas": 0}
    job = routes[f"/apis/ray.io/v1/namespaces/{ns}/rayjobs"]["items"][0]
    job["status"] = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
    api_server.routes = routes
    api = verify.connect(str(api_server.kubeconfig), None, zero)
    checks = verify.verify(api, zero)
    assert not [c for c in checks if c.result == verify.FAIL], checks
    (rc,) = [c for c in checks if c.name == "RayCluster"]
    assert rc.result == verify.INFO and "GPU workers released" in rc.detail
    # One group still running is a cluster like any other: checked, and failing when short.
    cluster["spec"]["workerGroupSpecs"][0]["suspend"] = False
    (rc,) = [c for c in verify.verify(api, zero) if c.name == "RayCluster"]
    assert rc.result == verify.FAIL


def test_stopped_job_still_holding_its_workers_fails(
    api_server: FakeApi, settings: Settings, tmp_path: Path
) -> None:
    """`ray job stop` ends a RayJob STOPPED (deployment Complete), which no KubeRay 1.7 deletion rule
    names: its cluster keeps the GPU workers until someone deletes the RayJob. verify says so."""
    if settings.job.cluster is not ClusterMode.OWN:
        settings = settings.model_copy(
            update={"job": settings.job.model_copy(update={"cluster": ClusterMode.OWN})}
        )
    routes = healthy_cluster(settings)
    ns = settings.workload.namespace
    (cluster,) = routes[f"/apis/ray.io/v1/namespaces/{ns}/rayclusters"]["items"]
    job = routes[f"/apis/ray.io/v1/namespaces/{ns}/rayjobs"]["items"][0]
    job["status"] = {
        "jobDeploymentStatus": "Complete",
        "jobStatus": "STOPPED",
        "rayClusterName": cluster["metadata"]["name"],
    }
    api_server.routes = routes
    api = verify.connect(str(api_server.kubeconfig), None, settings)
    (row,) = [c for c in verify.verify(api, settings) if c.name == "RayJob"]
    assert row.result == verify.FAIL
    assert (
        "still holds its GPU workers" in row.detail
        and f"delete rayjob {job['metadata']['name']}" in row.detail
    )
    # Once its workers are gone (deleted by hand, or suspended) it is only a note.
    for group in cluster["spec"]["workerGroupSpecs"]:
        group["suspend"] = True
    (row,) = [c for c in verify.verify(api, settings) if c.name == "RayJob"]
    assert row.result == verify.INFO


# --- node health: the DCGM host engine and AcceleratedHardwareReady -------------------------------


def test_healthy_gpu_nodes_run_dcgm_and_report_gpu_health(
    api_server: FakeApi, settings: Settings, tmp_path: Path
) -> None:
    api_server.routes = healthy_cluster(settings)
    rc, text = run_verify(tmp_path, api_server)
    assert rc == 0, text
    (dcgm,) = rows(text, "DCGM host engine")
    assert "PASS" in dcgm and "kube-system/dcgm-server" in dcgm
    health = rows(text, "GPU health")
    assert len(health) == settings.job.nodes and all("AcceleratedHardwareReady=True" in r for r in health)
    assert any("labelSelector=k8s-app%3Ddcgm-server%2Cversion%3Dv1" in r for r in api_server.requests)


def test_gpu_node_without_dcgm_server_fails(api_server: FakeApi, settings: Settings, tmp_path: Path) -> None:
    """The original failure: DCGM without the GPU toleration runs on no GPU node."""
    routes = healthy_cluster(settings)
    pods = routes["/api/v1/namespaces/kube-system/pods"]["items"]
    routes["/api/v1/namespaces/kube-system/pods"]["items"] = [
        p for p in pods if not p["metadata"]["name"].startswith("dcgm-server")
    ]
    victim = next(n for n in routes["/api/v1/nodes"]["items"] if "role" in n["metadata"]["labels"])
    for cond in victim["status"]["conditions"]:
        if cond["type"] == "AcceleratedHardwareReady":
            cond.update(
                status="False",
                reason="DCGMError",
                message="failed to initialize DCGM: Error connecting to nv-hostengine",
            )
    api_server.routes = routes
    rc, text = run_verify(tmp_path, api_server)
    assert rc == 1, text
    (dcgm,) = rows(text, "DCGM host engine")
    assert "FAIL" in dcgm and f"no ready pod on {settings.job.nodes} of {settings.job.nodes}" in dcgm
    assert "dcgmAgent.tolerations" in text
    (bad,) = [r for r in rows(text, "GPU health") if victim["metadata"]["name"] in r]
    assert "FAIL" in bad and "AcceleratedHardwareReady=False (DCGMError" in bad


def test_gpu_health_not_reported_fails(api_server: FakeApi, settings: Settings, tmp_path: Path) -> None:
    routes = healthy_cluster(settings)
    victim = next(n for n in routes["/api/v1/nodes"]["items"] if "role" in n["metadata"]["labels"])
    victim["status"]["conditions"] = [
        c for c in victim["status"]["conditions"] if c["type"] != "AcceleratedHardwareReady"
    ]
    api_server.routes = routes
    rc, text = run_verify(tmp_path, api_server)
    assert rc == 1
    (bad,) = [r for r in rows(text, "GPU health") if victim["metadata"]["name"] in r]
    assert "FAIL" in bad and "AcceleratedHardwareReady not reported" in bad


def test_node_health_not_checked_without_node_monitoring(settings: Settings, serve_kube_api) -> None:
    off = settings.model_copy(
        update={"observability": settings.observability.model_copy(update={"node_monitoring": False})}
    )
    server = serve_kube_api(FakeApi())
    routes = healthy_cluster(settings)
    routes["/api/v1/namespaces/kube-system/pods"]["items"] = [
        p
        for p in routes["/api/v1/namespaces/kube-system/pods"]["items"]
        if "dcgm" not in p["metadata"]["name"]
    ]
    server.routes = routes
    api = verify.connect(str(server.kubeconfig), None, off)
    checks = verify.verify(api, off)
    assert not [c for c in checks if c.name in ("DCGM host engine", "GPU health")]
    assert all(c.result != verify.FAIL for c in checks), checks


def test_dcgm_engines_one_when_the_exporter_uses_dcgm_server(settings: Settings, serve_kube_api) -> None:
    """Container Insights on (prod): an exporter told to use dcgm-server's engine (the flag the
    stack's patch makes the operator pass) and ready passes; one without it runs its own engine
    beside dcgm-server (a warning naming both); one pointed there but not ready warns that the
    node's GPU metrics are missing. Warnings do not fail the gate."""
    on = settings.model_copy(
        update={
            "observability": settings.observability.model_copy(
                update={"metrics": True, "node_monitoring": True}
            )
        }
    )
    server = serve_kube_api(FakeApi())
    routes = healthy_cluster(settings)
    gpu = [
        n["metadata"]["name"] for n in routes["/api/v1/nodes"]["items"] if "role" in n["metadata"]["labels"]
    ]
    image = "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless"
    ready = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    exporters = [
        {"metadata": {"name": "dcgm-exporter-a"},
         "spec": {"nodeName": gpu[0], "containers": [{"name": "dcgm-exporter", "image": image, "env": []}]},
         "status": ready},
        {"metadata": {"name": "dcgm-exporter-b"},
         "spec": {"nodeName": gpu[1], "containers": [{"name": "dcgm-exporter", "image": image, "args": [
             "--remote-hostengine-info=dcgm-hostengine.kube-system.svc:5555",
             "--web-config-file=/etc/dcgm-exporter/web-config.yaml"]}]},
         "status": ready},
    ]  # fmt: skip
    routes["/api/v1/namespaces/amazon-cloudwatch/pods"] = {"kind": "PodList", "items": exporters}
    server.routes = routes
    api = verify.connect(str(server.kubeconfig), None, on)
    engines = {c.subject: c for c in verify.verify(api, on) if c.name == "DCGM engines"}
    assert engines[gpu[0]].result == verify.WARN
    assert (
        "two: dcgm-server" in engines[gpu[0]].detail
        and "amazon-cloudwatch/dcgm-exporter-a" in engines[gpu[0]].detail
    )
    assert engines[gpu[1]].result == verify.PASS
    assert "one: dcgm-server" in engines[gpu[1]].detail
    assert "dcgm-hostengine.kube-system.svc:5555" in engines[gpu[1]].detail

    exporters[1]["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}
    engines = {c.subject: c for c in verify.verify(api, on) if c.name == "DCGM engines"}
    assert engines[gpu[1]].result == verify.WARN and "not ready" in engines[gpu[1]].detail
    assert all(c.result != verify.FAIL for c in verify.verify(api, on))
    off = on.model_copy(update={"observability": on.observability.model_copy(update={"metrics": False})})
    assert not [c for c in verify.verify(api, off) if c.name == "DCGM engines"]


@pytest.mark.parametrize(
    ("container", "engine"),
    [
        ({"args": ["--remote-hostengine-info=10.0.3.7:5555"]}, "10.0.3.7:5555"),
        ({"args": ["-r", "h:5555"]}, "h:5555"),
        ({"args": ["-r=h:5555"]}, "h:5555"),
        ({"command": ["dcgm-exporter", "--remote-hostengine-info", "h:5555"]}, "h:5555"),
        ({"env": [{"name": "DCGM_REMOTE_HOSTENGINE_INFO", "value": "10.0.3.7:5555"}]}, "10.0.3.7:5555"),
        ({"args": ["--web-config-file=/etc/dcgm-exporter/web-config.yaml"], "env": []}, None),
        ({"args": ["--remote-hostengine-info"]}, None),
    ],
)
def test_remote_engine_reads_the_flag_its_forms_and_the_env(
    container: dict[str, Any], engine: str | None
) -> None:
    from raytrain.verify.nodes import remote_engine

    assert remote_engine(container) == engine

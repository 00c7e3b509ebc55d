"""The recorded cluster and the fake Kubernetes API server that `raytrain verify`'s tests run
against (tests/verify/).

The official client does the real work (kubeconfig, URLs, query strings, JSON decoding into its
models); the server answers the paths it calls with objects shaped like an EKS cluster's.
"""

from __future__ import annotations

import copy
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from rich.console import Console

from config.settings import Settings
from raytrain import cli, verify

ENV = "dev"


# --- a recorded cluster, built from the environment's own settings --------------------------------


def gpu_or_system_node(name: str, settings: Settings, *, gpu_node: bool) -> dict[str, Any]:
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


def daemonset(name: str, match: dict[str, str], ready: int, desired: int) -> dict[str, Any]:
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


def pod(name: str, node: str, labels: dict[str, str], ready: bool = True) -> dict[str, Any]:
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


def ray_cluster(
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
    nodes = [gpu_or_system_node("ip-10-0-0-11.us-west-2.compute.internal", settings, gpu_node=False)]
    nodes += [gpu_or_system_node(n, settings, gpu_node=True) for n in gpu_names]
    pods = [pod(f"nvidia-device-plugin-{i}", n, NVIDIA_LABELS) for i, n in enumerate(gpu_names)]
    pods += [pod(f"aws-efa-k8s-device-plugin-{i}", n, EFA_LABELS) for i, n in enumerate(gpu_names)]
    pods += [pod(f"dcgm-server-{i}", n, DCGM_LABELS) for i, n in enumerate(gpu_names)]
    pods += [pod("aws-node-x", nodes[0]["metadata"]["name"], {"k8s-app": "aws-node"})]
    k = len(gpu_names)
    daemonsets = [
        daemonset("aws-node", {"k8s-app": "aws-node"}, k + 1, k + 1),
        daemonset(
            "nvidia-device-plugin-mps-control-daemon",
            {"app.kubernetes.io/name": "nvidia-device-plugin", "mps": "1"},
            0,
            0,
        ),
        daemonset("nvidia-device-plugin", NVIDIA_LABELS, k, k),
        daemonset("aws-efa-k8s-device-plugin", EFA_LABELS, k, k),
        daemonset("dcgm-server", DCGM_LABELS, k, k),
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
    cluster = ray_cluster(settings, "qwen25-fsdp2-5f3a9c-raycluster-8kq2x", settings.job.nodes)
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
        "/api/v1/nodes": api_list("NodeList", "v1", nodes),
        "/apis/apps/v1/namespaces/kube-system/daemonsets": api_list("DaemonSetList", "apps/v1", daemonsets),
        "/api/v1/namespaces/kube-system/pods": api_list("PodList", "v1", pods),
        "/apis/apps/v1/namespaces/kuberay-system/deployments/kuberay-operator": operator,
        f"/apis/ray.io/v1/namespaces/{ns}/rayclusters": api_list("RayClusterList", "ray.io/v1", [cluster]),
        f"/apis/ray.io/v1/namespaces/{ns}/rayjobs": api_list("RayJobList", "ray.io/v1", [job]),
    }


def api_list(kind: str, api_version: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": "4242"}, "items": items}


# --- the fake API server ------------------------------------------------------------------------


class FakeApi(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), ApiHandler)
        self.routes: dict[str, Any] = {}
        self.requests: list[str] = []
        self.auth: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class ApiHandler(BaseHTTPRequestHandler):
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


def run_verify(tmp_path: Path, server: FakeApi, *extra: str) -> tuple[int, str]:
    kubeconfig = server.kubeconfig
    console = Console(record=True, width=250, force_terminal=False)
    parser = cli.build_parser()
    args = parser.parse_args(["verify", "--env", ENV, "--kubeconfig", str(kubeconfig), *extra])
    rc = verify.run(args, console=console)
    return rc, console.export_text()


def rows(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip("│ ").startswith(name)]

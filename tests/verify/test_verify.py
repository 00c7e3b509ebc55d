"""`raytrain verify` against a fake Kubernetes API server on 127.0.0.1.

The official client does the real work (kubeconfig, URLs, query strings, JSON decoding into its
models); the server answers the paths it calls with objects shaped like an EKS cluster's.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from config.settings import ClusterMode, Settings
from raytrain import cli, verify
from tests.verify_cluster import (
    ENV,
    ApiHandler,
    FakeApi,
    healthy_cluster,
    ray_cluster,
    rows,
    run_verify,
)

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
    bad = ray_cluster(settings, verify.STANDING_CLUSTER_NAME, settings.job.nodes - 1, efa_request=False)
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
    class Forbidden(ApiHandler):
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
    # Queued jobs have no inspection time (TTL 0): the note says how the head goes, not a setting
    # that no longer does anything.
    assert "ttl_seconds_after_finished" not in rc.detail
    (owner,) = [o["name"] for o in cluster["metadata"]["ownerReferences"] if o["kind"] == "RayJob"]
    assert f"kubectl -n {ns} delete rayjob {owner}" in rc.detail
    del cluster["metadata"]["ownerReferences"]  # a cluster made by hand
    (rc,) = [c for c in verify.verify(api, zero) if c.name == "RayCluster"]
    assert f"kubectl -n {ns} delete raycluster {cluster['metadata']['name']}" in rc.detail
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

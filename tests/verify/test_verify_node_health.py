"""`raytrain verify`'s node-health rows against the fake API server (tests/verify_cluster.py): the
DCGM host engine on GPU nodes, AcceleratedHardwareReady, and how many DCGM engines a GPU node runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from config.settings import Settings
from raytrain import verify
from tests.verify_cluster import (
    FakeApi,
    healthy_cluster,
    rows,
    run_verify,
)

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

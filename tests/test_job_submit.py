"""`raytrain job submit|stop|delete` against a fake Kubernetes API server and moto's S3 server,
with the real kubernetes and boto3 clients.

The fake server keeps RayJobs in memory, validates what is POSTed against the RayJob CRD's
openAPIV3Schema (k8s/crds, KubeRay v1.7.0), honours dryRun=All (validates, stores nothing), and
answers 409 for a name that exists, as the API server does.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import shlex
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import boto3
import jsonschema
import pytest
from rich.console import Console
from ruamel.yaml import YAML

from config.loader import load_settings
from config.locations import checkpoint_bucket_name, checkpoint_uri
from config.names import JOBS_ANCHOR
from raytrain import cli
from tests.hub_stub import Hub
from tests.hub_stub import serve as serve_hub
from tests.moto_server import running_moto_server

ENV = "dev"
# dev has two teams (config/environments/dev.yaml): the jobs run in the first one's namespace.
TEAM = "research"
REGION = "us-west-2"
ANCHOR_UID = "5f0c3f4e-anchor-uid"
CRD = Path(__file__).resolve().parents[1] / "k8s" / "crds" / "ray.io_rayjobs.yaml"


@functools.cache
def _schema() -> dict[str, Any]:
    """Parsed once per session (ruamel's pure-Python loader takes seconds over this CRD); read-only."""
    crd = YAML(typ="safe", pure=True).load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return dict(version["schema"]["openAPIV3Schema"])


class Kube(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, namespace: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ns = namespace
        self.jobs: dict[str, dict[str, Any]] = {}
        self.clusters: dict[str, dict[str, Any]] = {}
        self.workloads: dict[str, dict[str, Any]] = {}  # Kueue's, by name
        # Pods still terminating after their RayCluster went (in their preStop hooks): listed this
        # many more times, then gone (the garbage collector's background deletion).
        self.pods: list[dict[str, Any]] = []
        self.pod_lists_left = 0
        self.anchor = True
        self.requests: list[tuple[str, str, Any]] = []  # method, path?query, body
        self.refuse_create: tuple[int, str] | None = None
        self.schema = _schema()


class _Handler(BaseHTTPRequestHandler):
    server: Kube
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> Any:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n)) if n else None

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._send(
            code, {"kind": "Status", "status": "Failure", "reason": reason, "message": message, "code": code}
        )

    def do_GET(self) -> None:
        url, s = urlparse(self.path), self.server
        self.server.requests.append(("GET", self.path, None))
        base = f"/apis/ray.io/v1/namespaces/{s.ns}/"
        if url.path == f"/api/v1/namespaces/{s.ns}/configmaps/{JOBS_ANCHOR}" and s.anchor:
            return self._send(
                200, {"kind": "ConfigMap", "metadata": {"name": JOBS_ANCHOR, "uid": ANCHOR_UID}}
            )
        if url.path == base + "rayjobs":
            selector = parse_qs(url.query).get("labelSelector", [""])[0]
            want = dict(p.split("=", 1) for p in selector.split(",") if p)
            items = [
                j
                for j in s.jobs.values()
                if all(j["metadata"].get("labels", {}).get(k) == v for k, v in want.items())
            ]
            return self._send(200, {"kind": "RayJobList", "items": copy.deepcopy(items)})
        if url.path == f"/api/v1/namespaces/{s.ns}/pods":
            selector = parse_qs(url.query).get("labelSelector", [""])[0]
            want = dict(p.split("=", 1) for p in selector.split(",") if p)
            if s.pod_lists_left <= 0:
                s.pods = []
            s.pod_lists_left -= 1
            items = [p for p in s.pods if all(p["metadata"]["labels"].get(k) == v for k, v in want.items())]
            return self._send(200, {"kind": "PodList", "items": items})
        if url.path == f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{s.ns}/workloads":
            return self._send(
                200, {"kind": "WorkloadList", "items": copy.deepcopy(list(s.workloads.values()))}
            )
        if url.path.startswith(base + "rayjobs/") and url.path.rsplit("/", 1)[1] in s.jobs:
            return self._send(200, s.jobs[url.path.rsplit("/", 1)[1]])
        if url.path.startswith(base + "rayclusters/") and url.path.rsplit("/", 1)[1] in s.clusters:
            return self._send(200, s.clusters[url.path.rsplit("/", 1)[1]])
        self._status(404, "NotFound", "not found")

    def do_POST(self) -> None:
        url, s, body = urlparse(self.path), self.server, self._body()
        s.requests.append(("POST", self.path, body))
        if s.refuse_create:
            return self._status(s.refuse_create[0], "Invalid", s.refuse_create[1])
        try:
            jsonschema.validate(body, s.schema)
        except jsonschema.ValidationError as exc:
            return self._status(422, "Invalid", f"RayJob is invalid: {exc.message}")
        name = body["metadata"]["name"]
        if name in s.jobs:
            return self._status(409, "AlreadyExists", f'rayjobs.ray.io "{name}" already exists')
        if parse_qs(url.query).get("dryRun") != ["All"]:
            meta = {**body["metadata"], "uid": f"uid-{name}"}  # the API server's
            s.jobs[name] = {**body, "metadata": meta, "status": {"jobDeploymentStatus": "Initializing"}}
        self._send(201, body)

    def do_DELETE(self) -> None:
        s = self.server
        s.requests.append(("DELETE", self.path, self._body()))
        name = urlparse(self.path).path.rsplit("/", 1)[1]
        if s.jobs.pop(name, None) is None:
            return self._status(404, "NotFound", "not found")
        self._send(200, {"kind": "Status", "status": "Success"})

    def do_PATCH(self) -> None:
        s, body = self.server, self._body()
        s.requests.append(("PATCH", self.path, {"type": self.headers["Content-Type"], "patch": body}))
        name = urlparse(self.path).path.rsplit("/", 1)[1]
        if "/workloads/" in self.path:
            return self._patch_workload(name, body)
        cluster = s.clusters.get(name)
        if cluster is None:
            return self._status(404, "NotFound", "not found")
        for op in body:
            _, _, _, index, field = op["path"].split("/")
            cluster["spec"]["workerGroupSpecs"][int(index)][field] = op["value"]
        self._send(200, cluster)

    def _patch_workload(self, name: str, body: Any) -> None:
        """A JSON patch of a Workload's spec. Deactivating an admitted one stands for what Kueue and
        KubeRay then do (the Workload CRD: "Changing active from true to false will evict any
        running workloads"; KubeRay suspends the evicted RayJob and deletes its cluster): the
        owning RayJob's deployment status becomes Suspended."""
        s, workload = self.server, self.server.workloads.get(name)
        if workload is None:
            return self._status(404, "NotFound", "not found")
        for op in body:
            assert op["op"] in {"add", "replace"} and op["path"] == "/spec/active", op
            workload["spec"]["active"] = op["value"]
        if workload["spec"]["active"] is False:
            for owner in workload["metadata"]["ownerReferences"]:
                job = next((j for j in s.jobs.values() if j["metadata"].get("uid") == owner["uid"]), None)
                if job is not None:
                    job["status"] = {"jobDeploymentStatus": "Suspended", "jobStatus": ""}
        self._send(200, workload)


@pytest.fixture(autouse=True)
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    """The Hugging Face hub that `job submit` asks whether the model is readable (tests/hub_stub.py):
    every model public unless a test gates it."""
    from raytrain import hub_access

    with serve_hub() as stub:
        stub.open = True
        monkeypatch.setattr(hub_access, "hub_api", stub.api)
        yield stub


@pytest.fixture
def settings() -> Any:
    return load_settings(ENV).for_team(TEAM)


@pytest.fixture
def kube(serve_kube_api: Callable[[Kube], Kube], settings: Any) -> Kube:
    return serve_kube_api(Kube(settings.workload.namespace))


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with running_moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[Any]:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE000000000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("s3", region_name=REGION, endpoint_url=moto_endpoint)
    bucket = checkpoint_bucket_name(settings)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    yield client
    # moto's state is the process's: leave no bucket behind for other modules' moto servers.
    for obj in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        client.delete_object(Bucket=bucket, Key=obj["Key"])
    client.delete_bucket(Bucket=bucket)


def job(kube: Kube, *argv: str) -> tuple[int, str]:
    where = ["--env", ENV, "--team", TEAM, "--kubeconfig", str(kube.kubeconfig)]  # type: ignore[attr-defined]
    args = cli.build_parser().parse_args(["job", *argv, *where])
    console = Console(record=True, width=300, force_terminal=False)
    rc = args.func(args, console=console)
    return rc, console.export_text()


def _code_objects(s3: Any, settings: Any) -> list[dict[str, Any]]:
    return list(s3.list_objects_v2(Bucket=checkpoint_bucket_name(settings)).get("Contents", []))


def test_submit_uploads_the_code_then_creates_the_rayjob(kube: Kube, s3: Any, settings: Any) -> None:
    rc, text = job(kube, "submit", "--set", "job.steps=10", "--set", "job.checkpoint_every=5")
    assert rc == 0, text
    (obj,) = _code_objects(s3, settings)
    data = s3.get_object(Bucket=checkpoint_bucket_name(settings), Key=obj["Key"])["Body"].read()
    assert obj["Key"] == f"code/{hashlib.sha256(data).hexdigest()}.zip"  # content-addressed
    (name,) = kube.jobs
    created = kube.jobs[name]
    assert name.startswith("rs-dev-smoke-") and len(name) <= 47
    meta = created["metadata"]
    assert meta["labels"]["ray-train/origin"] == "submitted"
    assert meta["labels"]["app.kubernetes.io/part-of"] == "ray-train"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": JOBS_ANCHOR,
            "uid": ANCHOR_UID,
            "blockOwnerDeletion": True,
        }
    ]
    spec = created["spec"]
    assert "--steps 10 " in spec["entrypoint"] and "--checkpoint-every 5 " in spec["entrypoint"]
    assert json.loads(spec["runtimeEnvYAML"]) == {
        "working_dir": f"s3://{checkpoint_bucket_name(settings)}/{obj['Key']}"
    }
    # The API server validated it (dry run) before the upload, then it was created.
    posts = [r for r in kube.requests if r[0] == "POST"]
    assert [("dryRun=All" in p[1]) for p in posts] == [True, False]
    assert f"raytrain job logs --follow --env dev --team {TEAM} --job {name}" in text and "uploaded" in text
    # Queued in the team's LocalQueue, created suspended: Kueue admits it (k8s/kueue.py).
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == TEAM
    assert meta["labels"]["kueue.x-k8s.io/priority-class"] == settings.active_team.default_priority
    assert spec["suspend"] is True and spec["shutdownAfterJobFinishes"] is True
    assert meta["namespace"] == f"ray-{TEAM}" == settings.workload.namespace
    assert f"--storage-path s3://{checkpoint_bucket_name(settings)}/checkpoints-{TEAM} " in spec["entrypoint"]

    # Rerun, same code: a new job, nothing uploaded again.
    rc, text = job(kube, "submit", "--name", "rerun-1", "--set", "job.run_name=dev-smoke-2")
    assert rc == 0, text
    assert "already uploaded" in text
    assert [o["Key"] for o in _code_objects(s3, settings)] == [obj["Key"]]
    assert set(kube.jobs) == {name, "rerun-1"}


def test_submit_with_a_priority_labels_it_and_an_unknown_one_is_refused(kube: Kube, s3: Any) -> None:
    rc, text = job(
        kube, "submit", "--priority", "urgent", "--set", "job.steps=10", "--set", "job.checkpoint_every=5"
    )
    assert rc == 2 and "--priority: 'urgent' is not a priority; valid: low, normal, high" in " ".join(
        text.split()
    )
    assert not kube.jobs
    rc, text = job(
        kube, "submit", "--priority", "high", "--set", "job.steps=10", "--set", "job.checkpoint_every=5"
    )
    assert rc == 0, text
    (created,) = kube.jobs.values()
    assert created["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"


def test_submit_without_a_team_where_there_are_several_names_them(kube: Kube) -> None:
    kubeconfig = str(kube.kubeconfig)  # type: ignore[attr-defined]
    args = cli.build_parser().parse_args(["job", "submit", "--env", ENV, "--kubeconfig", kubeconfig])
    console = Console(record=True, width=300, force_terminal=False)
    assert args.func(args, console=console) == 2
    assert "--team: dev has the teams research, applied: name yours" in console.export_text()
    args = cli.build_parser().parse_args(["job", "submit", "--env", ENV, "--team", "nobody"])
    assert args.func(args, console=console) == 2
    assert "--team 'nobody': not a team of dev; its teams: research, applied" in console.export_text()


def test_a_job_bigger_than_its_team_could_ever_be_given_is_refused() -> None:
    from raytrain.job.common import JobError
    from raytrain.job.submit import check_queue
    from tests.chart_render import variant

    data = load_settings(ENV).model_dump(mode="json")["teams"]
    data["applied"]["borrowing_limit_nodes"] = 0
    settings = variant(ENV, teams=data, job={"deploy": False, "nodes": 2}).for_team("applied")
    with pytest.raises(JobError) as info:
        check_queue(settings, None)
    assert str(info.value) == (
        "job.nodes 2: team applied can never be given more than 1 g6.12xlarge nodes (its quota gpu_nodes "
        "1, borrowing_limit_nodes 0, gpu_nodes.max_size 2), so Kueue would never admit it: --set "
        "job.nodes=1 or less, or raise the team's quota (docs/teams.md)"
    )
    check_queue(settings.for_team("research"), "low")  # research may borrow: 2 nodes can be given


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("job.stepz=3", "--set job.stepz=3: unknown field job.stepz; did you mean job.steps?"),
        ("job.steps=0", "job.steps: Input should be greater than or equal to 1"),
        ("job.micro_batch_size=64", "job.micro_batch_size: 64 is larger than global_batch_size"),
        ("job.cluster=standing", "job.cluster own or standing is the deployed cluster's shape"),
        (
            "job.data=s3://someone-elses-bucket/corpus",
            "job.data: s3://someone-elses-bucket/corpus is not readable",
        ),
        ("workload.image=x", "only job.FIELD (or job.lora.FIELD) can be set per job"),
    ],
)
def test_a_refused_submit_uploads_and_creates_nothing(
    kube: Kube, s3: Any, settings: Any, override: str, message: str
) -> None:
    rc, text = job(kube, "submit", "--set", override)
    assert rc == 2 and message in " ".join(text.split()), text
    assert len(text.strip().splitlines()) == 1, text
    assert _code_objects(s3, settings) == [] and not kube.jobs
    assert not [r for r in kube.requests if r[0] == "POST"]


def test_what_the_api_server_refuses_uploads_nothing(kube: Kube, s3: Any, settings: Any) -> None:
    kube.refuse_create = (422, "admission webhook denied the request: spec.entrypoint: Invalid value")
    rc, text = job(kube, "submit")
    assert rc == 2 and "HTTP 422" in text and "admission webhook denied" in text
    assert _code_objects(s3, settings) == [] and not kube.jobs
    kube.refuse_create = None
    kube.anchor = False
    rc, text = job(kube, "submit")
    assert rc == 2 and "the Workload stack of dev is not deployed" in text
    assert _code_objects(s3, settings) == []


def test_a_run_name_in_use_and_a_taken_name_are_refused(kube: Kube, s3: Any, settings: Any) -> None:
    assert job(kube, "submit", "--name", "first")[0] == 0
    rc, text = job(kube, "submit", "--name", "second")
    assert rc == 2 and "job.run_name 'dev-smoke' is in use by the unfinished RayJob first" in text
    rc, text = job(kube, "submit", "--name", "first", "--set", "job.run_name=other")
    assert rc == 2 and "RayJob 'first' exists already" in text
    rc, text = job(kube, "submit", "--name", "rj-mine")
    assert rc == 2 and "the deployed jobs'" in text
    # Two jobs that need more GPU nodes than the group's max: the second is told it waits.
    rc, text = job(kube, "submit", "--name", "second", "--set", "job.run_name=other")
    assert rc == 0 and "waits for GPU nodes" in text and "first (2)" in text
    # Queued, not failing on a start budget: Kueue's timeout only counts once it is admitted.
    assert "Kueue queue" in text and "start_timeout_seconds" not in text


def test_a_finished_runs_name_is_refused_unless_resumed(kube: Kube, s3: Any, settings: Any) -> None:
    """Issue 41: a rerun of a finished run would find its checkpoint and be refused by the job, once
    two GPU nodes had started: refused here instead; job.resume continues it, the RayJob's name
    going with it as --job-id (a KubeRay retry of that RayJob resumes its run)."""
    assert job(kube, "submit", "--name", "first")[0] == 0
    kube.jobs["first"]["status"] = {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
    rc, text = job(kube, "submit", "--name", "second", "--set", "job.steps=100")
    assert rc == 2 and len(text.strip().splitlines()) == 1, text
    assert "job.run_name 'dev-smoke' is the run of the finished RayJob first: --set job.resume=true" in (
        " ".join(text.split())
    )
    assert set(kube.jobs) == {"first"}
    assert "--resume" not in kube.jobs["first"]["spec"]["entrypoint"]
    rc, text = job(kube, "submit", "--name", "second", "--set", "job.steps=100", "--set", "job.resume=true")
    assert rc == 0, text
    entry = kube.jobs["second"]["spec"]["entrypoint"]
    assert "--run-name dev-smoke " in entry and "--resume --job-id second" in entry
    rc, text = job(kube, "submit", "--name", "third", "--set", "job.resume=maybe")
    assert rc == 2 and "job.resume: Input should be a valid boolean" in text, text


def test_stop_deletes_a_running_job_and_releases_a_ray_stopped_ones_workers(
    kube: Kube, s3: Any, settings: Any
) -> None:
    assert job(kube, "submit", "--name", "running")[0] == 0
    rc, text = job(kube, "stop", "--job", "running")
    assert rc == 0, text
    (delete,) = [r for r in kube.requests if r[0] == "DELETE"]
    assert delete[1].endswith("/rayjobs/running?propagationPolicy=Foreground")
    assert "running" not in kube.jobs
    # Stopped from Ray: ended (Complete, STOPPED), its cluster still has its GPU workers.
    assert job(kube, "submit", "--name", "stopped")[0] == 0
    kube.jobs["stopped"]["status"] = {
        "jobDeploymentStatus": "Complete",
        "jobStatus": "STOPPED",
        "rayClusterName": "stopped-abcde",
    }
    kube.clusters["stopped-abcde"] = {
        "metadata": {"name": "stopped-abcde"},
        "spec": {"workerGroupSpecs": [{"groupName": "gpu", "replicas": 2}]},
        "status": {"state": "ready"},
    }
    rc, text = job(kube, "stop", "--job", "stopped")
    assert rc == 0 and "workers released" in text, text
    (patch,) = [r for r in kube.requests if r[0] == "PATCH"]
    assert patch[2]["type"] == "application/json-patch+json"
    assert kube.clusters["stopped-abcde"]["spec"]["workerGroupSpecs"][0]["suspend"] is True
    rc, text = job(kube, "stop", "--job", "stopped")
    assert rc == 0 and "nothing to stop" in text
    rc, text = job(kube, "delete", "--job", "nope")
    assert rc == 2 and "no RayJob 'nope'" in text and "stopped" in text
    rc, text = job(kube, "delete", "--job", "stopped", "--wait")
    assert rc == 0 and "are gone" in text and not kube.jobs


def admitted_workload(kube: Kube, job_name: str) -> str:
    """Kueue's Workload of a submitted RayJob, admitted (as Kueue writes it: owner, conditions)."""
    owner = kube.jobs[job_name]["metadata"]
    name = f"rayjob-{job_name}-1a2b3"
    kube.workloads[name] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": kube.ns,
            "ownerReferences": [
                {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayJob",
                    "name": job_name,
                    "uid": owner["uid"],
                    "controller": True,
                },
            ],
        },
        "spec": {"active": True, "queueName": owner["labels"]["kueue.x-k8s.io/queue-name"]},
        "status": {"conditions": [{"type": "Admitted", "status": "True"}]},
    }
    kube.jobs[job_name]["status"] = {
        "jobDeploymentStatus": "Running",
        "jobStatus": "RUNNING",
        "rayClusterName": f"{job_name}-abcde",
    }
    return name


def test_stop_of_an_admitted_queued_job_checkpoints_on_notice_first(
    kube: Kube, s3: Any, settings: Any
) -> None:
    """Deactivated through Kueue (the pods' preStop hooks then write a checkpoint), deleted once its
    cluster is gone; a queued job not yet admitted, or one already stopped, is deleted at once."""
    assert job(kube, "submit", "--name", "admitted")[0] == 0
    workload = admitted_workload(kube, "admitted")
    # Its pods outlive the RayCluster object (Suspended comes first): the stop waits for them.
    labels = {"ray.io/cluster": "admitted-abcde"}
    kube.pods = [{"metadata": {"name": f"admitted-abcde-{k}", "labels": labels}} for k in ("head", "gpu")]
    kube.pod_lists_left = 3
    rc, text = job(kube, "stop", "--job", "admitted", "--poll-seconds", "0.01")
    assert rc == 0, text
    assert "checkpoint on" in " ".join(text.split()) and "deactivated" in text
    pods_path = f"/api/v1/namespaces/{kube.ns}/pods"
    pod_lists = [i for i, r in enumerate(kube.requests) if urlparse(r[1]).path == pods_path]
    delete = next(i for i, r in enumerate(kube.requests) if r[0] == "DELETE")
    assert len(pod_lists) == 4 and pod_lists[-1] < delete  # three with pods, then none: then the delete
    assert parse_qs(urlparse(kube.requests[pod_lists[0]][1]).query)["labelSelector"] == [
        "ray.io/cluster=admitted-abcde"
    ]
    writes = [(m, p, b) for m, p, b in kube.requests if m in {"PATCH", "DELETE"}]
    assert [(m, p.split("?")[0].rsplit("/", 2)[-2]) for m, p, _ in writes] == [
        ("PATCH", "workloads"),
        ("DELETE", "rayjobs"),
    ]
    assert writes[0][2] == {
        "type": "application/json-patch+json",
        "patch": [{"op": "add", "path": "/spec/active", "value": False}],
    }
    assert kube.workloads[workload]["spec"]["active"] is False and "admitted" not in kube.jobs
    # Pending in its queue (not admitted): nothing runs, nothing to checkpoint.
    assert job(kube, "submit", "--name", "pending")[0] == 0
    pending = admitted_workload(kube, "pending")
    kube.workloads[pending]["status"]["conditions"] = [{"type": "QuotaReserved", "status": "False"}]
    kube.requests.clear()
    rc, text = job(kube, "stop", "--job", "pending")
    assert rc == 0 and "deactivated" not in text
    assert [m for m, _, _ in kube.requests if m in {"PATCH", "DELETE"}] == ["DELETE"]


def test_submitted_entrypoint_and_runtime_env_are_synthesis_own(synthesized: Any) -> None:
    """The RayJob dev's Workload stack deploys, from its synthesized template (tokens resolved to
    what CloudFormation gives them), against what submit renders for the same settings."""
    from k8s.chart import JobOwner, submitted_rayjob
    from tests.test_workload_stack import _manifests

    s = synthesized["dev"]
    template = s.template("Workload")
    (bucket_id,) = [
        k
        for k, r in template["Resources"].items()
        if r["Type"] == "AWS::S3::Bucket" and "BucketName" in r["Properties"]
    ]
    asset = "s3://ASSET-BUCKET/ASSET.zip"

    def text(part: Any) -> str:
        if isinstance(part, str):
            return part
        if part == {"Ref": bucket_id}:
            return template["Resources"][bucket_id]["Properties"]["BucketName"]
        return "\0"  # the asset's bucket and key

    for resource in _manifests(template).values():
        manifest = resource["Properties"]["Manifest"]
        if isinstance(manifest, dict):
            manifest = "".join(text(p) for p in manifest["Fn::Join"][1])
        objects = [o for o in json.loads(manifest) if o["kind"] == "RayJob"]
        if objects:
            (deployed,) = objects
    submitted = submitted_rayjob(
        s.settings,
        name="rs-x",
        code_uri=asset,
        checkpoint_uri=checkpoint_uri(s.settings),
        owner=JobOwner(uid="u"),
    )
    # The entry points differ only in the run and the job they name: a deployed job trains a run of
    # its own (k8s/job.py deployed_run_name), a submitted one job.run_name; each names its RayJob.
    from k8s.job import deployed_run_name

    name = deployed["metadata"]["name"]
    own = {
        "--run-name": (deployed_run_name(s.settings, name), s.settings.job.run_name),
        "--job-id": (name, "rs-x"),
    }
    words = [shlex.split(j["spec"]["entrypoint"]) for j in (deployed, submitted)]
    for flag, values in own.items():
        assert tuple(w[w.index(flag) + 1] for w in words) == values
    for w in words:
        for flag in own:
            del w[w.index(flag) : w.index(flag) + 2]
    assert words[0] == words[1]
    runtime = json.loads(deployed["spec"]["runtimeEnvYAML"])
    # The one difference: where the code lies (CDK's asset bucket vs the checkpoint bucket's code/).
    assert runtime["working_dir"].startswith(f"s3://cdk-hnb659fds-assets-{s.settings.account}-")
    assert (
        json.dumps({**runtime, "working_dir": asset}, sort_keys=True) == submitted["spec"]["runtimeEnvYAML"]
    )
    # And the rest of the spec too: one way to build a RayJob.
    assert {k: v for k, v in deployed["spec"].items() if k not in ("runtimeEnvYAML", "entrypoint")} == {
        k: v for k, v in submitted["spec"].items() if k not in ("runtimeEnvYAML", "entrypoint")
    }


def test_submitted_code_unpacks_like_the_synthesized_asset(synthesized: Any, tmp_path: Path) -> None:
    from ray._private.runtime_env.packaging import unzip_package

    from raytrain.job import code

    zipped = code.build(tmp_path)
    assert (
        code.build(tmp_path / "again" if (tmp_path / "again").mkdir() is None else tmp_path).sha256
        == zipped.sha256
    )
    unzip_package(str(zipped.path), str(tmp_path / "wd"), remove_top_level_directory=True, unlink_zip=False)
    directory = synthesized["dev"].directory
    assets = json.loads((directory / "RayTrain-dev-Workload.assets.json").read_text())["files"]
    (staged,) = [
        directory / a["source"]["path"]
        for a in assets.values()
        if a["source"].get("packaging") == "zip"
        and list((directory / a["source"]["path"]).rglob("__main__.py"))
    ]
    ours = {
        p.relative_to(tmp_path / "wd").as_posix(): p.read_bytes()
        for p in (tmp_path / "wd").rglob("*")
        if p.is_file()
    }
    theirs = {
        p.relative_to(staged / "job").as_posix(): p.read_bytes()
        for p in (staged / "job").rglob("*")
        if p.is_file()
    }
    assert ours == theirs


def test_dry_run_renders_the_rayjob_offline_when_no_cluster_is_reachable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The RayJob on stdout (valid against the CRD), the one line on stderr; nothing uploaded."""
    from raytrain.job.submit import OFFLINE_OWNER_UID

    argv = ["job", "submit", "--env", ENV, "--team", TEAM, "--dry-run",
            "--kubeconfig", str(tmp_path / "absent")]  # fmt: skip
    rc = cli.main([*argv, "--set", "job.steps=20", "--set", "job.checkpoint_every=10"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    rayjob = json.loads(out)
    jsonschema.validate(rayjob, _schema())
    assert rayjob["metadata"]["ownerReferences"][0]["uid"] == OFFLINE_OWNER_UID
    assert "rendered offline" in err and "no kubeconfig" in err and len(err.strip().splitlines()) == 1


def test_dry_run_with_the_cluster_reads_the_anchor_and_creates_nothing(
    kube: Kube, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["job", "submit", "--env", ENV, "--team", TEAM, "--dry-run",  # type: ignore[attr-defined]
                   "--kubeconfig", str(kube.kubeconfig),
                   "--set", "job.steps=10", "--set", "job.checkpoint_every=5"])  # fmt: skip
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    assert json.loads(out)["metadata"]["ownerReferences"][0]["uid"] == ANCHOR_UID
    assert [r[0] for r in kube.requests] == ["GET", "GET"] and not kube.jobs


def test_errors_go_to_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["job", "status", "--env", ENV, "--team", TEAM, "--kubeconfig", str(tmp_path / "absent")],
        ["job", "submit", "--env", ENV, "--team", TEAM, "--set", "job.steps=nope"],
        ["job", "submit", "--env", ENV, "--team", TEAM, "--set", "job.deploy=true"],
    ):
        rc = cli.main(argv)
        out, err = capsys.readouterr()
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, (argv, out, err)


def test_submit_reads_the_environment_file_once(
    kube: Kube, s3: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's settings (with --set) and the file's own (the deployed grants) come from one read
    of the environment file, handed down; the refusal still names the deployed grants."""
    import config.loader as loader

    reads: list[str] = []
    real = loader._read
    monkeypatch.setattr(loader, "_read", lambda name, directory: reads.append(name) or real(name, directory))
    rc, text = job(kube, "submit", "--set", "job.data=s3://someone-elses-bucket/corpus")
    assert rc == 2 and "is not readable by the Ray pods' role" in " ".join(text.split()), text
    assert reads == [ENV]
    assert _code_objects(s3, settings) == [] and not kube.jobs


def test_load_with_overrides_gives_the_files_own_settings_beside() -> None:
    from config.loader import load_with_overrides

    with_set, own = load_with_overrides(ENV, ["job.steps=70"])
    assert own is not None and with_set.job.steps == 70 and own.job.steps != 70
    assert own == load_settings(ENV)
    alone, same = load_with_overrides(ENV, [])
    assert alone is same


def test_a_gated_model_unreadable_with_the_token_is_refused_before_anything_is_uploaded(
    kube: Kube, s3: Any, settings: Any, hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """job.hf_token_secret names a Secrets Manager secret (moto server); the hub stub gates the
    model for another token: refused in one line, nothing uploaded, the token never printed."""
    from config.loader import ENVIRONMENTS_DIR

    endpoint = s3.meta.endpoint_url
    secrets = boto3.client("secretsmanager", region_name=REGION, endpoint_url=endpoint)
    arn = secrets.create_secret(Name="hf-gated-test", SecretString="hf_mine")["ARN"]
    hub.gated[settings.job.model] = {"hf_theirs"}
    # The environment file names the secret (the pods' role is granted it at deploy, not per job).
    text = (ENVIRONMENTS_DIR / f"{ENV}.yaml").read_text()
    (tmp_path / f"{ENV}.yaml").write_text(
        text.replace("  run_name: dev-smoke\n", f"  run_name: dev-smoke\n  hf_token_secret: {arn}\n")
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", endpoint)
    try:
        rc, text = job(kube, "submit", "--config-dir", str(tmp_path))
    finally:
        secrets.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)
    assert rc == 2 and f"job.model: {settings.job.model} is gated" in text, text
    assert "hf_mine" not in text and len(text.strip().splitlines()) == 1
    assert _code_objects(s3, settings) == [] and not kube.jobs
    assert hub.tokens_seen[-1] == "hf_mine"

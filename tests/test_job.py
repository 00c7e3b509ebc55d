"""`raytrain job status|logs|dashboard` against a fake Kubernetes API server on 127.0.0.1.

As in test_verify.py: the official client does the real work (kubeconfig, URLs, query strings,
streaming); the server answers the paths it calls with objects shaped like KubeRay 1.7.0's.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from rich.console import Console

from config.loader import load_settings
from config.settings import Settings
from raytrain import cli, job

ENV = "dev"
# dev has two teams (config/environments/dev.yaml): the jobs run in the first one's namespace.
TEAM = "research"
JOB = "qwen25-fsdp2-5f3a9c"
OLD_JOB = "qwen25-fsdp2-0aa111"
CLUSTER = f"{JOB}-raycluster-8kq2x"
TOKEN = "s3cr3t-token-value"


# --- objects ---------------------------------------------------------------------------------------


def _pod(name: str, labels: dict[str, str], container: str, *, ready: bool = True, node: str = "n") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "creationTimestamp": "2026-11-30T10:00:00Z"},
        "spec": {"nodeName": node, "containers": [{"name": container, "image": "i"}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": container, "restartCount": 1 if not ready else 0}],
        },
    }


def _rayjob(name: str, created: str, status: dict[str, Any], ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": name,
            "namespace": ns,
            "creationTimestamp": created,
            "labels": {"app.kubernetes.io/part-of": "ray-train", "ray-train/origin": "deployed"},
        },
        "spec": {"entrypoint": "python -m training", "submissionMode": "K8sJobMode"},
        "status": status,
    }


def cluster_routes(settings: Settings) -> dict[str, Any]:
    ns = settings.workload.namespace
    workers = settings.job.nodes
    jobs = [
        _rayjob(
            OLD_JOB,
            "2026-11-29T08:00:00Z",
            {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED", "endTime": "2026-11-29T09:00:00Z"},
            ns,
        ),
        _rayjob(
            JOB,
            "2026-11-30T10:00:00Z",
            {
                "jobDeploymentStatus": "Running",
                "jobStatus": "RUNNING",
                "rayClusterName": CLUSTER,
                "startTime": "2026-11-30T10:00:05Z",
            },
            ns,
        ),
    ]
    raycluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": CLUSTER, "namespace": ns},
        "spec": {"rayVersion": settings.workload.ray_version, "authOptions": {"mode": "token"}},
        "status": {
            "state": "ready",
            "readyWorkerReplicas": workers,
            "desiredWorkerReplicas": workers,
            "head": {"podName": f"{CLUSTER}-head-abcde", "podIP": "10.0.0.12"},
            "conditions": [{"type": "HeadPodReady", "status": "True"}],
        },
    }
    pods = [
        _pod(
            f"{JOB}-sub1",
            {"batch.kubernetes.io/job-name": JOB, "job-name": JOB},
            "ray-job-submitter",
        ),
        _pod(
            f"{CLUSTER}-head-abcde",
            {"ray.io/cluster": CLUSTER, "ray.io/node-type": "head"},
            "ray-head",
        ),
    ]
    pods += [
        _pod(
            f"{CLUSTER}-gpu-worker-{i}",
            {"ray.io/cluster": CLUSTER, "ray.io/node-type": "worker", "ray.io/group": "gpu"},
            "ray-worker",
            node=f"gpu-{i}",
        )
        for i in range(workers)
    ]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": CLUSTER, "namespace": ns},
        "data": {"auth_token": base64.b64encode(TOKEN.encode()).decode()},
    }
    return {
        f"/apis/ray.io/v1/namespaces/{ns}/rayjobs": {"kind": "RayJobList", "items": jobs},
        f"/apis/ray.io/v1/namespaces/{ns}/rayclusters/{CLUSTER}": raycluster,
        f"/api/v1/namespaces/{ns}/pods": {"kind": "PodList", "items": pods},
        f"/api/v1/namespaces/{ns}/secrets/{CLUSTER}": secret,
    }


# --- the fake API server ---------------------------------------------------------------------------


class FakeApi(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes: dict[str, Any] = {}
        self.logs: dict[str, list[str]] = {}  # pod name -> lines
        self.follow_delay = 0.05
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeApi
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        self.server.requests.append(self.path)
        if url.path.endswith("/log"):
            self._log(url.path.split("/")[-2], query)
            return
        body = self.server.routes.get(url.path)
        if body is None:
            self._json(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})
            return
        body = copy.deepcopy(body)
        selector = query.get("labelSelector", [""])[0]
        if selector and "items" in body:
            want = dict(part.split("=", 1) for part in selector.split(","))
            body["items"] = [
                i for i in body["items"] if all(i["metadata"]["labels"].get(k) == v for k, v in want.items())
            ]
        self._json(200, body)

    def _log(self, pod: str, query: dict[str, list[str]]) -> None:
        lines = self.server.logs.get(pod)
        if lines is None:
            self._json(
                400,
                {
                    "kind": "Status",
                    "status": "Failure",
                    "message": f'container "x" in pod "{pod}" is waiting to start: ContainerCreating',
                    "reason": "BadRequest",
                    "code": 400,
                },
            )
            return
        if "tailLines" in query:
            lines = lines[-int(query["tailLines"][0]) :]
        follow = query.get("follow", ["false"])[0] == "true"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for line in lines:
            data = (line + "\n").encode()
            # Split multi-byte characters across chunks, as a real stream may.
            for part in (data[:3], data[3:]):
                if part:
                    self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                    self.wfile.flush()
            if follow:
                time.sleep(self.server.follow_delay)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _json(self, code: int, body: dict[str, Any]) -> None:
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
    return load_settings(ENV).for_team(TEAM)


def run(tmp_path: Path, server: FakeApi, *argv: str, **kwargs: Any) -> tuple[int, str]:
    kc = server.kubeconfig
    args = cli.build_parser().parse_args(
        ["job", *argv, "--env", ENV, "--team", TEAM, "--kubeconfig", str(kc)]
    )
    console = Console(record=True, width=250, force_terminal=False)
    rc = args.func(args, console=console, **kwargs)
    return rc, console.export_text()


# --- status ----------------------------------------------------------------------------------------


def test_status_shows_the_newest_job_its_cluster_and_pods(
    tmp_path: Path, api_server: FakeApi, settings: Settings
) -> None:
    api_server.routes = cluster_routes(settings)
    rc, text = run(tmp_path, api_server, "status")
    assert rc == 0, text
    job_rows = [line for line in text.splitlines() if "qwen25-fsdp2-" in line and "RUNNING" in line]
    assert len(job_rows) == 1 and "▶" in job_rows[0] and CLUSTER in job_rows[0]
    assert OLD_JOB in text and "SUCCEEDED" in text
    # Newest first.
    assert text.index(JOB) < text.index(OLD_JOB)
    assert f"RayCluster ray/{CLUSTER}" in text.replace(settings.workload.namespace + "/", "ray/")
    n = settings.job.nodes
    assert f"{n}/{n}" in text
    for role in ("submitter", "head", "worker"):
        assert role in text
    assert text.count("-gpu-worker-") == n


def test_status_shows_the_jobs_progress_from_its_driver_log(
    tmp_path: Path, api_server: FakeApi, settings: Settings
) -> None:
    """Issue 41: step, percent, loss, the latest held-out loss, rate and ETA, as the driver last
    printed them (training/reporting/progress.py) in the submitter's log."""
    api_server.routes = cluster_routes(settings)
    api_server.logs = {f"{JOB}-sub1": [
        "[train] data: 40 blocks of 2048 tokens in 1 shards (s3://b/p/manifest.json)",
        "[train] step 50/200 (25%) | loss 2.1000 | 48,900 tok/s | mem 9.10 GiB | data wait 0.4 ms | "
        "eval loss 2.3000 | ppl 9.97 | acc 51.0% | ETA 9m10s",
        "[train] step 51/200 (25%) | loss 2.0500 | 49,100 tok/s | mem 9.10 GiB | data wait 0.3 ms | "
        "ETA 9m05s",
    ]}  # fmt: skip
    rc, text = run(tmp_path, api_server, "status")
    assert rc == 0, text
    assert (
        "progress: step 51/200 (25%), loss 2.0500, held-out loss 2.3000 (step 50), 49,100 tokens/s, ETA 9m05s"
    ) in " ".join(text.split())
    api_server.logs = {}  # the submitter not started yet: no progress, no error
    rc, text = run(tmp_path, api_server, "status")
    assert rc == 0 and "progress:" not in text, text
    # Issue 53: stop notices, counted apart from failures, with the steps each cost.
    api_server.logs = {f"{JOB}-sub1": [
        "[train] step 90/200 (45%) | loss 1.9000 | 49,000 tok/s | mem 9.10 GiB | data wait 0.3 ms | "
        "preempted 2 (lost 0, 7 steps) | ETA 8m00s",
    ]}  # fmt: skip
    rc, text = run(tmp_path, api_server, "status")
    assert rc == 0, text
    assert "preempted 2x (steps lost: 0, 7)" in " ".join(text.split()), text


def test_status_of_a_failed_job_exits_one(tmp_path: Path, api_server: FakeApi, settings: Settings) -> None:
    routes = cluster_routes(settings)
    ns = settings.workload.namespace
    newest = routes[f"/apis/ray.io/v1/namespaces/{ns}/rayjobs"]["items"][1]
    newest["status"] = {
        "jobDeploymentStatus": "Failed",
        "jobStatus": "FAILED",
        "message": "transport gate: NCCL used Socket, expected efa",
        "rayClusterName": CLUSTER,
    }
    del routes[f"/apis/ray.io/v1/namespaces/{ns}/rayclusters/{CLUSTER}"]
    api_server.routes = routes
    rc, text = run(tmp_path, api_server, "status")
    assert rc == 1
    assert "transport gate: NCCL used Socket" in text
    assert "not found" in text  # its cluster is gone
    assert "failed" in text


def test_status_shows_the_line_a_refused_input_ended_with(
    tmp_path: Path, api_server: FakeApi, settings: Settings
) -> None:
    """What Ray's job supervisor writes for a failed entry point, and KubeRay copies into the
    RayJob's status: the exit code and the CLI's one line, not the whole log tail."""
    routes = cluster_routes(settings)
    ns = settings.workload.namespace
    newest = routes[f"/apis/ray.io/v1/namespaces/{ns}/rayjobs"]["items"][1]
    line = "python -m training: error: checkpoint b/run/ckpt (step 50): train_state.json is not valid JSON"
    newest["status"] = {
        "jobDeploymentStatus": "Failed",
        "jobStatus": "FAILED",
        "message": "Job entrypoint command failed with exit code 4, last available logs (truncated to "
        f"20,000 chars):\n[train] data: 10 blocks\n(RayTrainWorker pid=1) Traceback ...\n{line}\n",
        "rayClusterName": CLUSTER,
    }
    api_server.routes = routes
    rc, text = run(tmp_path, api_server, "status")
    assert rc == 1
    flat = " ".join(text.split())
    assert "exit code 4: python -m training: error: checkpoint" in flat, text
    assert "Traceback" not in text and "20,000" not in text


def test_status_picks_a_job_by_name_and_names_the_choices(
    tmp_path: Path, api_server: FakeApi, settings: Settings
) -> None:
    api_server.routes = cluster_routes(settings)
    rc, text = run(tmp_path, api_server, "status", "--job", OLD_JOB)
    assert rc == 0
    (row,) = [line for line in text.splitlines() if "▶" in line]
    assert OLD_JOB in row
    rc, text = run(tmp_path, api_server, "status", "--job", "nope")
    assert rc == 2
    assert "no RayJob 'nope'" in text and OLD_JOB in text and JOB in text


def test_status_without_kuberay_or_jobs(tmp_path: Path, api_server: FakeApi, settings: Settings) -> None:
    api_server.routes = {}
    rc, text = run(tmp_path, api_server, "status")
    assert rc == 2 and "KubeRay operator installed" in text
    ns = settings.workload.namespace
    api_server.routes = {f"/apis/ray.io/v1/namespaces/{ns}/rayjobs": {"items": []}}
    rc, text = run(tmp_path, api_server, "status")
    assert rc == 0 and "no RayJob in namespace" in text


# --- logs ------------------------------------------------------------------------------------------


def _logs(tmp_path: Path, server: FakeApi, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc, text = run(tmp_path, server, "logs", *argv)
    return rc, capsys.readouterr().out + text


def test_logs_default_to_the_submitter(
    tmp_path: Path, api_server: FakeApi, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    api_server.routes = cluster_routes(settings)
    api_server.logs = {f"{JOB}-sub1": ["[train] step 1/200 | loss 11.9 | 48,900 tok/s", "ünïcode ✓"]}
    rc, out = _logs(tmp_path, api_server, capsys)
    assert rc == 0, out
    assert "[train] step 1/200 | loss 11.9 | 48,900 tok/s\nünïcode ✓\n" in out
    (req,) = [r for r in api_server.requests if r.split("?")[0].endswith("/log")]
    assert f"/pods/{JOB}-sub1/log" in req and "container=ray-job-submitter" in req
    assert "follow=false" in req or "follow" not in req


def test_logs_of_head_and_worker_with_follow_and_tail(
    tmp_path: Path, api_server: FakeApi, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    api_server.routes = cluster_routes(settings)
    head, worker1 = f"{CLUSTER}-head-abcde", f"{CLUSTER}-gpu-worker-1"
    api_server.logs = {
        head: ["gcs up", "dashboard up"],
        worker1: [f"NET/OFI line {i}" for i in range(10)],
    }
    rc, out = _logs(tmp_path, api_server, capsys, "--head")
    assert rc == 0 and "gcs up\ndashboard up\n" in out
    if settings.job.nodes < 2:
        pytest.skip("needs two workers")
    rc, out = _logs(tmp_path, api_server, capsys, "--worker", "1", "--follow", "--tail", "3")
    assert rc == 0, out
    assert "NET/OFI line 7\nNET/OFI line 8\nNET/OFI line 9\n" in out and "line 6" not in out
    req = next(r for r in api_server.requests if f"/pods/{worker1}/log" in r)
    assert "follow=true" in req and "tailLines=3" in req and "container=ray-worker" in req
    # By name too.
    rc, out = _logs(tmp_path, api_server, capsys, "--worker", worker1)
    assert rc == 0 and "NET/OFI line 0" in out


def test_logs_errors_name_what_exists(
    tmp_path: Path, api_server: FakeApi, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    api_server.routes = cluster_routes(settings)
    rc, out = _logs(tmp_path, api_server, capsys, "--worker", "99")
    assert rc == 2 and "--worker 99" in out and "-gpu-worker-0" in out
    rc, out = _logs(tmp_path, api_server, capsys, "--head")  # no log route: still creating
    assert rc == 2 and "waiting to start: ContainerCreating" in out
    rc, out = _logs(tmp_path, api_server, capsys, "--job", OLD_JOB)  # finished: submitter removed
    assert rc == 2 and "no submitter pod" in out


# --- dashboard -------------------------------------------------------------------------------------


def test_dashboard_prints_token_help_and_forwards_with_kubectl(
    tmp_path: Path, api_server: FakeApi, settings: Settings
) -> None:
    api_server.routes = cluster_routes(settings)
    seen: list[list[str]] = []

    def runner(cmd: list[str]) -> int:
        seen.append(cmd)
        return 0

    rc, text = run(tmp_path, api_server, "dashboard", "--port", "18265", runner=runner)
    assert rc == 0, text
    ns = settings.workload.namespace
    assert "http://127.0.0.1:18265" in text
    assert f"Secret {ns}/{CLUSTER}, key auth_token" in text
    assert "RAY_AUTH_MODE=token" in text and "ray-authentication-token" in text
    assert TOKEN not in text  # only with --print-token
    (cmd,) = seen
    kc = str(api_server.kubeconfig)
    assert cmd == [
        "kubectl",
        "--kubeconfig",
        kc,
        "-n",
        ns,
        "port-forward",
        f"pod/{CLUSTER}-head-abcde",
        "18265:8265",
        "--address",
        "127.0.0.1",
    ]
    rc, text = run(tmp_path, api_server, "dashboard", "--print-token", "--no-forward", runner=runner)
    assert rc == 0 and f"token: {TOKEN}" in text and len(seen) == 1


def test_dashboard_runs_real_kubectl_from_path(
    tmp_path: Path, api_server: FakeApi, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in kubectl on PATH records its argv: the command really runs as a subprocess.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "argv.json"
    fake = bindir / "kubectl"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    api_server.routes = cluster_routes(settings)
    rc, text = run(tmp_path, api_server, "dashboard")
    assert rc == 0, text
    argv = json.loads(record.read_text())
    ns = settings.workload.namespace
    assert argv == [
        "--kubeconfig",
        str(api_server.kubeconfig),
        "-n",
        ns,
        "port-forward",
        f"pod/{CLUSTER}-head-abcde",
        "8265:8265",
        "--address",
        "127.0.0.1",
    ]


def test_dashboard_without_token_auth_or_head(
    tmp_path: Path, api_server: FakeApi, settings: Settings
) -> None:
    routes = cluster_routes(settings)
    ns = settings.workload.namespace
    routes[f"/apis/ray.io/v1/namespaces/{ns}/rayclusters/{CLUSTER}"]["spec"]["authOptions"] = {
        "mode": "disabled"
    }
    api_server.routes = routes
    rc, text = run(tmp_path, api_server, "dashboard", "--no-forward")
    assert rc == 0 and "needs no token" in text
    routes[f"/api/v1/namespaces/{ns}/pods"]["items"] = [
        p for p in routes[f"/api/v1/namespaces/{ns}/pods"]["items"] if "head" not in p["metadata"]["name"]
    ]
    rc, text = run(tmp_path, api_server, "dashboard", "--no-forward")
    assert rc == 2 and "no head pod" in text


def test_kuberay_check_name_matches_the_operator() -> None:
    # utils.CheckName: keep the last 50 characters; a leading digit or punctuation becomes 'r'.
    assert job.kuberay_check_name("ray-train") == "ray-train"
    long = "a" * 10 + "-" + "b" * 49
    assert job.kuberay_check_name(long) == "r" + "b" * 49
    assert job.kuberay_check_name("9job") == "rjob"


# --- credentials and kubeconfig --------------------------------------------------------------------


def test_missing_kubeconfig_and_refused_credentials(
    tmp_path: Path, api_server: FakeApi, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = cli.main(["job", "status", "--env", ENV, "--team", TEAM, "--kubeconfig", str(tmp_path / "nope")])
    out, err = capsys.readouterr()  # the error on stderr, nothing on stdout
    assert rc == 2 and out == "" and "no kubeconfig at" in err and "aws eks update-kubeconfig" in err

    class Forbidden(_Handler):
        def do_GET(self) -> None:
            self._json(403, {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403})

    api_server.RequestHandlerClass = Forbidden
    for action in ("status", "logs", "dashboard"):
        rc, text = run(tmp_path, api_server, action)
        assert rc == 2 and "refused" in text and "access entry" in text, action


def test_exec_credential_plugin_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # What `aws eks update-kubeconfig` writes: an exec plugin; here its command does not exist.
    kc = tmp_path / "kc"
    kc.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "eks", "cluster": {"server": "https://127.0.0.1:9"}}],
                "users": [
                    {
                        "name": "me",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1beta1",
                                "command": "aws-not-installed-here",
                                "args": ["eks", "get-token", "--cluster-name", "x"],
                            }
                        },
                    }
                ],
                "contexts": [{"name": "c", "context": {"cluster": "eks", "user": "me"}}],
                "current-context": "c",
            }
        )
    )
    rc = cli.main(["job", "status", "--env", ENV, "--team", TEAM, "--kubeconfig", str(kc)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and "raytrain job status" in err
    assert "Traceback" not in err


def test_cli_help_lists_the_actions() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "raytrain", "job", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for action in ("status", "logs", "dashboard"):
        assert action in out


def test_default_job_is_the_newest_unfinished_one() -> None:
    ns = "ray"
    running = _rayjob("rj-train", "2026-11-30T10:00:00Z", {"jobDeploymentStatus": "Running"}, ns)
    done = _rayjob("rj-prep", "2026-11-30T11:00:00Z", {"jobDeploymentStatus": "Complete"}, ns)
    assert job.select_job([running, done], None, ns) is running
    finished = _rayjob("rj-old", "2026-11-29T10:00:00Z", {"jobDeploymentStatus": "Failed"}, ns)
    assert job.select_job([finished, done], None, ns) is done  # all finished: the newest
    assert job.select_job([], None, ns) is None

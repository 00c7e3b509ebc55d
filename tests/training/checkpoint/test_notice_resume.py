"""Real processes on local Ray clusters started as the pods start them (`ray start --block`: a head
without CPUs, a worker node with the two training workers), stopped as Kubernetes stops the pods: the
pod's preStop hook (the chart's own script, with the real `ray drain-node`) and then SIGKILL (KubeRay
runs `ray start` under a shell, the container's first process, which ignores SIGTERM: the kubelet's
SIGKILL at the end of the grace period ends it; here it comes at once, the harder case).

1. A GPU worker pod is deleted alone (Spot reclaim, node drain): its preStop drains its Ray node, every
   rank writes a checkpoint at the same step, the run ends as preempted (exit 75, --max-preemptions 0).
2. The same job runs again on a new node and resumes; then the whole RayCluster is deleted (a Kueue
   preemption, `raytrain job stop`): head and worker preStops run at once, the head's drains the run's
   worker and waits until the controller registered the checkpoint on notice, then every pod and the
   driver are killed.
3. The same job runs again on a new cluster, resumes at that step, counts two preemptions that cost no
   step, and ends with the losses of an uninterrupted run.

Its own clusters, not the shared `ray_session`: that one turns Ray Train's preemption watcher off."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from training.checkpoint import notice
from training.common.stop_notice import PRESTOP_MARGIN_S, head_prestop_script, prestop_script

pytestmark = [pytest.mark.ray, pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")]

ROOT = Path(__file__).resolve().parents[3]
STEPS = 60
ARGS = [
    "--init", "random", "--shape", "tiny", "--data", "random", "--seq-len", "64",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--num-workers", "2",
    "--steps", str(STEPS), "--checkpoint-every", "50", "--report-every", "100",
    "--lr", "1e-3", "--seed", "7", "--max-failures", "0", "--log-every", "1",
    "--no-export",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


GRACE_S = 40  # the pods' terminationGracePeriodSeconds here (the chart sizes it from the checkpoint)


class Pod:
    """A Ray node's `ray start --block` process, with its pod's own notice folder."""

    def __init__(self, proc: subprocess.Popen[bytes], env: dict[str, str]) -> None:
        self.proc, self.env = proc, env

    @property
    def notice_dir(self) -> Path:
        return Path(self.env[notice.NOTICE_DIR_ENV])

    def prestop(self, script: str) -> subprocess.Popen[bytes]:
        """The pod's preStop hook: in the container, with the image's bash and ray CLI."""
        return subprocess.Popen(["/bin/bash", "-c", script], env=self.env, start_new_session=True)

    def kill(self) -> None:
        """The pod's end: every process of it (its group: `ray start` and what it started)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)


class LocalCluster:
    """`ray start` processes as on the pods: the head, and worker nodes added and removed."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.tmp = tmp / name
        self.tmp.mkdir()
        # Short: Ray's Unix sockets live under it (a socket path holds at most 107 bytes).
        self.ray_tmp = tempfile.mkdtemp(prefix="rt-", dir="/tmp")
        self.address = f"127.0.0.1:{_free_port()}"
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "disabled",
            "RAY_TMPDIR": self.ray_tmp,
            # KubeRay sets it in every Ray container (ray-operator/controllers/ray/common/pod.go,
            # v1.7.0): what `ray drain-node` in the preStop hooks connects to.
            "RAY_ADDRESS": self.address,
            "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
            "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5",
            "RAY_TRAIN_METRICS_ENABLED": "0",
            "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1",
            # The pod's grace period less the preStop's margin, as k8s/cluster.py sets it.
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(GRACE_S - PRESTOP_MARGIN_S),
        }
        self.pods: list[Pod] = []
        self.driver: subprocess.Popen[str] | None = None
        self.head = self._start("head", [
            "--head", f"--port={self.address.split(':')[1]}", "--num-cpus=0",
            f"--ray-client-server-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}",
            "--include-dashboard=false", f"--temp-dir={self.ray_tmp}",
        ])  # fmt: skip

    def _start(self, name: str, args: list[str]) -> Pod:
        env = {**self.env, notice.NOTICE_DIR_ENV: str(self.tmp / f"{name}-notice")}
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 (the process's)
        proc = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--node-ip-address=127.0.0.1",
             *args],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.pods.append(Pod(proc, env))
        return self.pods[-1]

    def _cpu_nodes(self) -> dict[str, bool]:
        """Node id -> alive, of the nodes with CPUs (the head has none)."""
        import ray._raylet

        try:
            nodes = ray._raylet.GcsClient(address=self.address).get_all_node_info(timeout=5)
        except Exception:  # the GCS not up yet
            return {}
        return {
            str(k): n.state == 0  # GcsNodeInfo.ALIVE
            for k, n in nodes.items()
            if n.resources_total.get("CPU", 0) > 0
        }

    def add_worker_node(self) -> Pod:
        """A node with 2 CPUs, returned once the cluster counts it as the one alive node with CPUs (a
        driver started earlier would see none, or the node just removed)."""
        known = set(self._cpu_nodes())
        args = [f"--address={self.address}", "--num-cpus=2", f"--dashboard-agent-listen-port={_free_port()}"]
        pod = self._start(f"worker-{len(self.pods)}", args)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            alive = {k for k, up in self._cpu_nodes().items() if up}
            if len(alive) == 1 and not alive & known:
                return pod
            time.sleep(0.5)
        raise AssertionError("the worker node did not join")

    def shutdown(self) -> None:
        """Every process at once: a SIGTERM would have each `ray start` drain its node first."""
        if self.driver is not None and self.driver.poll() is None:
            self.driver.kill()
        for pod in reversed(self.pods):
            pod.kill()
        shutil.rmtree(self.ray_tmp, ignore_errors=True)

    def train(self, storage: Path, name: str, *extra: str) -> subprocess.Popen[str]:
        """The job's driver, on the head (its notice folder: where the head's preStop looks)."""
        out = storage.parent / f"out-{name}"
        argv = [*ARGS, "--run-name", name, "--storage-path", str(storage),
                "--output-dir", str(out), "--address", self.address, *extra]  # fmt: skip
        self.driver = subprocess.Popen(
            [sys.executable, "-m", "training", *argv], cwd=ROOT, env=self.head.env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        return self.driver


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[Callable[[str], LocalCluster]]:
    pytest.importorskip("ray")
    made: list[LocalCluster] = []

    def make(name: str) -> LocalCluster:
        made.append(LocalCluster(tmp_path, name))
        return made[-1]

    try:
        yield make
    finally:
        for c in made:
            c.shutdown()


def _gist(out: str) -> str:
    """The lines that tell what happened, not the controller's tracebacks."""
    keep = ("[train]", "Error", "error:", "preempt", "Preempt", "drain", "SIGTERM", "python -m training")
    return "\n".join(x[:300] for x in out.splitlines() if any(k in x for k in keep))[-6000:]


def _until_step(proc: subprocess.Popen[str], step: int) -> list[str]:
    """The driver's output up to rank 0's progress line of `step` (relayed behind a Ray prefix)."""
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if f"[train] step {step}/" in line:
            return lines
    raise AssertionError(f"the run ended before step {step}:\n{_gist(''.join(lines))}")


def _stop_pods(*stops: tuple[Pod, str]) -> None:
    """Kubernetes deleting these pods: each preStop hook runs (all at once), then the container gets
    SIGTERM (`ray start` drains its own node on it, should it be the container's first process), and
    SIGKILL at the end of the grace period (`_kill_all`)."""
    hooks = [(pod, pod.prestop(script)) for pod, script in stops]
    for pod, hook in hooks:
        assert hook.wait(timeout=GRACE_S + 30) == 0
        if pod.proc.poll() is None:
            pod.proc.send_signal(signal.SIGTERM)


def _kill_all(*pods: Pod) -> None:
    for pod in pods:
        pod.kill()


def _saved(pod: Pod) -> int:
    return int((pod.notice_dir / notice.SAVED_FILE).read_text())


def test_stop_notices_checkpoint_end_preempted_and_the_job_resumes(
    clusters: Callable[[str], LocalCluster], tmp_path: Path
) -> None:
    first = clusters("first")
    node = first.add_worker_node()
    rc = first.train(tmp_path / "reference-storage", "reference").wait(timeout=400)
    assert rc == 0
    reference = json.loads((tmp_path / "out-reference" / "summary.json").read_text())
    assert reference["preemptions"] == []

    # 1. The worker pod deleted alone. The run ends at the first notice (Ray Train would otherwise
    # wait for a new node: the restart path).
    storage, job = tmp_path / "storage", ["--job-id", "rj-notice-0123456789", "--max-preemptions", "0"]
    proc = first.train(storage, "noticed", *job)
    lines = _until_step(proc, 5)
    _stop_pods((node, prestop_script(GRACE_S, str(node.notice_dir))))
    rest, _ = proc.communicate(timeout=400)
    _kill_all(node)
    out = "".join(lines) + rest
    assert proc.returncode == 75, _gist(out)
    one = _saved(node)
    assert 5 <= one < 50, _gist(out)  # between the periodic checkpoints: written on notice
    assert f"checkpoint on notice at step {one}" in out
    run_dir = storage / "noticed"
    snapshot = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())
    assert snapshot["latest_checkpoint_result"]["metrics"]["step"] == one
    record = json.loads((run_dir / "run.json").read_text())
    assert record["starts"][-1]["ended"] == "preempted" and record["starts"][-1]["at_step"] == one
    notices = json.loads((run_dir / notice.PREEMPTIONS_FILE).read_text())
    assert [n["step"] for n in notices] == [one] and notices[0]["ranks"] == [0, 1]

    # 2. A new node; the same job again resumes; then the whole RayCluster goes at once.
    node = first.add_worker_node()
    proc = first.train(storage, "noticed", *job)
    lines = _until_step(proc, one + 5)
    assert any(f"[train] resumed from step {one} " in x for x in lines), _gist("".join(lines))
    _stop_pods(
        (first.head, head_prestop_script(GRACE_S, str(first.head.notice_dir))),
        (node, prestop_script(GRACE_S, str(node.notice_dir))),
    )
    proc.kill()  # the driver goes with the head pod
    proc.wait(timeout=60)
    _kill_all(first.head, node)
    # The head's preStop waited for the checkpoint the driver's controller registered.
    two = int((first.head.notice_dir / f"{notice.SAVED_PREFIX}{proc.pid}").read_text())
    assert one + 5 <= two < 50 and _saved(node) == two
    snapshot = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())
    assert snapshot["latest_checkpoint_result"]["metrics"]["step"] == two
    notices = json.loads((run_dir / notice.PREEMPTIONS_FILE).read_text())
    assert [n["step"] for n in notices] == [one, two]
    first.shutdown()

    # 3. Kueue admits the job again: a new cluster, the same entry point.
    second = clusters("second")
    second.add_worker_node()
    proc = second.train(storage, "noticed", *job)
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, _gist(out)
    summary = json.loads((tmp_path / "out-noticed" / "summary.json").read_text())
    assert [r["from_step"] for r in summary["resumes"]] == [one, two]
    # Three starts of one run: the first ended preempted; the second's driver was killed with the
    # head (no end recorded); the third, the same job again without --resume, continued it.
    starts = summary["run"]["starts"]
    assert [s["from_step"] for s in starts] == [0, one, two]
    assert starts[0]["ended"] == "preempted" and "ended" not in starts[1]
    assert [(p["step"], p["lost_steps"]) for p in summary["preemptions"]] == [(one, 0), (two, 0)]
    assert [h["step"] for h in summary["history"]] == list(range(1, STEPS + 1))
    assert [h["loss"] for h in summary["history"]] == [h["loss"] for h in reference["history"]]
    assert "preempted 2 (lost 0, 0 steps)" in out, _gist(out)

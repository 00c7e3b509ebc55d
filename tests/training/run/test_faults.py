"""Real processes on local Ray: a SIGKILLed worker resumes from the last checkpoint and ends
bitwise-identical to an uninterrupted run with the same seed, both on real text read from prepared
shards (the sample, crossing an epoch boundary). Random token ids: the other runs here (their resume
position: tests/training/data/test_batches.py's random_sequences tests). A killed driver whose job runs
again (KubeRay's retry, Kueue's re-admission: the same --job-id) is tests/training/checkpoint/
test_notice_resume.py's: it resumes from the newest checkpoint with the losses of an uninterrupted run."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from training.checkpoint import dcp as checkpoint
from training.data import shards
from training.options.train import SAMPLE_DATA, parse_args
from training.run.driver import run

# Ray's own DeprecationWarnings (its DataContext) are not ours to fix.
pytestmark = [pytest.mark.ray, pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*")]

ROOT = Path(__file__).resolve().parents[3]
STEPS, EVERY = 24, 4
BASE = [
    "--init", "random", "--shape", "tiny", "--data", "random", "--seq-len", "64",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--num-workers", "2",
    "--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--report-every", "100",
    "--lr", "1e-3", "--seed", "5", "--max-failures", "2", "--log-every", "4",
]  # fmt: skip


def _argv(tmp: Path, name: str, data: str = "random") -> list[str]:
    return [*BASE, "--run-name", name, "--storage-path", str(tmp / "storage"),
            "--output-dir", str(tmp / name), "--data", data]  # fmt: skip


def _committed_step(run_dir: Path) -> int:
    """Step of the latest checkpoint Ray Train has registered (its snapshot), 0 if none."""
    snap = run_dir / "checkpoint_manager_snapshot.json"
    try:
        latest = json.loads(snap.read_text()).get("latest_checkpoint_result")
    except (OSError, ValueError):
        return 0
    return int(latest["metrics"]["step"]) if latest else 0


def _wait_for_checkpoint(run_dir: Path, at_least: int, timeout: float = 240) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        step = _committed_step(run_dir)
        if step >= at_least:
            return step
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint at step >= {at_least} in {run_dir} after {timeout} s")


def _weights(summary: dict[str, Any]) -> dict[str, torch.Tensor]:
    return checkpoint.full_model_state(summary["checkpoint"])


def _assert_same_run(got: dict[str, Any], ref: dict[str, Any]) -> None:
    assert got["steps"] == ref["steps"] == STEPS
    assert [h["step"] for h in got["history"]] == list(range(1, STEPS + 1))
    assert [h["loss"] for h in got["history"]] == [h["loss"] for h in ref["history"]]
    a, b = _weights(got), _weights(ref)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k  # bitwise


@pytest.fixture(scope="module")
def reference(ray_session: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Uninterrupted run on the sample text, which the driver prepares first into shards: the
    reference of both kills (one uninterrupted run for both: each Ray Train run here costs ~40 s)."""
    tmp = tmp_path_factory.mktemp("ref")
    summary = run(parse_args(_argv(tmp, "reference", str(SAMPLE_DATA))))
    assert summary["resumes"] == []
    assert (tmp / "reference" / "summary.json").is_file()
    if importlib.util.find_spec("matplotlib") is not None:  # the image has none: no plot there
        assert (tmp / "reference" / "training.png").stat().st_size > 0
    prepared = tmp / "storage" / "_prepared" / "reference"
    manifest = shards.read_manifest(str(prepared))
    assert manifest["blocks"] < STEPS * 8  # the run wraps into a second epoch
    assert summary["data_fingerprint"] == manifest["fingerprint"]
    return {**summary, "prepared": str(prepared)}


def test_sigkill_worker_resumes_bitwise(reference: dict[str, Any], ray_session: str, tmp_path: Path) -> None:
    """Workers read the shards the reference prepared; one is SIGKILLed, the restarted group
    reopens the shards and continues from the checkpoint's data position."""
    from ray.util.state import list_actors

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["summary"] = run(parse_args(_argv(tmp_path, "killed", reference["prepared"])))
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    committed = _wait_for_checkpoint(tmp_path / "storage" / "killed", EVERY)
    # This session's address: other Ray instances may run on the same machine.
    alive = [("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")]
    workers = list_actors(address=ray_session, filters=alive)
    assert len(workers) == 2, workers
    os.kill(int(workers[-1].pid), signal.SIGKILL)
    thread.join(timeout=400)
    assert not thread.is_alive(), "the run did not finish after the kill"
    assert "error" not in box, box.get("error")
    summary = box["summary"]

    assert len(summary["resumes"]) == 1, summary["resumes"]
    resumed = summary["resumes"][0]
    # Restarted from the newest checkpoint that existed at the kill (or one taken just after):
    # at most one checkpoint interval of steps was computed twice.
    assert committed <= resumed["from_step"] < STEPS
    assert resumed["from_step"] % EVERY == 0
    assert resumed["world_size"] == 2 and resumed["rng_restored"] is True
    # Rank 0 read its part of the checkpoint from the storage, not the whole of it.
    sizes = [
        sum(f.stat().st_size for f in d.iterdir())
        for d in (tmp_path / "storage" / "killed").glob("checkpoint_*")
        if d.is_dir()
    ]
    assert resumed["read_bytes"] < 0.6 * max(sizes), (resumed["read_files"], sizes)
    assert "rng-rank1.pt" not in resumed["read_files"] and "rng-rank0.pt" in resumed["read_files"]
    _assert_same_run(summary, reference)


def test_transport_gate_failure_stops_before_training(
    ray_session: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gloo traffic is not EFA: the gate stops the run on every rank, with no retries, exit 3."""
    from training.__main__ import main

    argv = [*_argv(tmp_path, "gate"), "--expect-transport", "efa"]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "expected efa" in err, err
    record = json.loads((tmp_path / "gate" / "summary.json").read_text())
    assert record["transport"]["ok"] is False
    assert record["transport"]["expect"] == "efa"
    assert not list((tmp_path / "storage" / "gate").glob("checkpoint_*"))  # not one step trained


def test_emulated_hosts_must_divide_the_workers_the_cluster_gives(
    ray_session: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --num-workers the count comes from the cluster (2 CPU workers here): checked in the
    driver, before any worker starts, with the usual one-line error."""
    from training.__main__ import main

    argv = _argv(tmp_path, "emu")
    at = argv.index("--num-workers")
    argv = [*argv[:at], *argv[at + 2 :], "--emulate-hosts", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--emulate-hosts: 3 hosts must divide the 2 workers" in err, err


@pytest.fixture(scope="module")
def two_hosts(ray_session: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One 2-step run of two workers as two emulated hosts, checkpointed at step 2, shared by two tests
    (a Ray Train run costs ~40 s here, nearly all of it starting processes): the emulated-hosts test
    reads its summary, the input-error test then corrupts its checkpoint and resumes from it."""
    from training.__main__ import main

    tmp = tmp_path_factory.mktemp("two-hosts")
    argv = _argv(tmp, "corrupt")
    at = argv.index("--steps")
    first = [*argv[:at], "--steps", "2", *argv[at + 2 :], "--checkpoint-every", "2", "--emulate-hosts", "2"]
    rc = main(first)
    summary = json.loads((tmp / "corrupt" / "summary.json").read_text()) if rc == 0 else None
    return {"argv": first, "at": at, "rc": rc, "summary": summary, "storage": tmp / "storage" / "corrupt"}


def test_emulated_hosts_count_as_nodes_and_auto_shards_one_worker_hosts_fully(
    two_hosts: dict[str, Any],
) -> None:
    """Two workers as two hosts (one NCCL_HOSTID each): the loop counts 2 nodes and the gate sees
    both; with one worker per host `auto` shards over both (HSDP there would only replicate),
    so the mesh is (2,), not (replicate, shard) = (2, 1)."""
    assert two_hosts["rc"] == 0
    summary = two_hosts["summary"]
    assert summary["nodes"] == 2 and summary["mesh"] == [2]
    assert summary["options"]["sharding"] == "auto"
    assert summary["transport"]["nodes"] == 2
    assert summary["transport"]["node_names"] == ["emulated-host-0", "emulated-host-1"]


def test_input_error_in_a_worker_stops_the_run_without_retries(
    two_hosts: dict[str, Any], ray_session: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A corrupt train_state.json in the checkpoint a run resumes from: every attempt would fail
    the same way, so the first worker error ends the run (no --max-failures restarts) and the
    driver prints one line naming the checkpoint, exit 4. (The first run is two_hosts's.)"""
    from ray.util.state import list_actors

    from training.__main__ import main
    from training.common.errors import INPUT_ERROR_EXIT

    first, at = two_hosts["argv"], two_hosts["at"]
    assert two_hosts["rc"] == 0
    (ckpt,) = [d for d in two_hosts["storage"].glob("checkpoint_*") if d.is_dir()]
    (ckpt / checkpoint.STATE_FILE).write_text('{"step": 2, "posit')
    capsys.readouterr()

    def workers() -> set[str]:
        return {
            a.actor_id
            for a in list_actors(address=ray_session, filters=[("class_name", "=", "RayTrainWorker")])
        }

    before = workers()
    assert main([*first[:at], "--steps", "4", *first[at + 2 :], "--resume"]) == INPUT_ERROR_EXIT
    started = workers() - before
    assert len(started) == 2, f"{len(started)} workers started: the run was retried"
    err = capsys.readouterr().err
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"python -m training: error: checkpoint {ckpt}"), last
    # Ray Train's worker and controller tracebacks of the input error stay in its log files.
    assert "Error in training function" not in err and "Error in control loop iteration" not in err, err
    assert "train_state.json is not valid JSON" in last and "--run-name" in last

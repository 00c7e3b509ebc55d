"""The bookkeeping of stop notices (training/checkpoint/notice.py): the run's notice file in the storage,
the steps each preemption cost as a resume sees them, and the driver's reading of Ray Train's errors."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from training.checkpoint import notice


def _entry(at: str, step: int) -> dict[str, object]:
    return {"at": at, "step": step, "nodes": ["n1"], "ranks": [0, 1], "notice_s": 110.0}


def test_notices_append_to_the_run_file_and_survive_a_cut_one(tmp_path: Path) -> None:
    notice.record_notice(str(tmp_path), "run", _entry("t1", 7))
    notice.record_notice(str(tmp_path), "run", _entry("t2", 19))
    assert [e["step"] for e in notice.run_notices(str(tmp_path), "run")] == [7, 19]
    (tmp_path / "run" / notice.PREEMPTIONS_FILE).write_text('[{"at": "t1", "st')  # the node went mid-write
    assert notice.run_notices(str(tmp_path), "run") == []
    assert notice.run_notices(str(tmp_path), "other") == []


def test_a_resume_counts_what_each_preemption_cost() -> None:
    saved = [{**_entry("t1", 7), "lost_steps": 0, "resumed_from": 7}, _entry("t2", 19)]
    # t3's checkpoint never completed: the run's file has it, the checkpoint resumed from (19) not.
    file = [_entry("t1", 7), _entry("t2", 19), _entry("t3", 26)]
    got = notice.preemptions_after_resume(saved, file, from_step=19)
    assert [(e["at"], e["lost_steps"]) for e in got] == [("t1", 0), ("t2", 0), ("t3", 7)]
    assert got[2]["resumed_from"] == 19


def test_the_prestop_script_waits_for_the_save_and_skips_pods_without_training(tmp_path: Path) -> None:

    script = notice.prestop_script(40, directory=str(tmp_path))
    assert "--deadline-remaining-seconds 35" in script
    # No training in the pod (no node id written): nothing to drain, nothing to wait for.
    done = subprocess.run(["/bin/bash", "-c", script], capture_output=True, timeout=10, check=False)
    assert done.returncode == 0 and done.stdout == b""


def test_the_head_prestop_waits_only_for_runs_whose_driver_is_alive(tmp_path: Path) -> None:
    """Two runs' drivers on one head (a standing cluster), files named by each driver's pid."""
    script = notice.head_prestop_script(40, directory=str(tmp_path))
    assert "--deadline-remaining-seconds 35" in script

    def hook() -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["/bin/bash", "-c", script], capture_output=True, timeout=10, check=False)

    # No run on this head, or its driver gone (its pid no longer alive): nothing to wait for.
    assert hook().returncode == 0
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / f"{notice.DRIVER_PREFIX}{gone.pid}").write_text(str(gone.pid))
    done = hook()
    assert done.returncode == 0 and done.stdout == b""
    # Two live drivers: the wait ends once each one's controller registered its checkpoint on
    # notice, or its driver ended.
    other = subprocess.Popen(["sleep", "60"])
    try:
        for pid in (os.getpid(), other.pid):
            (tmp_path / f"{notice.DRIVER_PREFIX}{pid}").write_text(str(pid))
        (tmp_path / f"{notice.SAVED_PREFIX}{os.getpid()}").write_text("7")
        waiting = subprocess.Popen(["/bin/bash", "-c", script])
        time.sleep(2)
        assert waiting.poll() is None  # the other run has not saved
        other.kill()
        other.wait()
        assert waiting.wait(timeout=10) == 0  # ... and its driver is gone
        # A live driver whose run saved: at once.
        assert hook().returncode == 0
    finally:
        other.kill()


def test_the_controller_callback_tells_the_head_which_nodes_and_when_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray")

    monkeypatch.setenv(notice.NOTICE_DIR_ENV, str(tmp_path))
    pid = os.getpid()
    workers, saved = tmp_path / f"{notice.WORKERS_PREFIX}{pid}", tmp_path / f"{notice.SAVED_PREFIX}{pid}"
    with notice.driver_running():
        assert (tmp_path / f"{notice.DRIVER_PREFIX}{pid}").read_text() == str(pid)
        cb = notice.head_notice()
        first = [{"step": 1, notice.NODE_METRIC: "n2"}, {"step": 1, notice.NODE_METRIC: "n1"}]
        cb.after_report(None, first, None)
        assert workers.read_text() == "n1 n2"
        cb.after_report(None, [{"step": 2}, {"step": 2}], None)  # later reports carry no node
        assert workers.read_text() == "n1 n2" and not saved.exists()
        cb.after_report(None, [{"step": 9, notice.SAVED_METRIC: 9}] * 2, object())
        assert saved.read_text() == "9"
        # Ray Train restarts the group on a new node: that checkpoint on notice is history.
        cb.after_report(None, [{"step": 10, notice.NODE_METRIC: "n3"}] * 2, None)
        assert workers.read_text() == "n3" and not saved.exists()
    # The run ended: nothing of it is left for the head's preStop.
    assert not list(tmp_path.iterdir())


def test_preemptions_are_told_from_failures() -> None:
    pytest.importorskip("ray")
    from ray.exceptions import ActorDiedError
    from ray.train.v2.api.exceptions import PreemptionError, WorkerGroupError
    from ray.train.v2.api.preemption import PreemptionInfo

    info = PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"n1": [0, 1]})
    assert notice.is_preemption(PreemptionError(info))
    lost = ActorDiedError()
    assert not notice.is_preemption(WorkerGroupError("workers failed", {0: lost}))
    lost._preempted = True  # Ray sets it from the death cause: an actor on a node drained for preemption
    assert notice.is_preemption(WorkerGroupError("workers failed", {0: lost}))
    try:
        raise RuntimeError("wrapped") from PreemptionError(info)
    except RuntimeError as exc:
        assert notice.is_preemption(exc)
    assert not notice.is_preemption(ValueError("a bug"))
    json.dumps(notice.prestop_script(30))  # one string the pod spec carries

"""The bookkeeping of stop notices (training/checkpoint/notice.py): the run's notice file in the storage,
the steps each preemption cost as a resume sees them, and the driver's reading of Ray Train's errors."""

from __future__ import annotations

import json
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
    import subprocess

    script = notice.prestop_script(40, directory=str(tmp_path))
    assert "--deadline-remaining-seconds 35" in script
    # No training in the pod (no node id written): nothing to drain, nothing to wait for.
    done = subprocess.run(["/bin/bash", "-c", script], capture_output=True, timeout=10, check=False)
    assert done.returncode == 0 and done.stdout == b""


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

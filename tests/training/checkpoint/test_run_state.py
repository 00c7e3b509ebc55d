"""A rerun never trains nothing in silence (issue 41, item 3): a run name with a checkpoint is
refused unless resumed on purpose (--resume, the same options but the step count, more steps) or
retried by the same job (--job-id); run.json keeps the options and every start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.checkpoint import run_state
from training.options.train import OptionError, TrainOptions, parse_args


def _opts(tmp: Path, *extra: str, steps: int = 50) -> TrainOptions:
    return parse_args([
        "--init", "random", "--shape", "tiny", "--data", "random", "--run-name", "r",
        "--storage-path", str(tmp / "storage"), "--output-dir", str(tmp / "out"),
        "--steps", str(steps), *extra,
    ])  # fmt: skip


def _start(opts: TrainOptions) -> dict:
    """What the driver does: check the start, then (every input accepted) record it."""
    record = run_state.begin(opts)
    run_state.record(opts, record)
    return record


def _checkpointed(tmp: Path, step: int) -> None:
    """What Ray Train leaves after a checkpoint at `step`: its manager's snapshot (the fields read)."""
    run = tmp / "storage" / "r"
    run.mkdir(parents=True, exist_ok=True)
    latest = {"checkpoint_dir_name": "checkpoint_x", "metrics": {"step": step, "loss": 1.0}}
    (run / run_state.SNAPSHOT).write_text(json.dumps({"latest_checkpoint_result": latest}))


def _record(tmp: Path) -> dict:
    return json.loads((tmp / "storage" / "r" / run_state.RUN_FILE).read_text())


def test_a_new_run_records_its_options_and_start(tmp_path: Path) -> None:
    record = _start(_opts(tmp_path, "--lr", "0.001"))
    assert record == _record(tmp_path)
    assert record["options"]["lr"] == 0.001
    assert [(s["from_step"], s["steps"], s["job_id"]) for s in record["starts"]] == [(0, 50, None)]


def test_a_rerun_of_a_checkpointed_name_is_refused_naming_resume(tmp_path: Path) -> None:
    _start(_opts(tmp_path))
    _checkpointed(tmp_path, 50)
    with pytest.raises(OptionError) as err:
        _start(_opts(tmp_path, steps=80))
    text = str(err.value)
    assert text.startswith("--run-name: 'r' already has a checkpoint at step 50") and "--resume" in text
    assert "\n" not in text


def test_resume_needs_more_steps_than_the_checkpoint(tmp_path: Path) -> None:
    _start(_opts(tmp_path))
    _checkpointed(tmp_path, 50)
    with pytest.raises(OptionError, match=r"^--steps: 50 is not beyond step 50 .*nothing to train"):
        _start(_opts(tmp_path, "--resume"))


def test_resume_with_other_learning_options_is_refused_naming_them(tmp_path: Path) -> None:
    _start(_opts(tmp_path, "--lr", "0.001"))
    _checkpointed(tmp_path, 50)
    with pytest.raises(OptionError) as err:
        _start(_opts(tmp_path, "--resume", "--lr", "0.002", "--seed", "3", steps=80))
    assert str(err.value) == (
        "--resume: run 'r' was trained with other options (lr 0.001 -> 0.002; seed 0 -> 3): "
        "resume it with its own, or start a new --run-name"
    )


def test_resume_with_more_steps_and_other_workers_continues_and_is_recorded(tmp_path: Path) -> None:
    _start(_opts(tmp_path, "--num-workers", "2"))
    _checkpointed(tmp_path, 50)
    # The default warm-up (10 % of --steps) follows the step count; the worker count may change.
    record = _start(_opts(tmp_path, "--resume", "--num-workers", "1", steps=80))
    assert [(s["from_step"], s["steps"]) for s in record["starts"]] == [(0, 50), (50, 80)]
    assert record["options"]["steps"] == 50 and _record(tmp_path) == record


def test_the_same_job_retried_resumes_without_resume_another_job_is_refused(tmp_path: Path) -> None:
    _start(_opts(tmp_path, "--job-id", "rj-dev-smoke-0123456789"))
    _checkpointed(tmp_path, 50)
    # KubeRay's retry of the RayJob: the same entry point, even after its last step (the export failed).
    record = _start(_opts(tmp_path, "--job-id", "rj-dev-smoke-0123456789"))
    assert [s["job_id"] for s in record["starts"]] == ["rj-dev-smoke-0123456789"] * 2
    with pytest.raises(OptionError, match=r"^--run-name: 'r' already has a checkpoint at step 50"):
        _start(_opts(tmp_path, "--job-id", "rs-r-2612031200-abc", steps=80))


def test_a_checkpoint_without_a_run_record_cannot_be_resumed(tmp_path: Path) -> None:
    _checkpointed(tmp_path, 50)
    with pytest.raises(OptionError, match=r"^--resume: .* has a checkpoint but no usable run.json"):
        _start(_opts(tmp_path, "--resume", steps=80))


def test_a_stale_record_without_a_checkpoint_is_a_new_run(tmp_path: Path) -> None:
    _start(_opts(tmp_path, "--lr", "0.001"))  # the driver died before the first checkpoint
    record = _start(_opts(tmp_path, "--lr", "0.002"))
    assert record["options"]["lr"] == 0.002 and len(record["starts"]) == 1


@pytest.mark.parametrize("bad", ["", "-x", "a b", "x" * 101])
def test_a_bad_job_id_is_refused_naming_it(tmp_path: Path, bad: str) -> None:
    with pytest.raises(OptionError, match=r"^argument --job-id: "):
        _opts(tmp_path, "--job-id", bad)


def test_a_start_refused_after_the_run_check_leaves_no_run_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver records the start only once every input is accepted: bad data refused after the
    run check (here: resolve_data) leaves no run.json, and a checked start alone writes nothing."""
    from training.run import driver

    opts = _opts(tmp_path)
    run_state.begin(opts)
    assert not (tmp_path / "storage" / "r").exists()

    def refuse(*_: object, **__: object) -> None:
        raise OptionError("--data: refused")

    monkeypatch.setattr(driver, "init_ray", lambda opts: None)
    monkeypatch.setattr(driver.quiet, "driver", lambda **_: None)
    monkeypatch.setattr(driver, "resolve_workers", lambda opts: (1, False))
    monkeypatch.setattr(driver, "resolve_data", refuse)
    with pytest.raises(OptionError, match="--data: refused"):
        driver.run(opts)
    assert not (tmp_path / "storage" / "r" / run_state.RUN_FILE).exists()

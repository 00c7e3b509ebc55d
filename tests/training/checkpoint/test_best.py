"""Early stopping exports the best checkpoint: Ray Train's own CheckpointManager (no Ray session),
fed the reports a run with an eval set makes, keeps the lowest held-out loss beside the newest
checkpoint, and the driver's choice is that one (issue 41, item 1)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from training.checkpoint import best as best_checkpoint

pytest.importorskip("ray.train")
# Ray's snapshot uses pydantic's deprecated .json(): not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _manager_after(tmp: Path, config: Any, reports: list[dict[str, Any]]) -> Any:
    """Ray's CheckpointManager after these checkpoint reports (a checkpoint folder each)."""
    from ray.train import Checkpoint
    from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import CheckpointManager
    from ray.train.v2._internal.execution.storage import StorageContext
    from ray.train.v2._internal.execution.training_report import _TrainingReport

    storage = StorageContext(storage_path=str(tmp), experiment_dir_name="run")

    async def register() -> Any:  # the manager notifies its listeners with asyncio tasks
        manager = CheckpointManager(checkpoint_config=config, storage_context=storage)
        for metrics in reports:
            folder = tmp / "run" / f"checkpoint_{metrics['step']:04d}"
            folder.mkdir(parents=True)
            (folder / "train_state.json").write_text(json.dumps({"step": metrics["step"]}))
            ckpt = Checkpoint(str(folder))
            manager.register_checkpoint(_TrainingReport(ckpt, metrics, validation=False))
        await asyncio.sleep(0)
        return manager

    return asyncio.run(register())


def _opts(**kw: Any) -> Any:
    return SimpleNamespace(**{"keep_checkpoints": 2, "eval_data": None, "eval_fraction": 0.1, **kw})


# Patience 2: the best at step 20, two evaluations without a lower loss, the early stop at 40;
# step 25 is a checkpoint whose step was not evaluated (--eval-every not a divisor).
LOSSES = {10: 3.0, 20: 2.0, 25: None, 30: 2.4, 40: 2.6}


def _reports() -> list[dict[str, Any]]:
    return [
        best_checkpoint.scored({"step": s, "loss": 1.0, **({"eval_loss": v} if v else {})})
        for s, v in LOSSES.items()
    ]


def test_the_best_checkpoint_survives_early_stopping_and_is_the_one_exported(tmp_path: Path) -> None:
    manager = _manager_after(tmp_path, best_checkpoint.checkpoint_config(_opts()), _reports())
    kept = sorted(p.name for p in (tmp_path / "run").glob("checkpoint_0*"))
    # The newest (to resume from) and the lowest held-out losses; the unevaluated one went first.
    assert kept == ["checkpoint_0020", "checkpoint_0030", "checkpoint_0040"]
    best = [(r.checkpoint, r.metrics) for r in manager.best_checkpoint_results]
    chosen, why = best_checkpoint.choose(best, manager.latest_checkpoint_result.checkpoint)
    assert Path(chosen.path).name == "checkpoint_0020"
    assert why == {"chosen": "lowest held-out loss", "eval_loss": 2.0}


def test_without_the_score_ray_keeps_only_the_newest(tmp_path: Path) -> None:
    """What the run did before: the best (step 20) deleted, the overfit last one exported."""
    from ray.train import CheckpointConfig

    _manager_after(tmp_path, CheckpointConfig(num_to_keep=2), _reports())
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint_0*")) == [
        "checkpoint_0030",
        "checkpoint_0040",
    ]


def test_a_run_without_an_eval_set_keeps_and_exports_the_newest() -> None:
    config = best_checkpoint.checkpoint_config(_opts(eval_fraction=None))
    assert config.checkpoint_score_attribute is None and config.num_to_keep == 2
    last = object()
    assert best_checkpoint.choose([(object(), {"step": 3, "loss": 1.0})], last) == (last, {"chosen": "last"})
    assert math.isnan(best_checkpoint.scored({"step": 3})[best_checkpoint.SCORE])


def test_unevaluated_and_nan_checkpoints_are_never_the_best() -> None:
    nan = math.nan
    a, b, c, last = object(), object(), object(), object()
    kept = [(a, {"step": 5, best_checkpoint.SCORE: nan}), (b, {"step": 10, best_checkpoint.SCORE: 2.5}),
            (c, {"step": 15, best_checkpoint.SCORE: float("inf")})]  # fmt: skip
    assert best_checkpoint.choose(kept, last) == (b, {"chosen": "lowest held-out loss", "eval_loss": 2.5})
    only_nan = [(a, {"step": 5, best_checkpoint.SCORE: nan})]
    assert best_checkpoint.choose(only_nan, last) == (last, {"chosen": "last"})


def test_a_nan_evaluation_never_blocks_a_later_best() -> None:
    from training.methods.evaluate import EarlyStop

    stop = EarlyStop(3, [])
    stop.observe(math.nan)
    assert not stop.improved and stop.best is None
    stop.observe(3.0)
    assert stop.improved and stop.best == 3.0
    stop.observe(math.nan)
    assert not stop.improved and stop.best == 3.0


@pytest.mark.parametrize(("eval_every", "checkpoint_every"), [(3, 5), (2, 4)])
def test_the_lowest_held_out_loss_is_exported_whatever_the_intervals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, eval_every: int, checkpoint_every: int
) -> None:
    """The loop's decisions (training/checkpoint/reporter.py eval_into, report) over a run whose
    lowest held-out loss falls on an evaluated step that is no checkpoint step (3 of every 5; 2 of
    every 4), through Ray's own CheckpointManager to the driver's choice."""
    import ray.train

    from training.checkpoint import reporter
    from training.methods.evaluate import EarlyStop

    steps, lowest = 10, eval_every
    saved: list[dict[str, Any]] = []
    monkeypatch.setattr(ray.train, "report", lambda metrics, **_: None)
    opts = SimpleNamespace(checkpoint_every=checkpoint_every, steps=steps, report_every=1)
    tr: Any = SimpleNamespace(opts=opts, step=0, stopped_early=False, rank=1, history=[])
    tr.save_and_report = lambda metrics: saved.append(best_checkpoint.scored(metrics))
    # A save at --checkpoint-every that completes at once (nothing left in flight to report later).
    tr.start_save = tr.save_and_report
    tr.pending = None
    tr.finish_pending = lambda wait, now: False
    losses = {s: (1.0 if s == lowest else 2.0 + s / 10) for s in range(1, steps + 1)}
    tr.run_eval = lambda: {"eval_loss": losses[tr.step]}
    early = EarlyStop(0, [])
    for step in range(1, steps + 1):
        tr.step = step
        metrics: dict[str, Any] = {"step": step, "loss": 1.0}
        tr.history.append(dict(metrics))
        improved = step % eval_every == 0 and reporter.eval_into(tr, early, metrics)
        reporter.report(tr, metrics, step == 1, improved)
    assert lowest % checkpoint_every != 0 and lowest in [m["step"] for m in saved]
    manager = _manager_after(tmp_path, best_checkpoint.checkpoint_config(_opts(keep_checkpoints=1)), saved)
    best = [(r.checkpoint, r.metrics) for r in manager.best_checkpoint_results]
    chosen, why = best_checkpoint.choose(best, manager.latest_checkpoint_result.checkpoint)
    assert Path(chosen.path).name == f"checkpoint_{lowest:04d}"
    assert why == {"chosen": "lowest held-out loss", "eval_loss": 1.0}

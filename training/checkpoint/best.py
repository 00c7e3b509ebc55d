"""The checkpoint a run exports: the one of the lowest held-out loss when the run evaluates.

Ray Train keeps `num_to_keep` checkpoints, the newest unless a score names a metric
(CheckpointConfig checkpoint_score_attribute / checkpoint_score_order), and whatever the score it
never deletes the latest one (Ray 2.58 and 2.60: ray/train/v2/_internal/execution/checkpoint/
checkpoint_manager.py, _save_state_and_delete_old_checkpoints): a resume continues from the newest
while the best survives beside it. Without a score, early stopping (patience x eval interval after
the best) would have deleted the best and exported the last, overfit one.

A report whose metrics lack the score attribute scores -inf, which order "min" turns into the best
of all (ray/train/_internal/checkpoint_manager.py, _get_checkpoint_score). So every checkpoint
reports SCORE: its own held-out loss, NaN when its step was not evaluated; NaN ranks below every
number there, so such checkpoints go first, and `choose` never takes one.

An evaluated step whose held-out loss is the lowest so far is checkpointed whatever --checkpoint-every
says (training/checkpoint/reporter.py `report`): the lowest loss of the run is always a kept
checkpoint, so "lowest held-out loss" in the summary is the run's, not only that of the steps that
happened to be both evaluated and checkpointed.
"""

from __future__ import annotations

import math
from typing import Any

SCORE = "checkpoint_eval_loss"


def evaluates(opts: Any) -> bool:
    """Whether the run has a held-out set (--eval-data or --eval-fraction)."""
    return opts.eval_data is not None or bool(opts.eval_fraction)


def checkpoint_config(opts: Any) -> Any:
    """Ray Train's CheckpointConfig: by held-out loss when the run evaluates, else the newest."""
    from ray.train import CheckpointConfig

    if not evaluates(opts):
        return CheckpointConfig(num_to_keep=opts.keep_checkpoints)
    return CheckpointConfig(
        num_to_keep=opts.keep_checkpoints,
        checkpoint_score_attribute=SCORE,
        checkpoint_score_order="min",
    )


def scored(metrics: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's metrics with SCORE: its step's held-out loss, NaN if it was not evaluated."""
    loss = metrics.get("eval_loss")
    return {**metrics, SCORE: float(loss) if loss is not None else math.nan}


def choose(best: list[tuple[Any, dict[str, Any]]] | None, last: Any) -> tuple[Any, dict[str, Any]]:
    """(checkpoint to export, what the summary says of it) among Ray's kept `best` checkpoints
    ((checkpoint, metrics) pairs: Result.best_checkpoints) and the `last` one (Result.checkpoint)."""
    kept = [(c, m) for c, m in best or [] if isinstance(m.get(SCORE), float) and math.isfinite(m[SCORE])]
    if not kept:
        return last, {"chosen": "last"}
    ckpt, metrics = min(kept, key=lambda cm: (cm[1][SCORE], cm[1].get("step", 0)))
    return ckpt, {"chosen": "lowest held-out loss", "eval_loss": metrics[SCORE]}

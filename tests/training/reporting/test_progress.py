"""The progress line carries percent and ETA, and reads back to the figures `raytrain job status`
shows (issue 41, item 5)."""

from __future__ import annotations

from typing import Any

from training.reporting import progress


def _step(step: int, end: float, **kw: Any) -> dict[str, Any]:
    return {"step": step, "loss": 2.5, "tokens_per_s": 12345.6, "peak_mem_gib": 3.2,
            "data_wait_s": 0.0004, "end_s": end, **kw}  # fmt: skip


def test_the_eta_is_the_steps_left_at_the_recent_wall_time_per_step() -> None:
    # 2 s a step, an evaluation pause included in the window; 170 steps left.
    history = [_step(s, 100.0 + 2 * s) for s in range(1, 31)]
    assert progress.eta_seconds(history, 200) == 170 * 2.0
    assert progress.eta_seconds(history[:1], 200) is None  # one step: no rate yet
    assert [progress.duration(s) for s in (45, 725, 11040)] == ["45s", "12m05s", "3h04m"]


def test_the_line_reads_back_and_status_takes_the_latest_eval() -> None:
    history = [_step(s, 100.0 + 2 * s) for s in range(1, 31)]
    evaluated = {**history[24], "eval_loss": 2.4, "eval_perplexity": 11.02, "eval_accuracy": 0.52}
    lines = [
        progress.line(evaluated, 200, history[:25]),
        "[train] step 30/200: data epoch 2 begins",  # another [train] line: not progress
        progress.line(history[-1], 200, history),
    ]
    assert lines[-1] == (
        "[train] step 30/200 (15%) | loss 2.5000 | 12,346 tok/s | mem 3.20 GiB | data wait 0.4 ms | ETA 5m40s"
    )
    first = {"step": 25, "steps": 200, "percent": 12, "loss": 2.5, "tokens_per_s": 12346.0}
    assert progress.parse(lines[0]) == {**first, "eval_loss": 2.4, "eta": "5m50s"}
    assert progress.latest(lines) == {"step": 30, "steps": 200, "percent": 15, "loss": 2.5,
                                      "tokens_per_s": 12346.0, "eta": "5m40s", "eval_loss": 2.4,
                                      "eval_step": 25}  # fmt: skip
    assert progress.latest(["nothing", "[train] data: 4 blocks"]) is None


def test_preemptions_and_their_lost_steps_read_back() -> None:
    """Stop notices ride on the progress line (training/checkpoint/notice.py), one lost-step count
    each; a notice whose cost is not known yet reads back as None."""
    history = [_step(s, 100.0 + 2 * s) for s in range(1, 31)]
    m = {**history[-1], "preemptions": [0, 3, None]}
    text = progress.line(m, 200, history)
    assert "preempted 3 (lost 0, 3, None steps)" in text
    got = progress.parse(text)
    assert got is not None and got["preemptions"] == [0, 3, None] and got["step"] == 30
    assert "preempted" not in progress.line(history[-1], 200, history)

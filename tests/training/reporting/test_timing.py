"""Step times include the device's work: the clock is read only after the host waited for it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from training.options.train import parse_args
from training.reporting.timing import StepTimer, window_throughput
from training.run.loop import _Trainer


class _Events:
    """A fake clock and device wait that log their calls in order."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.now = 0.0

    def clock(self) -> float:
        self.log.append("clock")
        self.now += 1.0
        return self.now

    def sync(self, device: Any) -> None:
        self.log.append("sync")


def test_stop_waits_for_the_device_before_reading_the_clock() -> None:
    ev = _Events()
    timer = StepTimer("cuda", clock=ev.clock, sync=ev.sync)
    timer.start()
    ev.log.clear()
    elapsed, end = timer.stop()
    assert ev.log == ["sync", "clock"]
    assert (elapsed, end) == (1.0, 2.0)


def test_stop_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="before start"):
        StepTimer("cpu").stop()


def test_train_step_reads_its_clock_after_the_loss_all_reduce_and_a_device_wait(
    single_rank_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's own step, on a real (one-rank, gloo) FSDP2 model: the last collective of the step
    is queued, then the host waits for the device, and only then is the step's clock read."""
    import torch.distributed as dist

    opts = parse_args(
        ["--init", "random", "--shape", "tiny", "--data", "random", "--seq-len", "16",
         "--micro-batch-size", "2", "--global-batch-size", "4", "--steps", "2"]
    )  # fmt: skip
    tr = _Trainer(opts, None, place=(0, 1, torch.device("cpu")))
    ev = _Events()
    tr.timer = StepTimer(tr.device, clock=ev.clock, sync=ev.sync)
    real_all_reduce = dist.all_reduce

    def all_reduce(*args: Any, **kwargs: Any) -> Any:
        ev.log.append("all_reduce")
        return real_all_reduce(*args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    metrics = tr.train_step()
    last_reduce = max(i for i, e in enumerate(ev.log) if e == "all_reduce")
    assert ev.log[last_reduce:] == ["all_reduce", "sync", "clock"]
    assert ev.log[:2] == ["sync", "clock"]  # the step opens on an idle device too
    assert metrics["step_time_s"] == pytest.approx(ev.now - 1.0)
    assert metrics["end_s"] == ev.now
    assert metrics["tokens_per_s"] == pytest.approx(4 * 16 / metrics["step_time_s"])


def _hist(ends: list[float], dts: list[float]) -> list[dict[str, float]]:
    pairs = enumerate(zip(ends, dts, strict=True))
    return [{"step": i + 1, "end_s": e, "step_time_s": d} for i, (e, d) in pairs]


def test_window_counts_the_gaps_between_steps() -> None:
    # Steps of 1 s each, with 0.5 s of reporting after step 2: the window after step 1 is
    # 3 steps in 3.5 s, not 3 steps in 3 s.
    history = _hist([1.0, 2.0, 3.5, 4.5], [1.0, 1.0, 1.0, 1.0])
    w = window_throughput(history, 1, tokens_per_step=100)
    assert w is not None
    assert w["wall_s"] == pytest.approx(3.5)
    assert w["tokens_per_s"] == pytest.approx(300 / 3.5)
    assert w["in_step_fraction"] == pytest.approx(3.0 / 3.5)


def test_window_from_the_first_step_opens_at_its_start() -> None:
    w = window_throughput(_hist([2.0, 3.0], [2.0, 1.0]), 0, tokens_per_step=10)
    assert w is not None and w["wall_s"] == pytest.approx(3.0)
    assert window_throughput(_hist([1.0], [1.0]), 1, tokens_per_step=10) is None

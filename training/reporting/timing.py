"""Clocks for GPU work: a step ends when the host has seen the device finish it.

CUDA kernels and NCCL collectives return to the host as soon as they are queued. A clock read right
after `dist.all_reduce` (or any launch) measures the launch, not the work: the GPU's tail, and any
inter-node collective still in flight, fall outside the step and into whatever the host does next.
Every figure the loop and the benchmarks report is therefore read after `wait_for_device`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def wait_for_device(device: Any) -> None:
    """Block the host until every stream of `device` is idle. CPU work (gloo included) is already
    finished when its call returns, so there is nothing to wait for there."""
    if getattr(device, "type", device) == "cuda":
        import torch

        torch.cuda.synchronize(device)


class StepTimer:
    """Times one step: `start()` before its first launch, `stop()` after its last.

    `stop()` waits for the device *then* reads the clock; the order is the point of this class and
    is pinned by a unit test. `sync` and `clock` are injectable for that test.
    """

    def __init__(
        self,
        device: Any,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sync: Callable[[Any], None] = wait_for_device,
    ) -> None:
        self.device, self.clock, self.sync = device, clock, sync
        self.t0: float | None = None

    def start(self) -> float:
        # Work queued between steps (a checkpoint's copies, a metric's reduction) is not this step's.
        self.sync(self.device)
        self.t0 = self.clock()
        return self.t0

    def stop(self) -> tuple[float, float]:
        """(seconds since start, the end time on this timer's clock)."""
        if self.t0 is None:
            raise RuntimeError("StepTimer.stop() before start()")
        self.sync(self.device)
        end = self.clock()
        elapsed, self.t0 = end - self.t0, None
        return elapsed, end


def window_throughput(
    history: Sequence[Mapping[str, Any]], start: int, tokens_per_step: int
) -> dict[str, float] | None:
    """Tokens over the wall time of the window of steps `history[start:]`.

    History entries carry `end_s` (the host-synced end of the step, on one process's clock) and
    `step_time_s`. The window opens when step `start - 1` ended (or, for `start == 0`, when step 0
    began) and closes when the last step ended, so everything the host did in between (logging,
    reports to Ray, data) is inside it. None when the window holds no step.
    """
    rows = history[start:]
    if not rows:
        return None
    prev = history[start - 1] if start > 0 else None
    opened = prev["end_s"] if prev is not None else rows[0]["end_s"] - rows[0]["step_time_s"]
    wall = rows[-1]["end_s"] - opened
    tokens = tokens_per_step * len(rows)
    busy = sum(r["step_time_s"] for r in rows)
    return {
        "steps": float(len(rows)),
        "tokens": float(tokens),
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        # Time inside the steps against the window: what reporting and logging between steps cost.
        "in_step_fraction": busy / wall,
    }

"""Ray start-up for the training entry points (the driver and `python -m training.prepare`).

A module of its own so that training.run.driver and training.run.prepare both use it without importing
each other.
"""

from __future__ import annotations

import os
from pathlib import Path

from training.options.types import OptionError


def init_ray_at(address: str | None) -> None:
    """Join the cluster at `address`, or start an embedded local Ray (no address)."""
    import ray

    if ray.is_initialized():
        return
    if address:
        try:
            ray.init(address=address)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise OptionError(f"--address: cannot join the Ray cluster at {address!r}: {exc}") from None
        return
    # Embedded local Ray: its workers must import this package; they inherit the environment.
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
    # Each ray.train.report waits for the Train controller's poll, every 2 s by default; a local run
    # is short, so poll faster. The controller is started by this Ray instance and inherits it.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    # Nothing preempts a local machine: no watcher actor (Ray Train's spot-preemption watcher).
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    ray.init()

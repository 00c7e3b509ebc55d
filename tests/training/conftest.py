"""One local Ray session for every Ray test of the training package."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start Ray once (2 CPUs); session files stay under pytest's tmp dir. Yields the GCS address."""
    ray = pytest.importorskip("ray")
    tmp = tmp_path_factory.mktemp("ray")
    # Ray 2.60 turns token auth on for local clusters and writes ~/.ray/auth_token: not in tests.
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["RAY_TMPDIR"] = str(tmp)
    # Workers are started by the raylet and inherit this: they must import `training`.
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *paths])
    # ray.train.report waits for the controller's poll (2 s by default); the controller inherits this.
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.2"
    # Each run would start one more actor process (Ray Train's spot-preemption watcher) and export
    # Prometheus metrics: neither is what these tests check, and on 2 cores every process counts.
    os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "0"
    os.environ["RAY_TRAIN_METRICS_ENABLED"] = "0"
    ray.init(num_cpus=2, _temp_dir=str(tmp), include_dashboard=True, log_to_driver=True)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def single_rank_group() -> Iterator[None]:
    """A one-rank gloo group, so fully_shard and the loop's collectives run for real in this process."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()

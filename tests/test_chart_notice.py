"""The GPU worker pods' part in a checkpoint on notice (training/checkpoint/notice.py): a grace period
sized from the job's checkpoint, the preStop hook that drains the pod's Ray node and waits for the
save, and the Ray settings that bound both, in every environment and on the RayJob's own copy."""

from __future__ import annotations

import pytest

from config.checkpointing import STEP_ALLOWANCE_S, checkpoint_time, stop_grace_seconds, trained_params
from tests.chart_render import ALL, env_of, head_pod, settings_of, worker_container, worker_group
from training.common.stop_notice import (
    DRIVER_PREFIX,
    NOTICE_DIR,
    PRESTOP_MARGIN_S,
    SAVED_FILE,
    SAVED_PREFIX,
    WORKERS_PREFIX,
)


@pytest.mark.parametrize("name", ALL)
def test_worker_pods_get_a_grace_period_sized_from_their_checkpoint(name: str) -> None:
    s = settings_of(name)
    grace = worker_group(name)["template"]["spec"]["terminationGracePeriodSeconds"]
    ct = checkpoint_time(s)
    assert grace == stop_grace_seconds(s) >= 30
    assert grace >= ct.complete_s + STEP_ALLOWANCE_S  # the step in flight, the save and its upload
    env = env_of(worker_container(name))
    assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == str(grace - PRESTOP_MARGIN_S)
    assert env["RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"] == "1"
    assert env_of(head_pod(name)["containers"][0])["RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S"] == "1"


@pytest.mark.parametrize("name", ALL)
def test_worker_prestop_drains_its_ray_node_and_waits_for_the_save(name: str) -> None:
    grace = worker_group(name)["template"]["spec"]["terminationGracePeriodSeconds"]
    command = worker_container(name)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["/bin/bash", "-c"]
    script = command[2]
    assert "ray drain-node" in script and "--reason DRAIN_NODE_REASON_PREEMPTION" in script
    assert f"--deadline-remaining-seconds {grace - PRESTOP_MARGIN_S}" in script
    assert f"{NOTICE_DIR}" in script and f'"$d/{SAVED_FILE}"' in script


@pytest.mark.parametrize("name", ALL)
def test_the_head_outlives_the_workers_checkpoint_on_notice(name: str) -> None:
    """Deleting the RayCluster (Kueue preemption, job stop) deletes head and workers at once: the head,
    where the driver and Ray Train's controller run, drains the run's workers itself and waits for
    the registered checkpoint within the workers' own grace period."""
    grace = worker_group(name)["template"]["spec"]["terminationGracePeriodSeconds"]
    pod = head_pod(name)
    assert pod["terminationGracePeriodSeconds"] == grace
    command = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["/bin/bash", "-c"]
    script = command[2]
    assert f'"$d"/{DRIVER_PREFIX}*' in script and f'"$d/{WORKERS_PREFIX}$p"' in script
    assert "ray drain-node" in script and f"--deadline-remaining-seconds {grace - PRESTOP_MARGIN_S}" in script
    assert f'"$d/{SAVED_PREFIX}$p"' in script and NOTICE_DIR in script


def test_a_lora_checkpoint_is_the_adapters_and_a_full_one_every_parameter() -> None:
    """Fixtures unlike each other: a LoRA environment and a full fine-tune."""
    by_method = {}
    for name in ALL:
        s = settings_of(name)
        by_method[s.job.lora_spec is not None] = (s, trained_params(s))
    assert set(by_method) == {True, False}, "the environments cover both methods"
    (full, n_full), (lora, n_lora) = by_method[False], by_method[True]
    assert n_full == full.job.model_plan.dims.params
    assert 0 < n_lora < lora.job.model_plan.dims.params / 50

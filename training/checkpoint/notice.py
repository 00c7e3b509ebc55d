"""Checkpoint on notice: a worker told to stop saves a checkpoint before it goes, and the run counts a
preemption, not a failure.

The mechanism is Ray Train's own (Ray 2.58, the image's, and 2.60: ray/train/v2/_internal/execution/
preemption.py, PreemptionWatcher; ray/train/v2/api/train_fn_utils.py, get_preemption_info;
FailureConfig.max_preemption_failures in ray/train/v2/api/config.py). Ray Train polls Ray Core for
nodes being drained and hands every rank the same PreemptionInfo through `get_preemption_info()`, a
barrier, so all ranks agree on the step they save at. When the node dies, its actors' errors carry
`preempted` (or the controller raises PreemptionError at the drain deadline), which the failure policy
charges to max_preemption_failures, apart from max_failures (failure_handling/default.py,
_is_preemption_failure).

What drains a node is a Ray Core drain with reason PREEMPTION and a deadline (GcsClient.drain_node).
A pod being deleted (a node drain or eviction, a Spot interruption the managed node group turns into
a drain, a Kueue preemption deleting the RayCluster, `raytrain job stop`) runs its preStop hook, then
sends SIGTERM to the container's first process, and SIGKILL at the end of terminationGracePeriodSeconds,
whose countdown "begins before the PreStop hook is executed" (Kubernetes docs, Container Lifecycle
Hooks, https://kubernetes.io/docs/concepts/containers/container-lifecycle-hooks/; Pod Lifecycle,
"Termination of Pods"). Two paths make that drain:
- `ray start --block` drains its own node on SIGTERM, reason PREEMPTION, for
  RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S (default 30 s), and waits that long for its raylet before it
  kills the node's processes (Ray 2.58 and 2.60: ray/_private/node.py, _drain_node_before_shutdown);
  the worker pods set that timeout from their grace period (k8s/cluster.py);
- the GPU worker pod's preStop hook (`prestop_script`) drains the pod's node itself, with the same
  deadline, through `ray drain-node` (ray/scripts/scripts.py): the SIGTERM reaches `ray start` only
  when it is the container's first process, and KubeRay starts it under a shell (which may or may
  not hand its place to it). The hook then waits until the ranks there wrote the checkpoint
  (SAVED_FILE) before it lets the SIGTERM come.

The head goes with the job (a Kueue preemption suspends the RayJob and KubeRay deletes its RayCluster,
every pod at once: KubeRay "doesn't stop the Ray job before suspending the RayJob. If users want to
stop the Ray job by SIGTERM, users need to set the Pod's preStop hook by themselves",
ray-operator/controllers/ray/rayjob_controller.go, v1.7.0; `raytrain job stop` the same way; a drained
system node). The driver and Ray Train's controller run there (the controller on the driver's node:
ray/train/v2/api/data_parallel_trainer.py), and the checkpoint on notice counts only once the
controller registered it. So the head pod's preStop (`head_prestop_script`) drains the run's GPU
worker nodes itself and waits, within the same grace period, until the controller's `HeadNotice`
callback saw the on-notice report; the driver leaves its pid there (`driver_running`), and the callback
the workers' node ids (from each worker group's first report), in files named by the driver's pid:
several jobs may share a standing cluster's head.

A rank that saved on notice trains no further: the steps it would take die with the node. Once the
controller registered that checkpoint, its callback drains the preempted nodes again with a deadline a
second away (`end_drain`: why, there), and Ray Train tears the worker group down; then it starts a
new group, which resumes from that checkpoint (`max_preemption_failures` allowing), or the run ends as
preempted (training/run/driver.py) and the rerun resumes it (training/checkpoint/run_state.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from training.common.stop_notice import (  # noqa: F401  (the names tests and the chart use, from here too)
    DRAIN_REASON,
    DRIVER_PREFIX,
    NODE_FILE,
    NOTICE_DIR,
    NOTICE_DIR_ENV,
    PRESTOP_MARGIN_S,
    SAVED_FILE,
    SAVED_PREFIX,
    WORKERS_PREFIX,
    head_prestop_script,
    prestop_script,
)
from training.reporting.progress import say

PREEMPTIONS_FILE = "preemptions.json"  # under the run's storage: every notice, saved or not
# Once the checkpoint on notice is registered, the worker group ends this soon (end_drain), not at
# the notice's own deadline: Ray Train's preemption poll (RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S) and
# its controller's next poll come within a few seconds after it.
END_AFTER_SAVE_S = 1
NODE_METRIC = "ray_node"  # each rank's Ray node id, in a worker group's first report
SAVED_METRIC = "saved_on_notice"  # the step of the checkpoint on notice, once every rank wrote it
PREEMPTED_NODE_METRIC = "preempted_node"  # in that report: the rank's node, when it is one preempted


def notice_dir() -> str:
    return os.environ.get(NOTICE_DIR_ENV) or NOTICE_DIR


def record_notice(storage_path: str, run_name: str, entry: dict[str, Any]) -> None:
    """Append one notice to the run's PREEMPTIONS_FILE (rank 0, before the save: a save that never
    completes still leaves the notice counted)."""
    from training.data import shards

    fs, run_dir = shards.filesystem(shards.join(storage_path, run_name))
    where = f"{run_dir}/{PREEMPTIONS_FILE}"
    fs.create_dir(run_dir, recursive=True)
    found = read_notices(fs, where)
    with fs.open_output_stream(where) as f:
        f.write(json.dumps([*found, entry], indent=2).encode())


def read_notices(fs: Any, where: str) -> list[dict[str, Any]]:
    import pyarrow.fs as pafs

    if fs.get_file_info(where).type != pafs.FileType.File:
        return []
    try:
        with fs.open_input_stream(where) as f:
            found = json.loads(f.read())
    except (OSError, ValueError):
        return []  # a notice file cut short by the node's end: the checkpoint's own record stands
    return [e for e in found if isinstance(e, dict)] if isinstance(found, list) else []


def run_notices(storage_path: str, run_name: str) -> list[dict[str, Any]]:
    from training.data import shards

    fs, run_dir = shards.filesystem(shards.join(storage_path, run_name))
    return read_notices(fs, f"{run_dir}/{PREEMPTIONS_FILE}")


def preemptions_after_resume(
    saved: list[dict[str, Any]], notices: list[dict[str, Any]], from_step: int
) -> list[dict[str, Any]]:
    """The run's preemptions as a resume at `from_step` sees them: those the checkpoint carries, and
    the newer notices of the run's file (a notice whose save did not complete is only there). Each
    says what it cost: `lost_steps`, the steps trained past the checkpoint resumed from (0 when the
    on-notice checkpoint completed)."""
    known = {e.get("at") for e in saved}
    out = [dict(e) for e in saved]
    for e in notices:
        if e.get("at") not in known:
            out.append(dict(e))
    for e in out:
        if e.get("lost_steps") is None and isinstance(e.get("step"), int):
            e["lost_steps"] = max(0, e["step"] - from_step)
            e["resumed_from"] = from_step
    return out


class Notice:
    """One rank's watch for a stop notice (Ray Train's preemption info), and its checkpoint on notice."""

    def __init__(self, rank: int, local_rank: int, storage_path: str, run_name: str) -> None:
        import ray

        self.rank, self.local_rank = rank, local_rank
        self.storage_path, self.run_name = storage_path, run_name
        self.saved_for: Any = None
        self.node_id = ray.get_runtime_context().get_node_id()
        self.dir = notice_dir()
        if local_rank == 0:  # one writer per node: what the pod's preStop drains
            os.makedirs(self.dir, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):  # a previous run's, in the same pod
                os.remove(os.path.join(self.dir, SAVED_FILE))
            with open(os.path.join(self.dir, NODE_FILE), "w") as f:
                f.write(self.node_id)

    def check(self) -> Any:
        """Collective (a barrier on every rank, every step): Ray Train's PreemptionInfo, the same on
        every rank, or None. None again once this rank saved for it."""
        import ray.train

        info = ray.train.get_preemption_info()
        if info is None or self.saved_for is not None:
            return None
        return info

    def entry(self, info: Any, step: int) -> dict[str, Any]:
        deadline_ms = getattr(info, "deadline_ms", None)
        return {
            "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "step": step,
            "nodes": list(getattr(info, "preempted_node_ids", [])),
            "ranks": list(getattr(info, "preempted_ranks", [])),
            "notice_s": round(deadline_ms / 1000 - time.time(), 1) if deadline_ms else None,
        }

    def saved_metrics(self, info: Any, step: int) -> dict[str, Any]:
        """What the on-notice report adds: its step, and this rank's node when that node is the one
        preempted (the controller's callback then ends the group: `end_drain`)."""
        out: dict[str, Any] = {SAVED_METRIC: step}
        if self.node_id in set(getattr(info, "preempted_node_ids", [])):
            out[PREEMPTED_NODE_METRIC] = self.node_id
        return out

    def saved(self, info: Any, step: int, save_s: float) -> None:
        """After the on-notice checkpoint is complete on every rank: tell the pod's preStop."""
        self.saved_for = info
        if self.local_rank == 0:
            _write(os.path.join(self.dir, SAVED_FILE), str(step))
        if self.rank == 0:
            say(f"[train] checkpoint on notice at step {step} written in {save_s:.1f}s; waiting for the stop")

    def close(self) -> None:
        """The run ended here without a notice: the pod's preStop has nothing to drain or wait for."""
        if self.local_rank == 0:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.dir, NODE_FILE))

    @staticmethod
    def wait_for_stop() -> None:
        """Train no further: Ray Train ends this worker group at the drain's deadline, which the
        controller's callback brings forward once it registered the checkpoint (`end_drain`)."""
        while True:
            time.sleep(1)


def end_drain(node_id: str, step: int) -> None:
    """Drain a preempted node again with a deadline END_AFTER_SAVE_S away: its checkpoint on notice
    is registered (the controller's callback calls this from after_report, which comes after the
    checkpoint manager registered the report: so the group cannot end before it).

    Why: a run ends as preempted only through Ray Train's own rule. Once a node is draining, the
    controller keeps the workers running until every rank ends or the drain's deadline passes,
    and then raises PreemptionError; a rank that fails first fails the run unless its actor's
    death says `preempted` (Ray 2.58 and 2.60: controller.py, _handle_preempting_state). How the
    node's processes die decides that: `ray start --block`, when the SIGTERM reaches it, drains its
    node until that same deadline and then stops the raylet, whose own death record ("received
    SIGTERM": not preempted) can come first on a busy machine (seen with Ray 2.58). A second drain
    request replaces the first one's deadline (GCS's draining nodes, seen with Ray 2.58; Ray Train's
    PreemptionWatcher polls them and the controller keeps the earliest deadline: preemption.py,
    merge_preemption_info), so the controller ends the group as preempted long before any process
    of the node dies. The call is the one `ray drain-node` and `ray start` make
    (ray/scripts/scripts.py drain_node, ray/_private/node.py _drain_node_before_shutdown)."""
    import ray
    from ray.core.generated import autoscaler_pb2

    deadline_ms = int((time.time() + END_AFTER_SAVE_S) * 1000)
    # Ray's private names, typed loosely by its stubs (the process's GCS client, protobuf enums).
    worker: Any = ray._private.worker.global_worker
    reasons: Any = getattr(autoscaler_pb2, "DrainNodeReason")  # noqa: B009 (generated: no stub)
    try:
        accepted, why = worker.gcs_client.drain_node(
            node_id, reasons.Value(DRAIN_REASON), f"checkpoint on notice registered, step {step}", deadline_ms
        )
    except Exception as exc:  # the notice's own deadline still ends the group
        accepted, why = False, str(exc)
    if not accepted:
        say(f"[train] warning: could not shorten the drain of node {node_id[:12]} ({why})")


def _write(path: str, text: str) -> None:
    """Whole or not at all: the preStop hook reads it any time."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def driver_running() -> Iterator[None]:
    """The driver's pid on its node (the head), while the run goes: the head's preStop waits only
    for runs whose driver is alive."""
    d, pid = notice_dir(), os.getpid()
    os.makedirs(d, exist_ok=True)
    for prefix in (SAVED_PREFIX, WORKERS_PREFIX):  # an earlier driver's of the same pid
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(d, f"{prefix}{pid}"))
    mine = os.path.join(d, f"{DRIVER_PREFIX}{pid}")
    _write(mine, str(pid))
    try:
        yield
    finally:
        for path in (mine, *(os.path.join(d, f"{p}{pid}") for p in (SAVED_PREFIX, WORKERS_PREFIX))):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def head_notice(driver_pid: int | None = None) -> Any:
    """The Ray Train callback that tells the head's preStop what it needs about this driver's run
    (it runs in the controller, on the driver's node: ray/train/v2/api/callback.py, UserCallback,
    "called on the Ray Train controller process"; after_report comes after the checkpoint manager
    registered the report's checkpoint, controller.py's ReportCallbackHandler order, Ray 2.58 and
    2.60)."""
    from ray.train import UserCallback

    pid = os.getpid() if driver_pid is None else driver_pid

    class HeadNotice(UserCallback):
        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            nodes = sorted({str(m[NODE_METRIC]) for m in metrics if m.get(NODE_METRIC)})
            saved = next((m[SAVED_METRIC] for m in metrics if SAVED_METRIC in m), None)
            if not nodes and saved is None:
                return
            d = notice_dir()
            os.makedirs(d, exist_ok=True)
            if nodes:  # a worker group's start: an earlier group's checkpoint on notice is history
                _write(os.path.join(d, f"{WORKERS_PREFIX}{pid}"), " ".join(nodes))
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(d, f"{SAVED_PREFIX}{pid}"))
            if saved is not None:
                _write(os.path.join(d, f"{SAVED_PREFIX}{pid}"), str(saved))
                preempted = {str(m[PREEMPTED_NODE_METRIC]) for m in metrics if m.get(PREEMPTED_NODE_METRIC)}
                for node in sorted(preempted):
                    end_drain(node, int(saved))

    return HeadNotice()


def is_preemption(exc: BaseException) -> bool:
    """Whether fit() ended on a preemption (Ray Train's rule, failure_handling/default.py
    _is_preemption_failure): a PreemptionError, or a worker group whose lost actors were preempted."""
    from ray.exceptions import RayActorError

    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if type(e).__name__ == "PreemptionError":
            return True
        failures = getattr(e, "worker_failures", None)
        if isinstance(failures, dict) and any(
            isinstance(f, RayActorError) and getattr(f, "preempted", False) for f in failures.values()
        ):
            return True
        todo += [e.__cause__, e.__context__]
    return False

"""What a training run and its pods agree on for a checkpoint on notice (training/checkpoint/notice.py
says how it works): where the pod's processes leave word for each other, and the preStop hooks of the
GPU worker pods and of the head pod (put there by k8s/cluster.py). Torch-free: the chart imports it.
The hooks run in the containers with the image's bash and `ray` CLI only: the training code reaches
the pods as Ray's working_dir, which a preStop's process does not have."""

from __future__ import annotations

# Inside the Ray containers: their Ray temp mount (k8s/cluster.py RAY_TMP), shared by every process
# of the pod, the preStop hook's included. Tests point RAYTRAIN_NOTICE_DIR elsewhere.
NOTICE_DIR = "/tmp/ray/raytrain-notice"  # noqa: S108
NOTICE_DIR_ENV = "RAYTRAIN_NOTICE_DIR"
NODE_FILE = "node-id"  # the Ray node id of this pod's training workers: what the preStop drains
SAVED_FILE = "saved"  # written once the on-notice checkpoint is complete: the preStop stops waiting
# On the head: the pid of the run's driver (while it runs), and the Ray node ids of its training
# workers (written by the controller's callback, on the head: training/checkpoint/notice.py).
DRIVER_FILE = "driver"
WORKERS_FILE = "worker-nodes"
DRAIN_REASON = "DRAIN_NODE_REASON_PREEMPTION"  # ray.core.generated.autoscaler_pb2.DrainNodeReason
# Seconds the preStop keeps for itself before the grace period ends: the drain call, and the SIGKILL
# that follows must not hit a checkpoint being written.
PRESTOP_MARGIN_S = 5


def prestop_script(grace_s: int, directory: str = NOTICE_DIR) -> str:
    """The GPU worker pod's preStop command (bash): drain this pod's Ray node with reason PREEMPTION
    and the grace period as deadline, then wait until its ranks saved (or the grace period is spent).
    Nothing to do when no training runs in the pod (no NODE_FILE)."""
    wait_s = max(1, grace_s - PRESTOP_MARGIN_S)
    d = directory
    return (
        f'd={d}; [ -s "$d/{NODE_FILE}" ] || exit 0; rm -f "$d/{SAVED_FILE}"; '
        f'ray drain-node --node-id "$(cat "$d/{NODE_FILE}")" --reason {DRAIN_REASON} '
        f'--reason-message "pod $HOSTNAME is terminating" --deadline-remaining-seconds {wait_s} || exit 0; '
        f"end=$((SECONDS + {wait_s})); "
        f'while [ $SECONDS -lt $end ] && [ ! -e "$d/{SAVED_FILE}" ]; do sleep 1; done'
    )


def head_prestop_script(grace_s: int, directory: str = NOTICE_DIR) -> str:
    """The head pod's preStop command (bash). The head goes with its job: when the RayCluster is
    deleted (a Kueue preemption suspends the RayJob and KubeRay deletes the cluster, its pods all at
    once; `raytrain job stop`), and when only the head's node is drained. Its driver and Ray Train's
    controller (on the driver's node) must outlive the workers' checkpoint on notice, which they
    register: so drain the run's GPU worker nodes (again, when their own preStop did already: a second
    request only sets the deadline anew), then wait until the controller registered that checkpoint
    (SAVED_FILE here) or the grace period is spent. Nothing to do when no run's driver is alive in
    the pod."""
    wait_s = max(1, grace_s - PRESTOP_MARGIN_S)
    d = directory
    return (
        f'd={d}; [ -s "$d/{DRIVER_FILE}" ] && kill -0 "$(cat "$d/{DRIVER_FILE}")" 2>/dev/null || exit 0; '
        f'rm -f "$d/{SAVED_FILE}"; '
        f'for n in $(cat "$d/{WORKERS_FILE}" 2>/dev/null); do '
        f'ray drain-node --node-id "$n" --reason {DRAIN_REASON} --reason-message '
        f'"head pod $HOSTNAME is terminating" --deadline-remaining-seconds {wait_s} || true; '
        "done; "
        f"end=$((SECONDS + {wait_s})); "
        f'while [ $SECONDS -lt $end ] && [ ! -e "$d/{SAVED_FILE}" ] '
        f'&& kill -0 "$(cat "$d/{DRIVER_FILE}")" 2>/dev/null; do sleep 1; done'
    )

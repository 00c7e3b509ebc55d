"""What a training worker and its pod agree on for a checkpoint on notice (training/checkpoint/notice.py
says how it works): where the pod's processes leave word for each other, and the GPU worker pod's
preStop hook (put there by k8s/cluster.py). Torch-free: the chart imports it."""

from __future__ import annotations

# Inside the Ray containers: their Ray temp mount (k8s/cluster.py RAY_TMP), shared by every process
# of the pod, the preStop hook's included. Tests point RAYTRAIN_NOTICE_DIR elsewhere.
NOTICE_DIR = "/tmp/ray/raytrain-notice"  # noqa: S108
NOTICE_DIR_ENV = "RAYTRAIN_NOTICE_DIR"
NODE_FILE = "node-id"  # the Ray node id of this pod's training workers: what the preStop drains
SAVED_FILE = "saved"  # written once the on-notice checkpoint is complete: the preStop stops waiting
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

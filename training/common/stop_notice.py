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
# On the head, one set per run's driver (jobs on a standing cluster share its head), named by the
# driver's pid: DRIVER_PREFIX<pid> while the driver runs, the Ray node ids of its training workers
# and its checkpoint on notice once registered (both written by the controller's callback, on the
# head: training/checkpoint/notice.py).
DRIVER_PREFIX = "driver-"
WORKERS_PREFIX = "worker-nodes-"
SAVED_PREFIX = "saved-"
DRAIN_REASON = "DRAIN_NODE_REASON_PREEMPTION"  # ray.core.generated.autoscaler_pb2.DrainNodeReason
# Seconds the preStop keeps for itself before the grace period ends: the drain call, and the SIGKILL
# that follows must not hit a checkpoint being written.
PRESTOP_MARGIN_S = 5


def prestop_script(grace_s: int, directory: str = NOTICE_DIR) -> str:
    """The GPU worker pod's preStop command (bash): drain this pod's Ray node with reason PREEMPTION
    and the grace period as deadline, then wait until its ranks saved (or the grace period is spent).
    Nothing to do when no training runs in the pod (no NODE_FILE). A SAVED_FILE already there is this
    notice's (the head's preStop may have drained the node first): each start of the training in the
    pod removes an earlier one (training/checkpoint/notice.py, Notice)."""
    wait_s = max(1, grace_s - PRESTOP_MARGIN_S)
    d = directory
    return (
        f'd={d}; [ -s "$d/{NODE_FILE}" ] || exit 0; '
        f'ray drain-node --node-id "$(cat "$d/{NODE_FILE}")" --reason {DRAIN_REASON} '
        f'--reason-message "pod $HOSTNAME is terminating" --deadline-remaining-seconds {wait_s} || exit 0; '
        f"end=$((SECONDS + {wait_s})); "
        f'while [ $SECONDS -lt $end ] && [ ! -e "$d/{SAVED_FILE}" ]; do sleep 1; done'
    )


def head_prestop_script(grace_s: int, directory: str = NOTICE_DIR) -> str:
    """The head pod's preStop command (bash). The head goes with its job: when the RayCluster is
    deleted (a Kueue preemption suspends the RayJob and KubeRay deletes the cluster, its pods all at
    once; `raytrain job stop`), and when only the head's node is drained. A driver and Ray Train's
    controller (on the driver's node) must outlive the workers' checkpoint on notice, which they
    register: so for each run whose driver is alive here, drain its GPU worker nodes (again, when
    their own preStop did already: a second request only sets the deadline anew), then wait until
    each such run's controller registered that checkpoint (or its driver ended), or the grace period
    is spent. Nothing to do when no run's driver is alive in the pod. A run's saved file is this
    notice's: the callback removes it when a worker group starts."""
    wait_s = max(1, grace_s - PRESTOP_MARGIN_S)
    d = directory
    return (
        f"d={d}; runs=; "
        f'for f in "$d"/{DRIVER_PREFIX}*; do p="${{f##*/{DRIVER_PREFIX}}}"; '
        f'[ -e "$f" ] && kill -0 "$p" 2>/dev/null && runs="$runs $p"; done; '
        '[ -n "$runs" ] || exit 0; '
        "for p in $runs; do "
        f'for n in $(cat "$d/{WORKERS_PREFIX}$p" 2>/dev/null); do '
        f'ray drain-node --node-id "$n" --reason {DRAIN_REASON} --reason-message '
        f'"head pod $HOSTNAME is terminating" --deadline-remaining-seconds {wait_s} || true; '
        "done; done; "
        f"end=$((SECONDS + {wait_s})); "
        "while [ $SECONDS -lt $end ]; do left=; "
        f'for p in $runs; do [ -e "$d/{SAVED_PREFIX}$p" ] || ! kill -0 "$p" 2>/dev/null || left=1; done; '
        '[ -n "$left" ] || break; sleep 1; done'
    )

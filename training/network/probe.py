"""In-job transport gate: prove inter-node NCCL traffic is on the expected network before training.

Called on every rank inside the Ray Train worker function once the torch process group exists and
before the first training step::

    result = run_transport_gate(expect)   # raises TransportGateError when the path is wrong

It runs a short all-gather and reduce-scatter probe (which also makes NCCL build its communicator
and print its channel lines), measures bus bandwidth with the nccl-tests formulas, parses this rank's
own NCCL debug log, gathers every rank's facts and judges them together (training.network.transport), so
every rank reaches the same verdict and all raise or none does (no rank is left in a collective).

The logs only exist when the worker processes start with the variables of `nccl_env(log_dir)`:
NCCL reads them once, when it initialises.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.network.transport import EXPECTATIONS, ProcessLog, classify, parse_lines

NCCL_LOG_NAME = "nccl.%h.%p.log"
# Variables that decide whether NCCL reaches EFA; shown (with this rank's values) on failure.
CHECK_VARIABLES = (
    "FI_PROVIDER",
    "NCCL_NET_PLUGIN",
    "NCCL_SOCKET_IFNAME",
    "NCCL_NET",
    "FI_EFA_USE_DEVICE_RDMA",
)
_GIB = 1e9  # nccl-tests report GB/s in units of 1e9 bytes


class TransportGateError(RuntimeError):
    """The job's inter-node traffic is not on the expected transport. `result` holds the details."""

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.result = result


def host_key(env: Mapping[str, str]) -> str:
    """The node a rank is on as NCCL tells them apart: NCCL_HOSTID when set (--emulate-hosts),
    else the host name (a pod has its own)."""
    return env.get("NCCL_HOSTID") or socket.gethostname()


def nccl_env(log_dir: str) -> dict[str, str]:
    """Environment the worker processes need so NCCL writes one log per process under `log_dir`.

    NCCL expands %h to the host name (up to the first '.') and %p to the process id.
    """
    return {**GATE_LOG_ENV, "NCCL_DEBUG_FILE": str(Path(log_dir) / NCCL_LOG_NAME)}


# NCCL_DEBUG levels, least to most verbose (NCCL's debug.cc). The gate needs INFO lines.
_NCCL_LEVELS = ("NONE", "VERSION", "WARN", "INFO", "ABORT", "TRACE")
# Subsystems whose INFO lines the gate reads: the net plugin/provider (INIT) and channels (NET).
GATE_SUBSYSTEMS = ("INIT", "NET")
# What the worker pods set (k8s/cluster.py) and the settings check worker_env against.
GATE_LOG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": ",".join(GATE_SUBSYSTEMS)}


def gate_log_problem(env: Mapping[str, str]) -> str | None:
    """Why NCCL, started with `env`, would not log what the transport gate reads; None if it would.

    NCCL reads NCCL_DEBUG and NCCL_DEBUG_SUBSYS once per process, at its first call, so the gate
    cannot raise them for its own probe: the training process's settings must already include
    INFO and the INIT and NET subsystems. (The lines go to NCCL_DEBUG_FILE, not to the job's log,
    so keeping them costs no log noise.) NCCL_DEBUG_SUBSYS is a comma list; a leading ^ excludes.
    """
    level = env.get("NCCL_DEBUG", "").strip().upper()
    if not level:
        return None  # nothing asked of NCCL at all: the gate reports the missing logs itself
    if level not in ("INFO", "TRACE"):
        return f"NCCL_DEBUG={level}: the gate needs INFO (or TRACE) to see which network NCCL uses"
    subsys = env.get("NCCL_DEBUG_SUBSYS", "").strip().upper()
    if not subsys:
        return None  # NCCL's default: INIT,BOOTSTRAP,ENV
    if subsys.startswith("^"):
        excluded = {x.strip() for x in subsys[1:].split(",")}
        missing = [x for x in GATE_SUBSYSTEMS if x in excluded or "ALL" in excluded]
    else:
        included = {x.strip() for x in subsys.split(",")}
        missing = [] if "ALL" in included else [x for x in GATE_SUBSYSTEMS if x not in included]
    if missing:
        needs = ",".join(GATE_SUBSYSTEMS)
        return f"NCCL_DEBUG_SUBSYS={subsys}: the gate needs {needs} (missing {','.join(missing)})"
    return None


def prepare_nccl_log_dir() -> Path | None:
    """Create the directory of NCCL_DEBUG_FILE, if set; returns it.

    NCCL opens its debug file once, on its first log line, and silently logs to stdout when the
    directory does not exist: the gate would then find no log. Call before the first collective.
    """
    pattern = os.environ.get("NCCL_DEBUG_FILE")
    if not pattern:
        return None
    directory = Path(pattern).parent
    if "%" in str(directory):
        return None  # a per-host/pid directory: NCCL's pattern, not ours to create
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def bus_bandwidth(collective: str, total_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s as nccl-tests computes them.

    `total_bytes` is the size nccl-tests reports: the gathered output of an all-gather, the input of a
    reduce-scatter. Both move (n-1)/n of it over each rank's link: busbw = algbw * (n-1)/n.
    """
    if seconds <= 0:
        raise ValueError("seconds must be positive")
    algbw = total_bytes / seconds / _GIB
    if collective in ("all_gather", "reduce_scatter"):
        factor = (world_size - 1) / world_size
    elif collective == "all_reduce":
        factor = 2 * (world_size - 1) / world_size
    else:
        raise ValueError(f"no bus bandwidth formula for {collective!r}")
    return algbw, algbw * factor


def find_own_log(log_dir: str | None = None, *, pid: int | None = None) -> list[Path]:
    """This process's NCCL log file(s), from NCCL_DEBUG_FILE's pattern or `log_dir`.

    The host part is matched loosely (NCCL's %h is the short host name; inside a pod that is the pod
    name), the pid exactly: several pods may share one log directory.
    """
    pid = os.getpid() if pid is None else pid
    pattern = os.environ.get("NCCL_DEBUG_FILE")
    if log_dir is not None:
        pattern = str(Path(log_dir) / (Path(pattern).name if pattern else NCCL_LOG_NAME))
    if not pattern:
        return []  # NCCL logs to stdout: nothing this process can read back
    directory, name = Path(pattern).parent, Path(pattern).name
    if not directory.is_dir():
        return []
    want = re.compile("^" + re.escape(name).replace("%h", r"[^/]+").replace("%p", str(pid)) + "$")
    return sorted(p for p in directory.iterdir() if want.match(p.name))


def _own_facts(paths: list[Path], pid: int) -> list[ProcessLog]:
    procs: dict[tuple[str, int], ProcessLog] = {}
    for path in paths:
        with path.open(encoding="utf-8", errors="replace") as fh:
            parse_lines(fh, source=path.name, into=procs)
    # A file named for this pid holds this process's lines; anything else is not ours to judge.
    return [p for p in procs.values() if p.pid == pid] or list(procs.values())


def _probe(dist: Any, torch: Any, device: Any, *, size_bytes: int, warmup: int, iters: int) -> dict[str, Any]:
    world = dist.get_world_size()
    elem = 4  # float32: every backend reduces it
    shard = max(1, size_bytes // (world * elem))
    total = shard * world * elem
    src = torch.ones(shard, dtype=torch.float32, device=device)
    full = torch.empty(shard * world, dtype=torch.float32, device=device)
    out = torch.empty(shard, dtype=torch.float32, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    ops = {
        "all_gather": lambda: dist.all_gather_into_tensor(full, src),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(out, full),
    }
    results: dict[str, Any] = {}
    for name, op in ops.items():
        for _ in range(warmup):
            op()
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            op()
        sync()
        elapsed = (time.perf_counter() - start) / iters
        # The slowest rank bounds the collective; every rank reports the same number.
        t = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        seconds = float(t.item())
        algbw, busbw = bus_bandwidth(name, total, seconds, world)
        results[name] = {"time_s": seconds, "algbw_gbps": algbw, "busbw_gbps": busbw}
    # Sanity of the data path, not only its speed: reduce-scatter of the gathered ones sums to n.
    if not bool(torch.all(out == float(world)).item()):
        raise TransportGateError(
            f"probe returned wrong data: reduce-scatter of ones gave {out[:4].tolist()}, expected {world}",
            {"ok": False},
        )
    return {"bytes": total, "warmup": warmup, "iters": iters, "collectives": results}


def run_transport_gate(
    expect: str,
    *,
    log_dir: str | None = None,
    size_mb: float | None = None,
    warmup: int = 2,
    iters: int = 5,
    raise_on_failure: bool = True,
) -> dict[str, Any]:
    """Probe, parse and judge on every rank; raise TransportGateError when `expect` is not met.

    `size_mb` is the all-gather output / reduce-scatter input in MiB (default 256 on GPU, 8 on CPU).
    Returns a JSON-able dict with transport, provider, ok, reasons, busbw per collective (GB/s),
    world_size and nodes.
    """
    if expect not in EXPECTATIONS:
        raise ValueError(f"expect must be one of {', '.join(EXPECTATIONS)}; got {expect!r}")
    problem = gate_log_problem(os.environ) if expect != "any" else None
    if problem:
        # Every rank has the same environment, so every rank stops here, before any collective.
        raise TransportGateError(
            f"NCCL transport gate cannot judge the network: {problem}. Remove that setting from "
            "workload.worker_env (the lines go to NCCL_DEBUG_FILE, not to the job log), or set "
            "job.expect_transport to any.",
            {"ok": False, "expect": expect, "reasons": [problem]},
        )
    # Imported here: the classifier and this module's helpers stay usable without torch.
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("run_transport_gate needs an initialised torch.distributed process group")
    backend = str(dist.get_backend())
    if "nccl" in backend and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    if size_mb is None:
        size_mb = 256 if device.type == "cuda" else 8
    prepare_nccl_log_dir()
    probe = _probe(dist, torch, device, size_bytes=int(size_mb * 2**20), warmup=warmup, iters=iters)

    pid = os.getpid()
    paths = find_own_log(log_dir, pid=pid)
    mine = {
        "rank": dist.get_rank(),
        "host": socket.gethostname(),
        "node": host_key(os.environ),
        "logs": [str(p) for p in paths],
        "procs": _own_facts(paths, pid),
        "env": {k: os.environ.get(k) for k in CHECK_VARIABLES},
    }
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)

    procs = [p for g in gathered for p in g["procs"]]
    verdict = classify(procs, expect)
    nodes = sorted({g.get("node") or g["host"] for g in gathered})
    result = verdict.to_dict()
    result.pop("ranks")
    if verdict.status == "no-nccl":
        missing = [g["rank"] for g in gathered if not g["logs"]]
        result["notes"].append(
            f"backend {backend}: no NCCL log found for ranks {_ranges(missing)}"
            if missing
            else f"backend {backend}: NCCL logs hold no network lines"
        )
    result.update(
        backend=backend,
        world_size=dist.get_world_size(),
        nodes=len(nodes),
        node_names=nodes,
        probe=probe,
        busbw_gbps={k: v["busbw_gbps"] for k, v in probe["collectives"].items()},
        algbw_gbps={k: v["algbw_gbps"] for k, v in probe["collectives"].items()},
        per_rank=[{"rank": g["rank"], "host": g["host"], "logs": g["logs"]} for g in gathered],
    )
    if not verdict.ok and raise_on_failure:
        raise TransportGateError(gate_message(result, [g["env"] for g in gathered]), result)
    return result


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and runs[-1][1] == r - 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs) or "none"


def gate_message(result: dict[str, Any], envs: list[dict[str, str | None]] | None = None) -> str:
    """The failure message: what was expected, who fell back where, and what to check."""
    expect = result["expect"]
    got = result.get("transport") or "no NCCL network lines"
    nodes = ", ".join(result.get("node_names") or result["hosts"])
    lines = [
        f"NCCL transport gate failed: expected {expect}, got {got} "
        f"(world size {result.get('world_size')}, nodes {nodes})."
    ]
    by_host: dict[str, list[dict[str, Any]]] = {}
    for f in result.get("fallback", []):
        by_host.setdefault(f["host"], []).append(f)
    for host, items in sorted(by_host.items()):
        ranks = _ranges([f["rank"] for f in items if f["rank"] is not None])
        kinds = sorted({f["transport"] for f in items})
        paths = sorted({p for f in items for p in f["paths"]})
        lines.append(f"  fell back: host {host} ranks {ranks}: {', '.join(kinds)} via {'; '.join(paths[:3])}")
    for reason in result.get("reasons", [])[:8]:
        lines.append(f"  - {reason}")
    if envs:
        seen: dict[str, set[str]] = {}
        for env in envs:
            for key, value in env.items():
                seen.setdefault(key, set()).add("<unset>" if value is None else value)
        shown = "; ".join(f"{k}={'|'.join(sorted(v))}" for k, v in seen.items())
        lines.append(f"  worker environment: {shown}")
    lines.append(
        "  check: the worker pods request vpc.amazonaws.com/efa (requests == limits) and the nodes "
        "have it allocatable (raytrain verify); FI_PROVIDER=efa; NCCL_NET_PLUGIN (aws-ofi-nccl, "
        "libnccl-net.so on LD_LIBRARY_PATH); NCCL_SOCKET_IFNAME (the pod interface, eth0); and that "
        "NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET, NCCL_DEBUG_FILE reach the workers "
        "(its directory must exist before NCCL starts)."
    )
    return "\n".join(lines)

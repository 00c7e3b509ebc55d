"""Classify the network path NCCL used, from its debug log, and judge it against an expectation.

NCCL with ``NCCL_DEBUG=INFO`` and ``NCCL_DEBUG_SUBSYS`` including ``INIT,NET`` writes lines like

    ip-10-0-1-7:412:530 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 1 nics)
    ip-10-0-1-7:412:530 [0] NCCL INFO Using network Libfabric
    ip-10-0-1-7:412:601 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/Libfabric/0/GDRDMA

(``host:pid:tid [cudaDev]``; the bracket is the local CUDA device, not the rank: ranks come from the
``comm 0x… rank R nranks N … Init START/COMPLETE`` lines). One file per process with
``NCCL_DEBUG_FILE=…/nccl.%h.%p.log``, or all processes interleaved in one stream: both parse the same,
because every line names its host and pid.

Why the provider line is required: aws-ofi-nccl prints ``Using network AWS Libfabric`` (plugin
1.7/1.8; ``Libfabric`` from 1.9) as soon as the plugin loads, and libfabric may still pick its TCP
provider, or NCCL may drop the plugin and fall back to ``Socket``. Only ``NET/OFI Selected provider is
efa`` (1.7/1.8: ``Selected Provider is efa (found N nics)``) together with channels ``via NET/…Libfabric``
shows inter-node traffic on EFA.

Pure Python, no torch: the CLI runs anywhere the logs are, and the in-job gate imports it cheaply.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EXPECTATIONS = ("efa", "socket", "ib", "any")

# Exit codes of the command line.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_NO_NCCL = 2

NO_NCCL_REASON = "no NCCL network lines"

# `host:pid:tid [cudaDev] NCCL INFO message`; warnings put `file.cc:LINE` before `NCCL WARN`.
# Searched, not anchored: Ray, kubectl, mpirun and CloudWatch put their own prefixes
# (`(RayTrainWorker pid=…)`, `[1,3]<stdout>:`, timestamps) in front.
_PREFIX = re.compile(
    r"(?P<host>[A-Za-z0-9][\w.\-]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d+)\] "
    r"(?:\S+:\d+ )?NCCL (?P<level>INFO|WARN|TRACE|ABORT) (?P<msg>.*)$"
)
_VERSION = re.compile(r"NCCL version (?P<version>\d+\.\d+\.\d+)(?P<build>\S*)")
_USING_NETWORK = re.compile(r"^Using network (?P<net>.+?)\s*$")
# aws-ofi-nccl 1.7-1.8: "Selected Provider is efa (found 4 nics)"; older: no count;
# 1.9+: "Selected provider is efa, fabric is efa-direct (found 4 nics)".
_OFI_PROVIDER = re.compile(
    r"NET/OFI Selected [Pp]rovider is (?P<prov>[\w;\-]+)"
    r"(?:, fabric is (?P<fabric>[^\s(]+))?(?: \(found (?P<nics>\d+) nics?\))?"
)
_OFI_VERSION = re.compile(r"NET/OFI Initializing (?P<version>aws-ofi-nccl \S+)")
_PLUGIN_LOADED = re.compile(r"NET/Plugin\s*: Loaded (?:net|coll) plugin (?P<name>.+?) \(v\d+\)")
# "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:10.0.0.1<0>"
# "NET/Socket : Using [0]eth0:10.0.1.23<0> [1]eth1:10.0.2.23<0>"
_NET_DEVICES = re.compile(r"^NET/(?P<net>IB|Socket)\s*: Using (?P<devs>.*?)(?: ; OOB .*)?$")
_NET_DEVICE_ITEM = re.compile(r"\[\d+\](?P<name>[^\s\[]+)")
# Channel setup: "Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0", "Channel 01/1 : 2[2] -> 5[5]
# via P2P/CUMEM/read"; before 2.12 the bracket held the bus id ("2[c7000]") and some versions print
# "Channel 00 :" without the connection index. "Ring 00 : 7 -> 8 [send] via NET/…" is NCCL < 2.7.
_CHANNEL = re.compile(
    r"^(?:Channel|Ring) (?P<channel>\d+)(?:/\d+)? : (?P<src>\d+)(?:\[[0-9a-fA-F]+\])? -> "
    r"(?P<dst>\d+)(?:\[[0-9a-fA-F]+\])?(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$"
)
_VIA_NET = re.compile(r"^NET/(?P<net>[^/]+)/(?P<dev>\d+)(?P<flags>\S*)")
# "comm 0x55d… rank 3 nranks 8 cudaDev 3 nvmlDev 3 busId 53000 commId 0x9f… - Init START"
_COMM = re.compile(
    r"comm (?P<ptr>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+)"
    r"(?: cudaDev (?P<dev>-?\d+))?.*?(?:commId (?P<commid>0x[0-9a-fA-F]+))?"
    r"(?: - Init (?P<phase>START|COMPLETE))?\s*$"
)
# NCCL 2.19+: "comm 0x… rank 0 nRanks 8 nNodes 2 localRanks 4 localRank 0 MNNVL 0": NCCL's own count
# of nodes (hosts by host hash: in Kubernetes every pod counts as one).
_TOPOLOGY = re.compile(r"nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) localRanks (?P<local>\d+)")
# "GPU Direct RDMA Enabled for GPU 0 / HCA 0 (distance 4 <= 4), read 1 mode Default"
_GDR = re.compile(r"GPU Direct RDMA (?P<state>Enabled|Disabled) for (?:GPU|HCA)")


def _network_kind(name: str) -> str:
    """Normalise a NCCL network name: 'AWS Libfabric'/'Libfabric' -> libfabric, 'IBext_v8' -> ib."""
    low = name.strip().lower()
    if "libfabric" in low or low.startswith("ofi"):
        return "libfabric"
    if low.startswith("ib"):
        return "ib"
    if low.startswith("socket"):
        return "socket"
    return low


@dataclass
class Channel:
    channel: int
    src: int
    dst: int
    direction: str | None
    via: str  # as printed: "NET/Libfabric/0/GDRDMA", "P2P/CUMEM/read", "SHM/direct/direct"
    network: str | None  # NET name for network paths ("Libfabric", "Socket", "IB"), else None
    gdr: bool
    comm: str | None  # key of the communicator the line belongs to, when known
    inter_node: bool | None = None  # filled in once every process's host is known

    @property
    def kind(self) -> str:
        """'net' for network paths, else the intra-node transport family (p2p, shm, nvls, …)."""
        return "net" if self.network is not None else self.via.split("/", 1)[0].lower()

    def to_dict(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "src": self.src,
            "dst": self.dst,
            "direction": self.direction,
            "via": self.via,
            "inter_node": self.inter_node,
        }


@dataclass
class ProcessLog:
    """Everything one NCCL process (one rank, normally) said about its network."""

    host: str
    pid: int
    sources: set[str] = field(default_factory=set)
    cuda_devices: set[int] = field(default_factory=set)
    nccl_version: str | None = None
    ofi_version: str | None = None
    networks: list[str] = field(default_factory=list)  # every "Using network X", in order
    plugins_loaded: list[str] = field(default_factory=list)
    provider: str | None = None
    fabric: str | None = None
    nics: int | None = None
    gdr: bool | None = None
    comms: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (rank, nranks)
    channels: list[Channel] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    init_complete: bool = False
    nnodes: int | None = None  # as NCCL counted them for its largest communicator
    lines: int = 0
    _thread_comm: dict[int, str] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> tuple[str, int]:
        return (self.host, self.pid)

    @property
    def world(self) -> tuple[str, int, int] | None:
        """(comm key, rank, nranks) of the largest communicator: torch's default process group."""
        if not self.comms:
            return None
        key, (rank, nranks) = max(self.comms.items(), key=lambda item: item[1][1])
        return key, rank, nranks

    @property
    def rank(self) -> int | None:
        world = self.world
        return world[1] if world else None

    @property
    def network(self) -> str | None:
        """The network NCCL finally selected (a fallback prints a second "Using network")."""
        return self.networks[-1] if self.networks else None

    @property
    def net_channels(self) -> list[Channel]:
        return [c for c in self.channels if c.network is not None]

    @property
    def has_network_lines(self) -> bool:
        return bool(self.networks or self.channels or self.provider or self.nics is not None)

    def transport_of(self, network: str) -> str:
        """What traffic on `network` really rides on: efa, socket, ib, or libfabric:<provider>."""
        kind = _network_kind(network)
        if kind != "libfabric":
            return kind
        if self.provider is None:
            return "libfabric:unproven"
        return "efa" if self.provider.split(";")[0].startswith("efa") else f"libfabric:{self.provider}"

    def to_dict(self) -> dict[str, Any]:
        nets = sorted({c.via for c in self.net_channels})
        intra = sorted({c.via for c in self.channels if c.network is None})
        return {
            "host": self.host,
            "pid": self.pid,
            "rank": self.rank,
            "nranks": self.world[2] if self.world else None,
            "cuda_devices": sorted(self.cuda_devices),
            "nccl_version": self.nccl_version,
            "ofi_plugin": self.ofi_version,
            "network": self.network,
            "networks_seen": self.networks,
            "provider": self.provider,
            "fabric": self.fabric,
            "nics": self.nics,
            "gdr": self.gdr,
            "channels": len(self.channels),
            "network_paths": nets,
            "intra_node_paths": intra,
            "init_complete": self.init_complete,
            "nccl_nodes": self.nnodes,
            "warnings": self.warnings[:5],
            "sources": sorted(self.sources),
        }


def parse_lines(
    lines: Iterable[str],
    *,
    source: str = "<stream>",
    into: dict[tuple[str, int], ProcessLog] | None = None,
) -> dict[tuple[str, int], ProcessLog]:
    """Fold NCCL log lines into per-process facts; lines of other programs are skipped.

    A truncated last line simply fails to match; the facts before it stand.
    """
    procs = {} if into is None else into
    for raw in lines:
        m = _PREFIX.search(raw.rstrip("\r\n"))
        if not m:
            continue
        key = (m["host"], int(m["pid"]))
        proc = procs.get(key)
        if proc is None:
            proc = procs[key] = ProcessLog(host=key[0], pid=key[1])
        proc.sources.add(source)
        proc.lines += 1
        dev = int(m["dev"])
        if dev >= 0:
            proc.cuda_devices.add(dev)
        _apply(proc, int(m["tid"]), m["level"], m["msg"].strip())
    return procs


def _apply(proc: ProcessLog, tid: int, level: str, msg: str) -> None:  # noqa: PLR0911, PLR0912
    if level == "WARN":
        proc.warnings.append(msg)
        return
    if (v := _VERSION.search(msg)) and msg.startswith("NCCL version"):
        proc.nccl_version = v["version"] + v["build"]
        return
    if u := _USING_NETWORK.match(msg):
        proc.networks.append(u["net"])
        return
    if p := _OFI_PROVIDER.search(msg):
        proc.provider = p["prov"]
        proc.fabric = p["fabric"]
        if p["nics"] is not None:
            proc.nics = int(p["nics"])
        return
    if o := _OFI_VERSION.search(msg):
        proc.ofi_version = o["version"]
        return
    if pl := _PLUGIN_LOADED.search(msg):
        proc.plugins_loaded.append(pl["name"])
        return
    if d := _NET_DEVICES.match(msg):
        # Only counts NICs for the built-in transports; the OFI provider line carries its own count.
        if proc.provider is None:
            proc.nics = len(_NET_DEVICE_ITEM.findall(d["devs"]))
        return
    if g := _GDR.search(msg):
        enabled = g["state"] == "Enabled"
        proc.gdr = enabled or bool(proc.gdr)
        return
    if t := _TOPOLOGY.search(msg):
        proc.nnodes = max(proc.nnodes or 0, int(t["nnodes"]))
        return
    if "Destroy" in msg or "Abort" in msg:
        return  # teardown lines repeat the comm without its commId
    if c := _COMM.search(msg):
        # Before NCCL 2.19 there is no commId: the size is the best key that all ranks share.
        comm_key = c["commid"] or f"nranks={c['nranks']}"
        proc.comms[comm_key] = (int(c["rank"]), int(c["nranks"]))
        proc._thread_comm[tid] = comm_key
        if c["phase"] == "COMPLETE":
            proc.init_complete = True
        return
    if ch := _CHANNEL.match(msg):
        via = ch["via"]
        net = _VIA_NET.match(via)
        flags = net["flags"] if net else ""
        gdr = "GDRDMA" in flags
        if gdr:
            proc.gdr = True
        proc.channels.append(
            Channel(
                channel=int(ch["channel"]),
                src=int(ch["src"]),
                dst=int(ch["dst"]),
                direction=ch["dir"],
                via=via,
                network=net["net"] if net else None,
                gdr=gdr,
                comm=proc._thread_comm.get(tid),
            )
        )


def parse_files(paths: Sequence[str | Path]) -> list[ProcessLog]:
    procs: dict[tuple[str, int], ProcessLog] = {}
    for path in paths:
        p = Path(path)
        with p.open(encoding="utf-8", errors="replace") as fh:
            parse_lines(fh, source=p.name, into=procs)
    return sorted(procs.values(), key=lambda pr: (pr.rank is None, pr.rank or 0, pr.host, pr.pid))


def _mark_inter_node(procs: Sequence[ProcessLog]) -> None:
    """Decide per channel whether its peer is on another host, where the peer's host is known."""
    host_of: dict[tuple[str, int], str] = {}
    for proc in procs:
        for comm_key, (rank, _n) in proc.comms.items():
            host_of[(comm_key, rank)] = proc.host
    for proc in procs:
        world = proc.world
        for ch in proc.channels:
            key = ch.comm or (world[0] if world else None)
            if key is None:
                ch.inter_node = None
                continue
            src = host_of.get((key, ch.src))
            dst = host_of.get((key, ch.dst))
            if src is not None and dst is not None:
                ch.inter_node = src != dst
            else:
                # A log set missing the peer's file: a network path is the only hint.
                ch.inter_node = True if ch.network is not None else None


@dataclass
class Verdict:
    expect: str
    ok: bool
    status: str  # "ok", "failed", "no-nccl"
    transport: str | None
    provider: str | None
    nccl_version: str | None
    inter_node: bool
    hosts: list[str]
    world_size: int | None
    reasons: list[str]
    notes: list[str]
    fallback: list[dict[str, Any]]  # processes whose inter-node traffic is not on the expected path
    ranks: list[dict[str, Any]]
    transports: dict[str, list[str]] = field(default_factory=dict)  # transport -> "host rank N"
    nccl_nodes: int | None = None  # nodes as NCCL counted them (2.19+), beside the host names

    @property
    def exit_code(self) -> int:
        if self.status == "no-nccl":
            return EXIT_NO_NCCL
        return EXIT_OK if self.ok else EXIT_FAILED

    def to_dict(self) -> dict[str, Any]:
        return {
            "expect": self.expect,
            "ok": self.ok,
            "status": self.status,
            "transport": self.transport,
            "provider": self.provider,
            "nccl_version": self.nccl_version,
            "inter_node": self.inter_node,
            "hosts": self.hosts,
            "nccl_nodes": self.nccl_nodes,
            "world_size": self.world_size,
            "reasons": self.reasons,
            "notes": self.notes,
            "fallback": self.fallback,
            "transports": self.transports,
            "ranks": self.ranks,
        }


def _where(proc: ProcessLog) -> str:
    rank = "rank ?" if proc.rank is None else f"rank {proc.rank}"
    return f"{proc.host} {rank} (pid {proc.pid})"


def _joined(values: Iterable[str | None]) -> str | None:
    found = sorted({v for v in values if v})
    return ",".join(found) if found else None


def classify(procs: Sequence[ProcessLog], expect: str = "efa") -> Verdict:  # noqa: PLR0912, PLR0915
    """Judge the parsed logs against `expect` (efa, socket, ib or any)."""
    if expect not in EXPECTATIONS:
        raise ValueError(f"expect must be one of {', '.join(EXPECTATIONS)}; got {expect!r}")
    procs = sorted(procs, key=lambda pr: (pr.rank is None, pr.rank or 0, pr.host, pr.pid))
    _mark_inter_node(procs)
    hosts = sorted({p.host for p in procs})
    worlds = [p.world[2] for p in procs if p.world]
    world_size = max(worlds) if worlds else None
    versions = _joined(p.nccl_version for p in procs)
    notes: list[str] = []
    if versions and "," in versions:
        notes.append(f"processes run different NCCL versions: {versions}")
    ranks = [p.to_dict() for p in procs]

    if not any(p.has_network_lines for p in procs):
        ok = expect == "any"
        if ok:
            notes.append("no NCCL network lines: nothing to check (expect any)")
        return Verdict(
            expect=expect,
            ok=ok,
            status="no-nccl",
            transport=None,
            provider=None,
            nccl_version=versions,
            inter_node=False,
            hosts=hosts,
            world_size=world_size,
            reasons=[] if ok else [NO_NCCL_REASON],
            notes=notes,
            fallback=[],
            ranks=ranks,
        )

    inter_channels = [(p, c) for p in procs for c in p.channels if c.inter_node]
    # Network channels between processes of one host (NCCL_P2P/SHM disabled, or the peer's log
    # absent) still show which network NCCL would use; judge them too.
    net_channels = [(p, c) for p in procs for c in p.net_channels]
    nccl_nodes = max((p.nnodes or 0 for p in procs), default=0)
    multi_host = len(hosts) > 1 or nccl_nodes > 1
    inter_node = multi_host or bool(inter_channels)

    # Per process: the transports its network channels ride on; without channel lines (log cut
    # before the channels were set up) the selection lines are all there is.
    per_proc: dict[tuple[str, int], set[str]] = {}
    for p, c in net_channels:
        per_proc.setdefault(p.key, set()).add(p.transport_of(c.network or ""))
    if inter_node:
        # Ranks whose ring/tree peers all sit on their own node build no network channel but still
        # selected a network; a log cut before the channels were set up looks the same.
        cut: list[str] = []
        for p in procs:
            if p.key not in per_proc and p.network is not None:
                per_proc[p.key] = {p.transport_of(p.network)}
                if not p.init_complete:
                    cut.append(_where(p))
        if cut:
            notes.append(
                "log ends before NCCL finished initialising (truncated?), judged from the "
                f"'Using network' and provider lines: {', '.join(cut)}"
            )
    transports = sorted(set().union(*per_proc.values())) if per_proc else []
    by_key = {p.key: p for p in procs}

    if not transports:
        if multi_host:
            transport = None
            notes.append("several hosts but no network selection or channel lines")
        else:
            kinds = sorted({c.kind for p in procs for c in p.channels})
            transport = "intra-node" if kinds else None
            notes.append(
                "single node: no inter-node path exists, so the network transport was not "
                "exercised" + (f" (intra-node paths: {', '.join(kinds)})" if kinds else "")
            )
    elif len(transports) == 1:
        transport = transports[0]
    else:
        transport = "mixed"
    providers = _joined(by_key[k].provider for k in per_proc)
    provider = providers if providers else _joined(p.provider for p in procs)

    reasons: list[str] = []
    fallback: list[dict[str, Any]] = []
    if expect != "any":
        for p in procs:
            bad = sorted(k for k in per_proc.get(p.key, ()) if k != expect)
            if not bad:
                continue
            paths = sorted({c.via for c in p.net_channels}) or [f"Using network {p.network}"]
            why = _explain(p, bad, expect)
            reasons.append(f"{_where(p)}: {why} [{'; '.join(paths[:3])}]")
            fallback.append(
                {
                    "host": p.host,
                    "rank": p.rank,
                    "pid": p.pid,
                    "transport": ",".join(bad),
                    "network": p.network,
                    "provider": p.provider,
                    "paths": paths,
                }
            )
        if not per_proc and multi_host:
            shown = ", ".join(hosts)
            reasons.append(f"several hosts ({shown}) but no network lines prove the {expect} path")
    ok = not reasons
    if ok and transport in (None, "intra-node") and expect != "any":
        notes.append(f"expectation {expect!r} not exercised")
    breakdown: dict[str, list[str]] = {}
    for p in procs:
        for kind in sorted(per_proc.get(p.key, ())):
            breakdown.setdefault(kind, []).append(_where(p))
    return Verdict(
        expect=expect,
        ok=ok,
        status="ok" if ok else "failed",
        transport=transport,
        provider=provider,
        nccl_version=versions,
        inter_node=inter_node,
        hosts=hosts,
        world_size=world_size,
        reasons=reasons,
        notes=notes,
        fallback=fallback,
        ranks=ranks,
        transports=breakdown,
        nccl_nodes=nccl_nodes or None,
    )


def _explain(p: ProcessLog, bad: list[str], expect: str) -> str:
    if "libfabric:unproven" in bad:
        return (
            f"network plugin {p.network or 'Libfabric'!r} loaded but no 'NET/OFI Selected provider' "
            "line: the plugin line alone does not prove EFA"
        )
    if any(b.startswith("libfabric:") for b in bad):
        return f"libfabric selected provider {p.provider!r}, not {expect}"
    shown = ", ".join(bad)
    if p.networks and len(set(p.networks)) > 1:
        return f"fell back to {shown} (networks tried: {' -> '.join(p.networks)})"
    return f"inter-node traffic on {shown}, expected {expect}"


def classify_files(paths: Sequence[str | Path], expect: str = "efa") -> Verdict:
    return classify(parse_files(paths), expect)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.network.transport",
        description="Classify NCCL's network transport from NCCL_DEBUG=INFO logs. "
        "Exit 0: expectation holds; 1: it does not; 2: no NCCL network lines in the logs.",
    )
    parser.add_argument("--expect", choices=EXPECTATIONS, default="efa")
    parser.add_argument("--brief", action="store_true", help="leave out the per-rank detail")
    parser.add_argument("logs", nargs="+", metavar="LOGFILE")
    args = parser.parse_args(argv)
    missing = [p for p in args.logs if not Path(p).is_file()]
    if missing:
        parser.error(f"no such log file: {', '.join(missing)}")
    verdict = classify_files(args.logs, args.expect)
    out = verdict.to_dict()
    if args.brief:
        out.pop("ranks")
    print(json.dumps(out, indent=2))
    return verdict.exit_code


if __name__ == "__main__":
    sys.exit(main())

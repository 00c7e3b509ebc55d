"""NCCL transport classifier: fixtures in the log formats of NCCL 2.18-2.27 / aws-ofi-nccl 1.7-1.14."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training.network import transport
from training.network.transport import classify, classify_files, parse_files, parse_lines

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "nccl"
ROOT = Path(__file__).resolve().parents[3]


def logs(case: str) -> list[Path]:
    path = FIX / case
    return sorted(path.glob("*.log")) if path.is_dir() else [path]


def test_efa_per_rank_files_pass_and_report_facts() -> None:
    v = classify_files(logs("efa_g6"), "efa")
    assert v.ok and v.exit_code == 0
    assert v.transport == "efa" and v.provider == "efa"
    assert v.nccl_version == "2.26.2+cuda12.2"
    assert v.inter_node is True
    assert v.world_size == 4
    assert v.hosts == ["ip-10-0-1-17", "ip-10-0-1-38"]
    assert v.reasons == [] and v.fallback == []
    by_rank = {r["rank"]: r for r in v.ranks}
    assert sorted(by_rank) == [0, 1, 2, 3]
    r0 = by_rank[0]
    assert r0["host"] == "ip-10-0-1-17" and r0["pid"] == 412
    assert r0["network"] == "Libfabric" and r0["fabric"] == "efa" and r0["nics"] == 1
    assert r0["ofi_plugin"] == "aws-ofi-nccl 1.14.0"
    assert r0["network_paths"] == ["NET/Libfabric/0"]
    assert r0["intra_node_paths"] == ["SHM/direct/direct"]
    # g6 (L4) has no GPUDirect RDMA: no GDRDMA flag, no "GPU Direct RDMA Enabled" line.
    assert r0["gdr"] is None


def test_channels_split_into_intra_and_inter_node() -> None:
    procs = parse_files(logs("efa_g6"))
    classify(procs, "efa")  # marks channels
    rank0 = next(p for p in procs if p.rank == 0)
    inter = {(c.src, c.dst) for c in rank0.channels if c.inter_node}
    intra = {(c.src, c.dst) for c in rank0.channels if c.inter_node is False}
    assert inter == {(3, 0), (2, 0), (0, 2)}  # ring from the other node, tree both ways
    assert intra == {(0, 1)}
    assert all(c.network == "Libfabric" for c in rank0.channels if c.inter_node)


def test_socket_fallback_fails_even_with_the_plugin_line() -> None:
    v = classify_files(logs("socket_fallback"), "efa")
    assert not v.ok and v.exit_code == 1
    assert v.transport == "socket" and v.provider is None
    assert {f["rank"] for f in v.fallback} == {0, 1, 2, 3}
    assert {f["host"] for f in v.fallback} == {"ip-10-0-1-17", "ip-10-0-1-38"}
    assert all("NET/Socket/0" in f["paths"] for f in v.fallback)
    assert any("AWS Libfabric -> Socket" in r for r in v.reasons)
    r0 = next(r for r in v.ranks if r["rank"] == 0)
    assert r0["networks_seen"] == ["AWS Libfabric", "Socket"]
    assert any("fi_getinfo() call failed" in w for w in r0["warnings"])
    # The same logs are what an explicitly socket-only job expects.
    assert classify_files(logs("socket_fallback"), "socket").ok


def test_libfabric_tcp_provider_is_not_efa() -> None:
    v = classify_files(logs("libfabric_tcp"), "efa")
    assert not v.ok
    assert v.transport == "libfabric:tcp" and v.provider == "tcp"
    assert all("provider 'tcp'" in r for r in v.reasons)


def test_plugin_line_without_provider_line_is_not_proof() -> None:
    v = classify_files(logs("plugin_only"), "efa")
    assert not v.ok
    assert [(f["host"], f["pid"]) for f in v.fallback] == [
        ("ip-10-0-1-38", 388),
        ("ip-10-0-1-38", 389),
    ]
    assert all("does not prove EFA" in r for r in v.reasons)
    assert v.transports["libfabric:unproven"] == [
        "ip-10-0-1-38 rank ? (pid 388)",
        "ip-10-0-1-38 rank ? (pid 389)",
    ]
    assert any("truncated" in n for n in v.notes)


def test_truncated_log_keeps_the_lines_before_the_cut() -> None:
    files = logs("truncated_efa")
    assert not files[-1].read_text().endswith("\n")  # the fixture really is cut mid-line
    v = classify_files(files, "efa")
    assert v.ok and v.transport == "efa"
    cut = next(r for r in v.ranks if r["rank"] == 3)
    assert cut["init_complete"] is False and cut["provider"] == "efa"
    assert any("rank 3" in n and "truncated" in n for n in v.notes)


def test_interleaved_stream_with_foreign_prefixes_separates_processes() -> None:
    v = classify_files(logs("interleaved_p4d_efa.log"), "efa")
    assert v.ok and v.transport == "efa"
    assert v.nccl_version == "2.18.3+cuda12.1"
    assert v.world_size == 16 and len(v.ranks) == 16
    assert v.hosts == ["ip-10-1-3-5", "ip-10-1-7-9"]
    r7 = next(r for r in v.ranks if r["rank"] == 7)
    # Old spellings: "Selected Provider is efa (found 4 nics)", "AWS Libfabric", bus-id brackets.
    assert r7["nics"] == 4 and r7["fabric"] is None and r7["gdr"] is True
    assert r7["network_paths"] == ["NET/AWS Libfabric/3/GDRDMA"]
    r6 = next(r for r in v.ranks if r["rank"] == 6)
    assert r6["network_paths"] == [] and r6["intra_node_paths"] == ["P2P/IPC/read"]
    # Every rank either built network channels or, finishing init, had only intra-node peers.
    assert all(r["init_complete"] for r in v.ranks)
    assert v.notes == []


def test_infiniband() -> None:
    v = classify_files(logs("ib_mpirun.log"), "ib")
    assert v.ok and v.transport == "ib" and v.provider is None
    r0 = next(r for r in v.ranks if r["rank"] == 0)
    assert r0["nics"] == 2 and r0["gdr"] is True
    assert r0["network_paths"] == ["NET/IB/0/GDRDMA"]
    bad = classify_files(logs("ib_mpirun.log"), "efa")
    assert not bad.ok and "expected efa" in bad.reasons[0]


def test_single_node_passes_with_a_note() -> None:
    v = classify_files(logs("single_node"), "efa")
    assert v.ok and v.exit_code == 0
    assert v.inter_node is False and v.transport == "intra-node"
    assert any("single node" in n for n in v.notes)
    assert v.nccl_version == "2.27.3+cuda12.9"


def test_no_nccl_lines() -> None:
    v = classify_files(logs("no_nccl.log"), "efa")
    assert not v.ok and v.exit_code == 2
    assert v.reasons == [transport.NO_NCCL_REASON]
    anyv = classify_files(logs("no_nccl.log"), "any")
    assert anyv.ok and anyv.exit_code == 2 and anyv.notes


@pytest.mark.parametrize(
    ("line", "provider", "fabric", "nics"),
    [
        ("NET/OFI Selected Provider is efa", "efa", None, None),
        ("NET/OFI Selected Provider is efa (found 4 nics)", "efa", None, 4),
        ("NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)", "efa", "efa-direct", 32),
        (
            "NET/OFI Selected provider is tcp;ofi_rxm, fabric is 10.0.0.0/16 (found 1 nics)",
            "tcp;ofi_rxm",
            "10.0.0.0/16",
            1,
        ),
    ],
)
def test_provider_spellings(line: str, provider: str, fabric: str | None, nics: int | None) -> None:
    procs = parse_lines([f"ip-10-0-0-1:7:9 [0] NCCL INFO {line}\n"])
    (p,) = procs.values()
    assert (p.provider, p.fabric, p.nics) == (provider, fabric, nics)


@pytest.mark.parametrize(
    ("via", "network", "gdr"),
    [
        ("NET/Libfabric/0/GDRDMA", "Libfabric", True),
        ("NET/AWS Libfabric/1/GDRDMA/Shared", "AWS Libfabric", True),
        ("NET/Socket/0", "Socket", False),
        ("NET/IBext_v8/5", "IBext_v8", False),
        ("P2P/CUMEM/read", None, False),
        ("P2P/IPC", None, False),
        ("SHM/direct/direct", None, False),
    ],
)
def test_channel_paths(via: str, network: str | None, gdr: bool) -> None:
    line = f"h:1:2 [0] NCCL INFO Channel 03/1 : 0[0] -> 1[1] [send] via {via}"
    (p,) = parse_lines([line]).values()
    (c,) = p.channels
    assert (c.channel, c.src, c.dst, c.network, c.gdr, c.via) == (3, 0, 1, network, gdr, via)


def test_efa_direct_fabric_counts_as_efa() -> None:
    lines = [
        "h1:1:1 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 4 nics)",
        "h1:1:1 [0] NCCL INFO Using network Libfabric",
        "h1:1:1 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Libfabric/0/GDRDMA",
        "h2:5:5 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 4 nics)",
        "h2:5:5 [0] NCCL INFO Using network Libfabric",
        "h2:5:5 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via NET/Libfabric/0/GDRDMA",
    ]
    v = classify(list(parse_lines(lines).values()), "efa")
    assert v.ok and v.transport == "efa"


@pytest.mark.parametrize(
    ("networks", "expect_ok", "transport"),
    [
        # The plugin was picked first, then NCCL fell back: the rank's traffic is on sockets.
        (["Libfabric", "Socket"], False, "socket"),
        # A second selection of the plugin after a socket line: the last one is what NCCL uses.
        (["Socket", "Libfabric"], True, "efa"),
    ],
)
def test_a_ranks_last_using_network_line_decides(
    networks: list[str], expect_ok: bool, transport: str
) -> None:
    """Without channel lines (the log ends before NCCL set them up) the gate judges each rank by
    the network NCCL selected last (NCCL prints 'Using network' again when it falls back)."""
    lines = []
    for host in ("h1:1:1", "h2:5:5"):
        lines.append(f"{host} [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 1 nics)")
        lines += [f"{host} [0] NCCL INFO Using network {net}" for net in networks]
    v = classify(list(parse_lines(lines).values()), "efa")
    assert (v.ok, v.transport) == (expect_ok, transport), v.reasons
    assert [r["network"] for r in v.ranks] == [networks[-1]] * 2


def test_bad_expectation_is_rejected() -> None:
    with pytest.raises(ValueError, match="expect must be one of"):
        classify([], "tcp")


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "training.network.transport", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )


def test_cli_exit_codes_and_json() -> None:
    good = run_cli("--expect", "efa", *map(str, logs("efa_g6")))
    assert good.returncode == 0, good.stderr
    out = json.loads(good.stdout)
    for key in ("transport", "provider", "nccl_version", "inter_node", "ok", "reasons", "ranks"):
        assert key in out
    assert out["transport"] == "efa" and out["ok"] is True

    bad = run_cli(*map(str, logs("socket_fallback")))  # --expect defaults to efa
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["transport"] == "socket"

    none = run_cli("--expect", "any", str(FIX / "no_nccl.log"))
    assert none.returncode == 2
    assert json.loads(none.stdout)["reasons"] == []

    missing = run_cli(str(FIX / "does-not-exist.log"))
    assert missing.returncode == 2 and "no such log file" in missing.stderr


def test_cli_main_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    rc = transport.main(["--brief", "--expect", "socket", *map(str, logs("efa_g6"))])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and "ranks" not in out
    assert "expected socket" in out["reasons"][0]


def test_real_nccl_2_28_capture() -> None:
    """Captured on one H200 with NCCL 2.28.9 (torch 2.11): two ranks told they are on two hosts
    (NCCL_HOSTID), NCCL_NET=Socket over lo. Channels are connected lazily, after Init COMPLETE."""
    files = logs("real_h200_nccl2.28_socket")
    v = classify_files(files, "socket")
    assert v.ok and v.transport == "socket"
    assert v.nccl_version == "2.28.9+cuda13.0"
    assert v.hosts == ["vm"] and v.nccl_nodes == 2 and v.inter_node is True
    r0 = next(r for r in v.ranks if r["rank"] == 0)
    assert r0["nics"] == 1 and r0["gdr"] is False and r0["network_paths"] == ["NET/Socket/0"]
    assert r0["nccl_nodes"] == 2 and r0["init_complete"] is True
    efa = classify_files(files, "efa")
    assert not efa.ok and {f["rank"] for f in efa.fallback} == {0, 1}


@pytest.mark.parametrize("case", ["real_2xh200_fsdp_socket", "real_2xh200_gate_efa"])
def test_real_two_gpu_training_captures(case: str) -> None:
    """Captured on two H200s of one host (NCCL 2.28.9): the training job's own workers, told they
    are two hosts by `--emulate-hosts 2` (one NCCL_HOSTID each), so NCCL connects its GPUs through
    NET/Socket on eth0 instead of NVLink. fsdp_socket: the 1.5B FSDP run whose in-job gate expected
    socket and passed; gate_efa: the run whose gate expected efa and stopped the job."""
    files = logs(case)
    ok = classify_files(files, "socket")
    assert ok.ok and ok.transport == "socket" and ok.inter_node is True
    assert ok.nccl_version == "2.28.9+cuda13.0" and ok.hosts == ["vm"] and ok.nccl_nodes == 2
    assert {r["rank"] for r in ok.ranks} == {0, 1}
    assert all(set(r["network_paths"]) <= {"NET/Socket/0", "NET/Socket/0/Shared"} for r in ok.ranks)
    efa = classify_files(files, "efa")
    assert not efa.ok and efa.status == "failed"
    assert {f["rank"] for f in efa.fallback} == {0, 1}
    assert all("NET/Socket/0" in f["paths"] for f in efa.fallback)
    assert any("rank 0" in r and "socket" in r and "expected efa" in r for r in efa.reasons)


# --- properties: order across processes and cut points do not break the parser ------------------

_EFA_LINES = [f.read_text().splitlines(keepends=True) for f in logs("efa_g6")]
_EFA_REFERENCE = classify_files(logs("efa_g6"), "efa")


@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False))
def test_any_interleaving_of_the_ranks_gives_the_same_verdict(rnd: random.Random) -> None:
    queues = [list(lines) for lines in _EFA_LINES]
    stream: list[str] = []
    while any(queues):
        q = rnd.choice([q for q in queues if q])
        stream.append(q.pop(0))  # each process's own lines stay in order, as in a real stream
    v = classify(list(parse_lines(stream).values()), "efa")
    assert (v.ok, v.transport, v.provider, v.world_size) == (True, "efa", "efa", 4)
    assert v.ranks == [{**r, "sources": ["<stream>"]} for r in _EFA_REFERENCE.ranks]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=0, max_value=len("".join(_EFA_LINES[3]))), st.sampled_from(("efa", "socket", "any"))
)
def test_a_log_cut_anywhere_still_parses(cut: int, expect: str) -> None:
    text = "".join(_EFA_LINES[3])[:cut]
    lines = [line for f in _EFA_LINES[:3] for line in f] + text.splitlines(keepends=True)
    v = classify(list(parse_lines(lines).values()), expect)
    assert v.exit_code in (0, 1)
    # Three complete EFA ranks on two hosts: a partial fourth never turns the verdict into socket.
    assert v.transport in ("efa", "mixed")
    assert v.ok == (expect in ("efa", "any") and v.transport == "efa")

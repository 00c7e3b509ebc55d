"""In-job transport gate: a real 2-process gloo group (CPU), plus fixture logs for the verdict."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest

from training.network import probe as netprobe
from training.network.probe import (
    TransportGateError,
    bus_bandwidth,
    find_own_log,
    gate_message,
    nccl_env,
)
from training.network.transport import classify_files

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "nccl"


def test_nccl_env_names_one_file_per_process(tmp_path: Path) -> None:
    env = nccl_env(str(tmp_path))
    assert env == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
        "NCCL_DEBUG_FILE": f"{tmp_path}/nccl.%h.%p.log",
    }


@pytest.mark.parametrize(
    ("collective", "n", "algbw", "busbw"),
    [
        ("all_gather", 2, 4.0, 2.0),
        ("all_gather", 8, 4.0, 3.5),
        ("reduce_scatter", 16, 4.0, 3.75),
        ("all_reduce", 8, 4.0, 7.0),
    ],
)
def test_bus_bandwidth_matches_nccl_tests(collective: str, n: int, algbw: float, busbw: float) -> None:
    # 2 GB in 0.5 s is 4 GB/s of algorithm bandwidth (nccl-tests' GB/s are 1e9 bytes).
    got = bus_bandwidth(collective, 2_000_000_000, 0.5, n)
    assert got == pytest.approx((algbw, busbw))


def test_bus_bandwidth_rejects_unknowns() -> None:
    with pytest.raises(ValueError, match="no bus bandwidth formula"):
        bus_bandwidth("broadcast", 1, 1.0, 2)
    with pytest.raises(ValueError, match="positive"):
        bus_bandwidth("all_gather", 1, 0.0, 2)


def test_find_own_log_matches_pid_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("nccl.pod-a.41.log", "nccl.pod-b.41.log", "nccl.pod-a.410.log", "nccl.pod-a.4.log", "x.log"):
        (tmp_path / name).write_text("")
    monkeypatch.delenv("NCCL_DEBUG_FILE", raising=False)
    got = [p.name for p in find_own_log(str(tmp_path), pid=41)]
    assert got == ["nccl.pod-a.41.log", "nccl.pod-b.41.log"]
    # Without log_dir the pattern comes from NCCL_DEBUG_FILE, whatever its shape.
    (tmp_path / "rank-77-on-h.txt").write_text("")
    monkeypatch.setenv("NCCL_DEBUG_FILE", f"{tmp_path}/rank-%p-on-%h.txt")
    assert [p.name for p in find_own_log(pid=77)] == ["rank-77-on-h.txt"]
    monkeypatch.delenv("NCCL_DEBUG_FILE")
    assert find_own_log(pid=77) == []  # NCCL writes to stdout: nothing to read back
    assert find_own_log(str(tmp_path / "missing"), pid=41) == []


def test_prepare_nccl_log_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_DEBUG_FILE", f"{tmp_path}/a/b/nccl.%h.%p.log")
    assert netprobe.prepare_nccl_log_dir() == tmp_path / "a" / "b"
    assert (tmp_path / "a" / "b").is_dir()
    monkeypatch.setenv("NCCL_DEBUG_FILE", f"{tmp_path}/%h/nccl.%p.log")
    assert netprobe.prepare_nccl_log_dir() is None
    assert not (tmp_path / "%h").exists()
    monkeypatch.delenv("NCCL_DEBUG_FILE")
    assert netprobe.prepare_nccl_log_dir() is None


def test_gate_message_names_hosts_ranks_and_variables() -> None:
    verdict = classify_files(sorted((FIX / "socket_fallback").glob("*.log")), "efa")
    result = verdict.to_dict()
    result.update(world_size=4, node_names=verdict.hosts)
    envs: list[dict[str, str | None]] = [
        {"FI_PROVIDER": "efa", "NCCL_NET_PLUGIN": None, "NCCL_SOCKET_IFNAME": "eth0"},
        {"FI_PROVIDER": "efa", "NCCL_NET_PLUGIN": "ofi", "NCCL_SOCKET_IFNAME": "eth0"},
    ]
    msg = gate_message(result, envs)
    assert msg.startswith("NCCL transport gate failed: expected efa, got socket")
    assert "host ip-10-0-1-17 ranks 0-1: socket via NET/Socket/0" in msg
    assert "host ip-10-0-1-38 ranks 2-3: socket via NET/Socket/0" in msg
    assert "NCCL_NET_PLUGIN=<unset>|ofi" in msg
    for var in ("vpc.amazonaws.com/efa", "FI_PROVIDER", "NCCL_NET_PLUGIN", "NCCL_SOCKET_IFNAME"):
        assert var in msg


def test_gate_rejects_bad_expectation_before_touching_torch() -> None:
    with pytest.raises(ValueError, match="expect must be one of"):
        netprobe.run_transport_gate("tcp")


def test_gate_needs_a_process_group() -> None:
    with pytest.raises(RuntimeError, match=r"initialised torch\.distributed"):
        netprobe.run_transport_gate("any")


# --- a real process group: two CPU ranks over gloo --------------------------------------------


def _plant_fixture_log(log_dir: Path, fixture: Path, rank: int) -> None:
    """Copy a fixture rank's NCCL log as if this process had written it (its host name and pid)."""
    files = sorted(fixture.glob("*.log"))
    text = files[rank].read_text()
    host = socket.gethostname().split(".")[0]
    text = re.sub(r"^[\w.\-]+:\d+:", f"{host}:{os.getpid()}:", text, flags=re.MULTILINE)
    (log_dir / f"nccl.{host}.{os.getpid()}.log").write_text(text)


def _worker(rank: int, world: int, port: int, out: str, case: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    log_dir = Path(out) / "logs"
    record: dict[str, object] = {}
    try:
        # 1. gloo and no NCCL log: "any" passes with a note, the probe measured gloo.
        record["any"] = netprobe.run_transport_gate("any", log_dir=str(log_dir), size_mb=1, iters=2)
        # 2. expecting EFA without NCCL logs fails on every rank.
        try:
            netprobe.run_transport_gate("efa", log_dir=str(log_dir), size_mb=1, warmup=1, iters=1)
            record["efa_error"] = None
        except TransportGateError as exc:
            record["efa_error"] = str(exc)
        # 3. each rank finds its own (planted) NCCL log; the verdict is taken over all ranks.
        _plant_fixture_log(log_dir, FIX / case, rank)
        dist.barrier()
        try:
            record["fixture"] = netprobe.run_transport_gate("efa", log_dir=str(log_dir), size_mb=1, iters=1)
        except TransportGateError as exc:
            record["fixture_error"] = str(exc)
            record["fixture_result"] = exc.result
    finally:
        dist.destroy_process_group()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def gloo_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, object]]]:
    import torch.multiprocessing as mp

    runs: dict[str, list[dict[str, object]]] = {}
    # Two fixtures of 2 ranks each: the first two rank files of a 4-rank fixture are one host; the
    # planted logs carry this machine's host name, so both ranks land on one host here.
    for case in ("socket_fallback",):
        out = tmp_path_factory.mktemp(case)
        (out / "logs").mkdir()
        mp.spawn(_worker, args=(2, _free_port(), str(out), case), nprocs=2, join=True)
        runs[case] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return runs


def test_gloo_probe_passes_for_any_with_a_note(gloo_runs: dict[str, list[dict[str, object]]]) -> None:
    r0, r1 = gloo_runs["socket_fallback"]
    a0, a1 = r0["any"], r1["any"]
    assert isinstance(a0, dict) and isinstance(a1, dict)
    assert a0["ok"] is True and a0["status"] == "no-nccl"
    assert a0["backend"] == "gloo" and a0["world_size"] == 2 and a0["nodes"] == 1
    assert any("no NCCL log found for ranks 0-1" in n for n in a0["notes"])
    for coll in ("all_gather", "reduce_scatter"):
        assert a0["busbw_gbps"][coll] > 0
        # The max over ranks is shared, so every rank reports the same bandwidth.
        assert a0["busbw_gbps"][coll] == a1["busbw_gbps"][coll]
        assert a0["busbw_gbps"][coll] == pytest.approx(a0["algbw_gbps"][coll] / 2)
    assert a0["probe"]["bytes"] == 2**20
    json.dumps(a0)  # JSON-able as promised


def test_gloo_expecting_efa_fails_on_every_rank(gloo_runs: dict[str, list[dict[str, object]]]) -> None:
    for rec in gloo_runs["socket_fallback"]:
        err = rec["efa_error"]
        assert isinstance(err, str)
        assert "expected efa, got no NCCL network lines" in err
        assert "NCCL_DEBUG_FILE" in err


def test_gate_gathers_every_ranks_log(gloo_runs: dict[str, list[dict[str, object]]]) -> None:
    r0, r1 = gloo_runs["socket_fallback"]
    assert "fixture" not in r0 and "fixture" not in r1
    err = r0["fixture_error"]
    assert isinstance(err, str) and err == r1["fixture_error"]
    host = socket.gethostname().split(".")[0]
    assert f"host {host} ranks 0-1: socket via NET/Socket/0" in err
    res = r0["fixture_result"]
    assert isinstance(res, dict)
    assert res["transport"] == "socket" and res["ok"] is False
    assert {f["rank"] for f in res["fallback"]} == {0, 1}
    assert all(len(p["logs"]) == 1 for p in res["per_rank"])


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}, None),
        ({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "ALL"}, None),
        ({"NCCL_DEBUG": "info", "NCCL_DEBUG_SUBSYS": "^COLL,P2P"}, None),
        ({"NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "INIT,NET"}, "NCCL_DEBUG=WARN"),
        ({"NCCL_DEBUG": "VERSION"}, "NCCL_DEBUG=VERSION"),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"}, "missing NET"),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^NET"}, "missing NET"),
    ],
)
def test_gate_log_problem(env, problem):
    from training.network.probe import gate_log_problem

    found = gate_log_problem(env)
    assert (found is None) if problem is None else (problem in (found or "")), found


@pytest.mark.parametrize(
    "env", [{"NCCL_DEBUG": "WARN"}, {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,COLL"}]
)
def test_gate_refuses_to_judge_blind_logs_before_any_collective(monkeypatch, env):
    """A worker_env that hides NCCL's network lines stops the gate with the reason, not with
    'no NCCL network lines' after the probe (no process group is needed to get there)."""
    from training.network.probe import TransportGateError, run_transport_gate

    monkeypatch.delenv("NCCL_DEBUG_SUBSYS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(TransportGateError, match=r"cannot judge the network: NCCL_DEBUG") as info:
        run_transport_gate("efa")
    assert "worker_env" in str(info.value)
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    with pytest.raises(RuntimeError, match=r"initialised torch\.distributed"):
        run_transport_gate("any")  # 'any' judges nothing, so it needs no lines

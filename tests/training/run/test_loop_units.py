"""Pure pieces of the worker loop and the summary: transport expectation, LR schedule, summary."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from pathlib import Path

import pytest

from training.model.build import host_layout
from training.network.probe import host_key
from training.options.train import parse_args
from training.reporting.summary import PLOT_FILE, SUMMARY_FILE, summarize, write
from training.run.loop import EXPECT_ENV, StepProfiler, emulated_host_id, lr_at, resolve_expect

# The image the job runs in has no matplotlib (config/image.toml): there the plot is skipped.
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


@pytest.mark.parametrize(
    ("flag", "backend", "nodes", "env", "want"),
    [
        ("auto", "gloo", 4, {EXPECT_ENV: "efa"}, "any"),  # CPU: no NCCL traffic to judge
        ("auto", "nccl", 1, {EXPECT_ENV: "efa"}, "any"),  # one node: no inter-node link
        ("auto", "nccl", 2, {EXPECT_ENV: "efa"}, "efa"),
        ("auto", "nccl", 2, {}, "any"),
        ("socket", "gloo", 1, {EXPECT_ENV: "efa"}, "socket"),  # explicit always wins
        ("efa", "nccl", 1, {}, "efa"),
    ],
)
def test_resolve_expect(flag: str, backend: str, nodes: int, env: dict[str, str], want: str) -> None:
    assert resolve_expect(flag, backend, nodes, env) == want


def test_lr_schedule_warms_up_then_decays_to_a_tenth() -> None:
    opts = parse_args(["--init", "random", "--steps", "100", "--lr", "1.0", "--warmup-steps", "10"])
    lrs = [lr_at(s, opts) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))
    assert lr_at(100, opts) == pytest.approx(0.1)


def test_summary_and_plot(tmp_path: Path) -> None:
    # 8 steps of 0.1 s; a restart after step 4 (a new process: its clock starts again at 0) and
    # 0.2 s spent reporting after step 6. Each step moves 4 x 16 tokens.
    ends = [0.1, 0.2, 0.3, 0.4, 0.1, 0.2, 0.5, 0.6]
    history = [
        {"step": s, "loss": 5.0 - 0.1 * s, "tokens_per_s": 640.0, "step_time_s": 0.1, "end_s": ends[s - 1],
         "data_wait_s": 0.001, "peak_mem_gib": 0.5 + s / 100, "mfu": 0.4}
        for s in range(1, 9)
    ]  # fmt: skip
    meta = {
        "step": 8,
        "history": history,
        "resumes": [{"from_step": 4, "world_size": 2, "rng_restored": True}],
        "transport": {"transport": "efa", "ok": True},
        "world_size": 2,
        "global_batch_size": 4,
        "flops_per_token": 1e9,
        "peak_tflops": 1.0,
        "device": "cpu",
    }
    summ = summarize(meta, {"run_name": "r", "seq_len": 16}, wall_s=12.0)
    # The window is the last process's steps after its start-up step (step 5): steps 6-8, from the
    # end of step 5 (0.1 s) to the end of step 8 (0.6 s), the reporting gap included.
    assert summ["window"]["steps"] == 3
    assert summ["tokens_per_s"] == pytest.approx(3 * 64 / 0.5)
    assert summ["mfu"] == pytest.approx(summ["tokens_per_s"] * 1e9 / (2 * 1e12))
    assert summ["window"]["in_step_fraction"] == pytest.approx(0.3 / 0.5)
    assert summ["data_wait_fraction"] == pytest.approx(0.01)
    assert summ["final_loss"] == pytest.approx(4.2)
    assert summ["peak_mem_gib"] == pytest.approx(0.58)
    assert summ["transport"] == {"transport": "efa", "ok": True}
    written = write(summ, str(tmp_path / "out"), str(tmp_path / "storage"))
    assert json.loads((tmp_path / "out" / SUMMARY_FILE).read_text())["steps"] == 8
    if HAS_MATPLOTLIB:
        assert (tmp_path / "out" / PLOT_FILE).read_bytes()[:4] == b"\x89PNG"
    assert len(written) == (2 if HAS_MATPLOTLIB else 1)


def test_summary_window_of_a_fresh_run_leaves_out_its_first_step() -> None:
    # No resume: step 1 holds process start-up and compilation (4 s here) and must not count.
    # Seen on the GPU: with step 1 in the window, summary.json reported 34.5k tok/s for a run
    # whose steps 2-30 ran at 47.5k.
    ends = [4.0, 4.5, 5.0, 5.5]
    times = [4.0, 0.5, 0.5, 0.5]
    history = [
        {"step": s, "loss": 1.0, "step_time_s": times[s - 1], "end_s": ends[s - 1],
         "data_wait_s": 0.01 if s == 1 else 0.005, "peak_mem_gib": 1.0}
        for s in range(1, 5)
    ]  # fmt: skip
    meta = {"step": 4, "history": history, "global_batch_size": 2}
    summ = summarize(meta, {"run_name": "r", "seq_len": 8}, wall_s=6.0)
    assert summ["window"]["steps"] == 3
    assert summ["tokens_per_s"] == pytest.approx(3 * 16 / 1.5)
    assert summ["step_time_s"] == pytest.approx(0.5)
    assert summ["data_wait_fraction"] == pytest.approx(0.01)


def test_summary_without_matplotlib_still_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The image has no matplotlib: a finished run must still write its numbers, and no plot.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    meta = {"step": 1, "history": [{"step": 1, "loss": 1.0, "tokens_per_s": 5.0, "peak_mem_gib": 0.1}]}
    written = write(summarize(meta, {"run_name": "r"}, wall_s=1.0), str(tmp_path), str(tmp_path / "s"))
    assert written == [str(tmp_path / SUMMARY_FILE)]
    assert not (tmp_path / PLOT_FILE).exists()


@pytest.mark.parametrize(
    ("keys", "want"),
    [
        (["a", "a", "b", "b"], (2, 2)),
        (["a"] * 8, (1, 8)),
        (["a", "b", "c", "d"], (4, 1)),
        (["a", "a", "a", "b"], (2, None)),  # unequal hosts
        (["a", "b", "a", "b"], (2, None)),  # a host's ranks not contiguous
        (["a", "a", "b", "b", "c", "c"], (3, 2)),
    ],
)
def test_host_layout(keys: list[str], want: tuple[int, int | None]) -> None:
    assert host_layout(keys) == want


def test_emulated_hosts_are_contiguous_blocks() -> None:
    ids = [emulated_host_id(r, 8, 2) for r in range(8)]
    assert ids == ["emulated-host-0"] * 4 + ["emulated-host-1"] * 4
    assert host_layout(ids) == (2, 4)
    assert host_layout([emulated_host_id(r, 4, 4) for r in range(4)]) == (4, 1)


def test_host_key_prefers_nccl_hostid() -> None:
    import socket

    assert host_key({"NCCL_HOSTID": "h7"}) == "h7"
    assert host_key({}) == socket.gethostname()


def test_step_profiler_writes_trace_and_table_on_rank0_only(tmp_path: Path) -> None:
    import torch

    x = torch.randn(64, 64)
    written: dict[int, list[str]] = {}
    for rank in (0, 1):
        prof = StepProfiler("2:3", str(tmp_path / f"r{rank}"), rank=rank, on_gpu=False)
        files: list[str] = []
        for step in range(1, 5):
            prof.before_step(step)
            _ = (x @ x).sum()
            files += prof.after_step(step)
        written[rank] = files
    assert written[1] == [] and not (tmp_path / "r1" / "profile").exists()
    trace, table = written[0]
    assert trace.endswith("trace-steps2-3-rank0.json.gz") and Path(trace).stat().st_size > 0
    assert "aten::mm" in Path(table).read_text()


def test_recompute_materialized_pointwise_sets_the_partitioner_flag() -> None:
    import torch._functorch.config as functorch_config

    from training.model.build import recompute_materialized_pointwise

    before = functorch_config.ban_recompute_materialized_backward
    try:
        functorch_config.ban_recompute_materialized_backward = True
        recompute_materialized_pointwise()
        assert functorch_config.ban_recompute_materialized_backward is False
    finally:
        functorch_config.ban_recompute_materialized_backward = before

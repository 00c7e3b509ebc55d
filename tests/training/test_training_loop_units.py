"""Pure pieces of the worker loop and the summary: transport expectation, LR schedule, summary."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from training.loop import EXPECT_ENV, lr_at, resolve_expect
from training.options import parse_args
from training.summary import PLOT_FILE, SUMMARY_FILE, summarize, write


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
    history = [
        {"step": s, "loss": 5.0 - 0.1 * s, "tokens_per_s": 100.0 * (s if s != 1 else 0.1),
         "step_time_s": 0.1, "data_wait_s": 0.001, "peak_mem_gib": 0.5 + s / 100, "mfu": 0.4}
        for s in range(1, 9)
    ]  # fmt: skip
    meta = {
        "step": 8,
        "history": history,
        "resumes": [{"from_step": 4, "world_size": 2, "rng_restored": True}],
        "transport": {"transport": "efa", "ok": True},
        "world_size": 2,
        "device": "cpu",
    }
    summ = summarize(meta, {"run_name": "r"}, wall_s=12.0)
    # Start-up steps (the first, and the first after a resume) stay out of the throughput mean.
    assert summ["tokens_per_s"] == pytest.approx(100.0 * (2 + 3 + 4 + 6 + 7 + 8) / 6)
    assert summ["final_loss"] == pytest.approx(4.2)
    assert summ["peak_mem_gib"] == pytest.approx(0.58)
    assert summ["transport"] == {"transport": "efa", "ok": True}
    written = write(summ, str(tmp_path / "out"), str(tmp_path / "storage"))
    assert json.loads((tmp_path / "out" / SUMMARY_FILE).read_text())["steps"] == 8
    assert (tmp_path / "out" / PLOT_FILE).read_bytes()[:4] == b"\x89PNG"
    assert len(written) == 2

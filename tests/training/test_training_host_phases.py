"""bench/gpu_busy.py's host-phase clock on the loop's own trainer (CPU, tiny shape): every phase
the loop runs is seen, the phases and the remainder add up to the step's wall time, and the
trainer is left as it was."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu_busy import HostPhases, split_config  # noqa: E402
from training.loop import _Trainer  # noqa: E402
from training.options import parse_args  # noqa: E402


def test_phases_add_up_to_the_step_and_leave_the_trainer_unchanged(single_rank_group: None) -> None:
    opts = parse_args(
        ["--init", "random", "--shape", "tiny", "--seq-len", "32", "--steps", "4",
         "--global-batch-size", "4", "--micro-batch-size", "2", "--grad-clip", "1.0"]
    )  # fmt: skip
    tr = _Trainer(opts, None, place=(0, 1, torch.device("cpu")))
    tr.train_step()
    phases = HostPhases(tr)
    with phases.clip():
        times = [tr.train_step()["step_time_s"] for _ in range(2)]
    phases.close()
    ms = phases.per_step_ms(2, times)
    assert set(ms) == {"forward", "backward", "clip", "optimizer", "zero_grad", "other"}
    assert all(ms[k] > 0 for k in ("forward", "backward", "clip", "optimizer", "zero_grad")), ms
    assert sum(ms.values()) == pytest.approx(sum(times) / 2 * 1e3, abs=0.05)
    assert ms["other"] > -0.05  # the phases run inside the step's clock
    # Restored: the class's methods again, the forward hooks gone, torch's clip as it was.
    assert "_micro_batches" not in vars(tr) and "zero_grad" not in vars(tr.optimizer)
    assert torch.nn.utils.clip_grad_norm_.__name__ == "clip_grad_norm_"
    before = dict(phases.total)
    tr.train_step()
    assert phases.total == before


@pytest.mark.parametrize(
    ("name", "base", "suffixes"),
    [
        ("float8", "float8", set()),
        ("bf16-gathered-combo", "bf16-gathered", {"-combo"}),
        ("float8-combo-cppwrapper", "float8", {"-combo", "-cppwrapper"}),
    ],
)
def test_config_names_carry_the_compiler_settings(name: str, base: str, suffixes: set[str]) -> None:
    assert split_config(name) == (base, suffixes)

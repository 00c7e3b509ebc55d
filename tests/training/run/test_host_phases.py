"""bench/gpu_busy.py's host-phase clock on the loop's own trainer (CPU, tiny shape): every phase
the loop runs is seen, the phases and the remainder add up to the step's wall time, and the
trainer is left as it was."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu_busy import HostPhases, split_config  # noqa: E402
from training.options.train import parse_args  # noqa: E402
from training.run.loop import _Trainer  # noqa: E402


def _trainer() -> _Trainer:
    opts = parse_args(
        ["--init", "random", "--shape", "tiny", "--seq-len", "32", "--steps", "8",
         "--global-batch-size", "4", "--micro-batch-size", "2", "--grad-clip", "1.0"]
    )  # fmt: skip
    return _Trainer(opts, None, place=(0, 1, torch.device("cpu")))


def test_every_phase_is_timed_once_per_call_inside_the_step(single_rank_group: None) -> None:
    tr = _trainer()
    tr.train_step()
    with HostPhases(tr) as phases:
        times = [tr.train_step()["step_time_s"] for _ in range(2)]
    # 2 steps of 2 micro-batches: a forward per micro-batch, the rest once per step.
    assert phases.calls == {"forward": 4, "micro_batches": 2, "clip": 2, "optimizer": 2, "zero_grad": 2}
    ms = phases.per_step_ms(times)
    step_ms = sum(times) / 2 * 1e3
    timed = ("forward", "backward", "clip", "optimizer", "zero_grad")
    assert all(0 < ms[k] < step_ms for k in timed), (ms, step_ms)
    assert sum(ms[k] for k in timed) < step_ms  # the phases run inside the step's clock


def test_the_trainer_is_left_as_it_was(single_rank_group: None) -> None:
    tr = _trainer()
    clip = torch.nn.utils.clip_grad_norm_
    hooks = (len(tr.model._forward_pre_hooks), len(tr.model._forward_hooks))
    phases = HostPhases(tr)
    with pytest.raises(RuntimeError, match="stop"), phases:
        tr.train_step()
        raise RuntimeError("stop")  # a step that fails: everything is restored all the same
    assert "_micro_batches" not in vars(tr)
    assert "step" not in vars(tr.optimizer) and "zero_grad" not in vars(tr.optimizer)
    assert torch.nn.utils.clip_grad_norm_ is clip
    assert (len(tr.model._forward_pre_hooks), len(tr.model._forward_hooks)) == hooks
    before = dict(phases.calls)
    tr.train_step()
    assert phases.calls == before


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

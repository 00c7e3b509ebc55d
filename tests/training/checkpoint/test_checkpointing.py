"""--activation-checkpointing recomputes each decoder layer's forward in the backward: on chat
blocks (per-conversation positions, masked labels) the loss and every gradient are those of the
same step without it. prod trains this way (BENCHMARKS.md, "The step-time model and the L4
defaults"); its speed on an L4 is a prediction, its correctness is this test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import training.run.loop as loop
import training.run.trainer as trainer
from tests.training.methods.test_loss import _blocks, write_chat_blocks
from training.model.build import apply_fsdp
from training.options.train import parse_args


def _step(data: str, extra: list[str]) -> tuple[float, dict[str, torch.Tensor]]:
    opts = parse_args(
        ["--init", "random", "--shape", "tiny", "--data", data, "--seq-len", "16", "--micro-batch-size", "2",
         "--global-batch-size", "4", "--num-workers", "1", "--steps", "1", "--no-compile", *extra]
    )  # fmt: skip
    tr = loop._Trainer(opts, data, place=(0, 1, torch.device("cpu")))
    loss, _, _ = tr.accumulate_gradients()
    return float(loss), {n: p.grad.full_tensor().clone() for n, p in tr.model.named_parameters()}


def test_checkpointed_layers_give_the_same_loss_and_gradients(
    single_rank_group: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fp32(model: Any, mesh: Any, **kw: Any) -> Any:  # compare to float rounding, not bf16's
        return apply_fsdp(model, mesh, **{**kw, "mixed_precision": False})

    monkeypatch.setattr(trainer, "apply_fsdp", fp32)
    data = write_chat_blocks(tmp_path / "data", *_blocks())
    plain_loss, plain = _step(data, [])
    ac_loss, ac = _step(data, ["--activation-checkpointing"])
    assert ac_loss == pytest.approx(plain_loss, rel=1e-6)
    assert plain.keys() == ac.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(ac[name], grad, rtol=1e-5, atol=1e-7, msg=name)

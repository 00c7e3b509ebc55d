"""Checkpoints that cannot be resumed from are input errors naming the checkpoint and its step, read
with the real DCP reader: a corrupt train_state.json, another model's shape (wider, deeper or
shallower), a truncated shard or .metadata, a corrupt RNG file."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from training.checkpoint import dcp as checkpoint
from training.common.errors import CheckpointError, InputError
from training.model.build import apply_fsdp, make_mesh
from training.model.shapes import SHAPES

STEP = 7


def _model(**over: Any) -> tuple[Any, torch.optim.Optimizer]:
    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(Qwen2Config(**{**SHAPES["tiny"], **over}))
    apply_fsdp(m, make_mesh("cpu", "full", 1, 1))
    return m, torch.optim.AdamW(m.parameters(), lr=1e-3)


@pytest.fixture(scope="module")
def saved(single_rank_group: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, opt = _model()
    ids = torch.randint(0, 257, (2, 16), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    opt.step()
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint_000"
    checkpoint.save(str(path), model, opt, step=STEP, position=14)
    return path


def _copy(saved: Path, tmp: Path, damage: Callable[[Path], None]) -> str:
    dst = tmp / "checkpoint_001"
    shutil.copytree(saved, dst)
    damage(dst)
    return str(dst)


def _truncate(name: str) -> Callable[[Path], None]:
    def cut(d: Path) -> None:
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[: len(data) // 2])

    return cut


def _state(text: str) -> Callable[[Path], None]:
    def write(d: Path) -> None:
        (d / checkpoint.STATE_FILE).write_text(text)

    return write


def test_an_intact_checkpoint_loads(saved: Path) -> None:
    model, opt = _model()
    assert checkpoint.load(str(saved), model, opt)["step"] == STEP


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"vocab_size": 300}, "Size mismatch between saved torch.Size([264, 128]) and current"),
        ({"num_hidden_layers": 5}, "Missing key in checkpoint state_dict: model.model.layers.4"),
        # DCP itself would load the 3 layers it is asked for and drop the fourth without a word.
        ({"num_hidden_layers": 3}, "saved parameters this model lacks (first model.model.layers.3."),
    ],
)
def test_another_shape_is_named(saved: Path, over: dict[str, Any], needle: str) -> None:
    model, opt = _model(**over)
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(str(saved), model, opt)
    msg = str(err.value)
    assert msg.startswith(f"checkpoint {saved} (step {STEP}): it was saved by a model of another shape")
    assert needle in msg and "--run-name" in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (_state('{"step": 7, "posi'), "train_state.json is not valid JSON"),
        (_state('{"step": "7"}'), "lacks integer step, position"),
        (lambda d: (d / checkpoint.STATE_FILE).unlink(), "no train_state.json"),
        (_truncate(".metadata"), f"(step {STEP}): it is incomplete or corrupt"),
        (_truncate("__0_0.distcp"), f"(step {STEP}): it is incomplete or corrupt"),
        (_truncate("rng-rank0.pt"), "rng-rank0.pt is corrupt"),
    ],
)  # fmt: skip
def test_damaged_checkpoint_is_named(
    saved: Path, tmp_path: Path, damage: Callable[[Path], None], needle: str
) -> None:
    path = _copy(saved, tmp_path, damage)
    model, opt = _model()
    with pytest.raises(InputError) as err:
        checkpoint.load(path, model, opt)
    msg = str(err.value)
    assert msg.startswith(f"checkpoint {path}") and needle in msg and "\n" not in msg, msg

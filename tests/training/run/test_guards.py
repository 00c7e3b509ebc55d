"""--skip-guard-eval: which runs skip dynamo's guard evaluation, and only inside training
micro-batches once the process has run its first steps (its speed-up is measured on the GPU:
BENCHMARKS.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bench.prepared import write_prepared
from training.options.train import OptionError, parse_args
from training.run.loop import SKIP_GUARDS_AFTER, _Trainer

BASE = ["--init", "random", "--shape", "tiny", "--seq-len", "32", "--micro-batch-size", "1",
        "--global-batch-size", "2", "--steps", "4"]  # fmt: skip


def _trainer(argv: list[str], data: str | None = None) -> _Trainer:
    opts = parse_args([*BASE, *(["--data", data] if data else []), *argv])
    return _Trainer(opts, opts.data if data else None, place=(0, 1, torch.device("cpu")))


@pytest.fixture
def stances(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The skip_guard_eval_unsafe value of every set_stance the loop enters."""
    seen: list[bool] = []

    @contextlib.contextmanager
    def spy(stance: str = "default", *, skip_guard_eval_unsafe: bool = False, **_: Any) -> Iterator[None]:
        seen.append(skip_guard_eval_unsafe)
        yield

    monkeypatch.setattr(torch.compiler, "set_stance", spy)
    return seen


def test_guards_are_skipped_only_after_the_first_steps_of_a_process(
    single_rank_group: None, stances: list[bool]
) -> None:
    tr = _trainer(["--compile", "--skip-guard-eval"])
    losses = [tr.train_step()["loss"] for _ in range(4)]
    assert stances == [False] * SKIP_GUARDS_AFTER + [True] * (4 - SKIP_GUARDS_AFTER)
    assert all(np.isfinite(losses))
    stances.clear()
    eager = _trainer(["--no-compile", "--skip-guard-eval"])  # nothing compiled: never skips
    for _ in range(SKIP_GUARDS_AFTER + 1):
        eager.train_step()
    assert stances == [False] * (SKIP_GUARDS_AFTER + 1)


def test_policy_by_data_and_compile(single_rank_group: None, tmp_path: Path) -> None:
    assert not _trainer(["--no-compile"]).skip_guards  # eager layers: no guards to skip
    assert _trainer(["--compile"]).skip_guards  # random ids: one shape, no mask
    tokens = np.random.default_rng(0).integers(0, 257, (8, 32))
    flags = np.ones((8, 32), dtype=np.uint8)
    chat = write_prepared(tmp_path / "chat", tokens, flags)
    # Packed conversations give blocks different attention masks: the guards must stay.
    assert not _trainer(["--compile"], data=chat).skip_guards


def test_skip_guard_eval_with_chat_data_is_refused(tmp_path: Path) -> None:
    tokens = np.random.default_rng(0).integers(0, 257, (8, 32))
    chat = write_prepared(tmp_path / "chat", tokens, np.ones((8, 32), dtype=np.uint8))
    with pytest.raises(OptionError, match="--skip-guard-eval: not with chat data"):
        parse_args([*BASE, "--data", chat, "--skip-guard-eval"])

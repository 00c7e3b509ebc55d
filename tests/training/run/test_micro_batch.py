"""--micro-batch-size auto: the worker takes the memory plan's micro-batch for its GPU (the plan's
choice is tested in tests/test_memory_plan.py; that a worker chooses what synthesis wrote into
the RayJob, in tests/test_settings_memory.py); bad values are refused naming the flag. On a GPU the
choice was run through Ray Train on an H200 (BENCHMARKS.md, "A larger micro-batch, chosen by the
memory plan")."""

from __future__ import annotations

import re

import pytest
import torch

from training.options.train import OptionError, parse_args
from training.run.loop import _Trainer

BASE = ["--init", "random", "--shape", "tiny", "--seq-len", "32", "--steps", "2"]
NEEDS_NUMBER = "--micro-batch-size: must be a positive integer or 'auto'"


def _trainer(argv: list[str]) -> _Trainer:
    opts = parse_args([*BASE, *argv])
    return _Trainer(opts, None, place=(0, 1, torch.device("cpu")))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--micro-batch-size", "auto"], "--micro-batch-size auto: needs --global-batch-size"),
        (["--micro-batch-size", "0"], f"{NEEDS_NUMBER}, got '0'"),
        (["--micro-batch-size", "two"], f"{NEEDS_NUMBER}, got 'two'"),
        (
            ["--micro-batch-size", "auto", "--global-batch-size", "3", "--num-workers", "2"],
            "--global-batch-size: 3 is not a multiple of the 2 workers",
        ),
    ],
)
def test_bad_micro_batch_is_refused_naming_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(OptionError, match=re.escape(message)):
        parse_args([*BASE, *argv])


def test_auto_on_the_cpu_is_one_pass_per_step(single_rank_group: None) -> None:
    # The host's memory is not planned: the rank's whole share of the step in one micro-batch.
    tr = _trainer(["--micro-batch-size", "auto", "--global-batch-size", "4"])
    assert (tr.micro, tr.accum) == (4, 1)
    assert tr.train_step()["loss"] > 0
    assert tr.checkpoint_extra()["micro_batch_size"] == 4


def test_an_explicit_micro_batch_is_kept(single_rank_group: None) -> None:
    tr = _trainer(["--micro-batch-size", "1", "--global-batch-size", "4"])
    assert (tr.micro, tr.accum) == (1, 4)


@pytest.mark.parametrize("shape", ["tiny", "small", "qwen2.5-1.5b"])
def test_the_plan_sizes_the_model_the_worker_built(shape: str) -> None:
    """A worker plans `auto` for the model it built (a pretrained --model decides its shape), read
    from the model's config: for the named shapes, the same sizes as the shape table's."""
    from training.model.build import shape_config
    from training.sizing.memory_plan import Dims

    assert Dims.from_config(shape_config(shape).to_dict()) == Dims.of(shape)


def test_the_summary_keeps_auto_beside_the_choice() -> None:
    from training.reporting.summary import summarize

    options = {"run_name": "r", "micro_batch_size": None}
    summary = summarize({"micro_batch_size": 4, "accum_steps": 1}, options, 1.0)
    assert (summary["options"]["micro_batch_size"], summary["micro_batch_size"]) == ("auto", 4)
    given = summarize({"micro_batch_size": 2, "accum_steps": 2}, {**options, "micro_batch_size": 2}, 1.0)
    assert given["options"]["micro_batch_size"] == 2


def test_parameters_are_freed_by_default_on_the_cpu_and_kept_when_asked(single_rank_group: None) -> None:
    """--reshard-after-forward unset: a GPU worker decides from its memory plan
    (tests/test_memory_plan.py, tests/test_settings_memory.py); a CPU worker, whose host memory is
    not planned, frees them as FSDP2 does by default. Kept through two accumulated micro-batches,
    the step trains the same as freed."""
    from training.reporting.summary import summarize

    argv = ["--micro-batch-size", "1", "--global-batch-size", "2", "--data", "random", "--seed", "0"]
    freed = _trainer(argv)
    assert freed.opts.reshard_after_forward is None and freed.reshard_after_forward is True
    assert freed.checkpoint_extra()["reshard_after_forward"] is True
    assert summarize(freed.checkpoint_extra(), {"run_name": "r"}, 1.0)["reshard_after_forward"] is True
    losses = [freed.train_step()["loss"] for _ in range(2)]
    kept = _trainer([*argv, "--no-reshard-after-forward"])
    assert kept.reshard_after_forward is False and kept.accum == 2
    assert [kept.train_step()["loss"] for _ in range(2)] == pytest.approx(losses, rel=1e-5)


def test_kept_parameters_train_as_freed_around_a_forward_without_gradients(single_rank_group: None) -> None:
    """An evaluation between steps (training/methods/evaluate.py: eval mode, no gradients) leaves kept
    parameters gathered, as nothing reshards them without a backward; the next steps still train as
    with parameters freed, and the checkpoint's state dict stays sharded."""
    argv = ["--micro-batch-size", "1", "--global-batch-size", "2", "--data", "random", "--seed", "0"]

    def run(extra: list[str]) -> list[float]:
        tr = _trainer([*argv, *extra])
        losses = []
        for _ in range(2):
            losses.append(tr.train_step()["loss"])
            tr.model.eval()
            with torch.no_grad():
                tr.model(input_ids=torch.zeros(1, 32, dtype=torch.long), use_cache=False)
            tr.model.train()
            state = tr.model.state_dict()
            assert all(type(t).__name__ == "DTensor" for t in state.values()), extra
        return [*losses, tr.train_step()["loss"]]

    assert run(["--no-reshard-after-forward"]) == pytest.approx(run(["--reshard-after-forward"]), rel=1e-5)

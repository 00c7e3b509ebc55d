"""The run's length and learning-rate schedule: --steps or --epochs, --warmup-steps or --warmup-ratio,
--lr-schedule; each bad value one line naming the flag; epochs become steps once the data is known."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from training.__main__ import main
from training.checkpoint.run_state import differing
from training.data import shards
from training.options.schedule import MIN_LR_RATIO, lr_at, with_epochs
from training.options.train import SAMPLE_DATA, OptionError, parse_args
from training.run.driver import epochs_to_steps

TINY = ["--init", "random", "--shape", "tiny"]


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--warmup-ratio", "1.5"], ["--warmup-ratio", ">= 0 and < 1", "1.5"]),
        (["--warmup-ratio", "-0.1"], ["--warmup-ratio", ">= 0 and < 1"]),
        (
            ["--warmup-steps", "3", "--warmup-ratio", "0.1"],
            ["--warmup-ratio", "not allowed with", "--warmup-steps"],
        ),
        (["--lr-schedule", "step"], ["--lr-schedule", "cosine", "linear", "constant"]),
        (["--epochs", "0"], ["--epochs", "> 0"]),
        (["--epochs", "two"], ["--epochs", "two"]),
        (["--steps", "10", "--epochs", "1"], ["--epochs", "not allowed with", "--steps"]),
        (["--epochs", "1"], ["--epochs", "needs --data"]),
        (["--steps", "10", "--warmup-steps", "10"], ["--warmup-steps", "10 is not fewer", "10 steps"]),
        (["--grad-clip", "-1"], ["--grad-clip", ">= 0"]),
        (["--weight-decay", "-0.1"], ["--weight-decay", ">= 0"]),
        (["--weight-decay", "lots"], ["--weight-decay", "lots"]),
    ],
)
def test_bad_schedule_value_is_one_line_naming_the_flag(
    argv: list[str], needles: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main([*TINY, *argv])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


def test_defaults_and_warmup_forms() -> None:
    opts = parse_args(TINY)
    assert (opts.steps, opts.warmup_steps, opts.lr_schedule, opts.epochs) == (100, 10, "cosine", None)
    # Hugging Face's warmup_ratio: ceil(ratio x steps).
    assert parse_args([*TINY, "--steps", "30", "--warmup-ratio", "0.05"]).warmup_steps == 2
    assert parse_args([*TINY, "--steps", "30", "--warmup-ratio", "0"]).warmup_steps == 0
    assert parse_args([*TINY, "--steps", "30", "--warmup-steps", "7"]).warmup_steps == 7


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_each_schedule_warms_up_then_follows_its_shape(schedule: str) -> None:
    argv = ["--steps", "100", "--lr", "1.0", "--warmup-steps", "10", "--lr-schedule", schedule]
    opts = parse_args([*TINY, *argv])
    lrs = [lr_at(s, opts) for s in range(100)]
    assert lrs[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])  # linear warm-up to --lr
    assert lrs[10] == pytest.approx(1.0)
    after = lrs[10:]
    assert all(a >= b for a, b in itertools.pairwise(after))  # never rises after warm-up
    end = lr_at(100, opts)
    if schedule == "constant":
        assert set(after) == {1.0} and end == 1.0
    else:
        assert end == pytest.approx(MIN_LR_RATIO)
        mid = lr_at(55, opts)  # halfway through the decay
        assert mid == pytest.approx(MIN_LR_RATIO + (1 - MIN_LR_RATIO) / 2)
        # cosine stays near --lr longer than linear at the first quarter
        quarter = lr_at(10 + 90 // 4, opts)
        linear_quarter = 1 - (1 - MIN_LR_RATIO) * (90 // 4) / 90
        if schedule == "linear":
            assert quarter == pytest.approx(linear_quarter)
        else:
            assert quarter > linear_quarter


def _prepared(tmp: Path, blocks: int) -> str:
    tmp.mkdir()
    shards.write_manifest(
        str(tmp),
        {"format": shards.FORMAT, "seq_len": 64, "fingerprint": "f" * 64, "blocks": blocks,
         "shards": [{"name": "shards-x/00000.bin", "blocks": blocks}],
         "tokenizer": {"name": "byte", "vocab_size": 257}},
    )  # fmt: skip
    return shards.join(str(tmp), shards.MANIFEST)


def test_epochs_become_steps_from_the_prepared_sequences(tmp_path: Path) -> None:
    argv = [*TINY, "--data", str(SAMPLE_DATA), "--output-dir", str(tmp_path / "run"), "--seq-len", "64"]
    opts = parse_args([*argv, "--epochs", "2.5", "--global-batch-size", "8", "--micro-batch-size", "2",
                       "--warmup-ratio", "0.1"])  # fmt: skip
    assert opts.steps is None and opts.warmup_steps is None  # known once the data is prepared
    data = _prepared(tmp_path / "prepared", 101)
    resolved = epochs_to_steps(opts, data, workers=2)
    assert resolved.steps == math.ceil(2.5 * 101 / 8) == 32
    assert resolved.warmup_steps == 4  # ceil(0.1 x 32)
    # --eval-fraction's held-out blocks are not trained on: not counted in an epoch.
    held = parse_args([*argv, "--epochs", "1", "--global-batch-size", "4", "--micro-batch-size", "2",
                       "--eval-fraction", "0.2"])  # fmt: skip
    assert epochs_to_steps(held, data, workers=2).steps == math.ceil((101 - 21) / 4)
    # Without --global-batch-size: micro-batch x workers.
    plain = parse_args([*argv, "--epochs", "1", "--micro-batch-size", "3"])
    assert epochs_to_steps(plain, data, workers=2).steps == math.ceil(101 / 6)
    with pytest.raises(OptionError, match=r"^--epochs: the training data holds no sequences"):
        with_epochs(plain, sequences=0, global_batch=6)
    # A --profile range beyond the steps the epochs give is refused then, naming --profile.
    profiled = parse_args([*argv, "--epochs", "1", "--micro-batch-size", "3", "--profile", "30:40"])
    with pytest.raises(OptionError, match=r"^--profile: .*<= --steps \(17\)"):
        epochs_to_steps(profiled, data, workers=2)


def test_resume_follows_a_warmup_ratio_but_not_a_changed_schedule() -> None:
    base = {"steps": 100, "warmup_steps": 5, "warmup_ratio": 0.05, "lr_schedule": "cosine", "epochs": 1.0}
    longer = {**base, "steps": 200, "warmup_steps": 10, "epochs": 2.0}
    assert differing(base, longer) == []
    assert differing(base, {**longer, "lr_schedule": "linear"}) == ["lr_schedule 'cosine' -> 'linear'"]
    fixed = {**base, "warmup_ratio": None}
    assert differing(fixed, {**fixed, "steps": 200}) == []  # explicit 5 steps, kept
    assert differing(fixed, {**fixed, "warmup_steps": 7}) == ["warmup_steps 5 -> 7"]

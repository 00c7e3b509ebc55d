"""The length and learning-rate schedule flags of `python -m training`: how long a run trains (--steps,
or --epochs over the prepared data), its warm-up (--warmup-steps or --warmup-ratio, as Hugging Face's
TrainingArguments name them) and the schedule after it (--lr-schedule cosine, linear or constant).

--epochs becomes a step count once the data's sequences are known: at once for prepared data, else
after the driver has prepared it (`with_epochs`). The learning rate at a step is `lr_at`: a function
of the step and the options, so a resumed run needs nothing saved to continue its schedule."""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Any

from training.options.types import OptionError, non_negative_int, positive

SCHEDULES = ("cosine", "linear", "constant")
DEFAULT_SCHEDULE = "cosine"
DEFAULT_STEPS = 100
# The warm-up without --warmup-steps or --warmup-ratio: 10 % of the steps (rounded down).
DEFAULT_WARMUP_SHARE = 10
# cosine and linear decay from --lr to this share of it at the last step, not to 0: the last steps
# still learn (Llama 2's recipe, arXiv:2307.09288 section 2.2: "decay final learning rate down to 10%
# of the peak learning rate").
MIN_LR_RATIO = 0.1


def _ratio(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 0 and < 1, got {text}")
    return value


_ratio.__name__ = "ratio"


def add_arguments(g: Any) -> None:
    """The run's length and its learning-rate schedule, in their --help order."""
    length = g.add_mutually_exclusive_group()
    length.add_argument(
        "--steps", type=positive(int), help=f"optimizer steps to train (default: {DEFAULT_STEPS})"
    )
    length.add_argument(
        "--epochs",
        type=positive(float),
        help="passes over the training data instead of --steps (may be fractional): the steps are "
        "the data's training sequences (after any --eval-fraction) x EPOCHS / the global batch, "
        "rounded up, known once the data is prepared",
    )
    warmup = g.add_mutually_exclusive_group()
    warmup.add_argument(
        "--warmup-steps",
        type=non_negative_int,
        help=f"steps of linear warm-up from 0 to --lr (default: {DEFAULT_WARMUP_SHARE}%% of the steps)",
    )
    warmup.add_argument(
        "--warmup-ratio",
        type=_ratio,
        help="warm-up as a share of the steps, rounded up (as Hugging Face's warmup_ratio)",
    )
    g.add_argument(
        "--lr-schedule",
        choices=SCHEDULES,
        default=DEFAULT_SCHEDULE,
        help=f"after the warm-up: cosine or linear decay to {MIN_LR_RATIO:g} x --lr at the last "
        "step, or constant --lr",
    )


def check(d: dict[str, Any]) -> None:
    """The step count (unless --epochs leaves it to the data) and the warm-up in steps."""
    if d["epochs"] is not None:
        if d["data"] == "random":
            raise OptionError("--epochs: needs --data (random token ids have no epochs); use --steps")
        return  # steps and warm-up follow once the data's sequences are known (with_epochs)
    if d["steps"] is None:
        d["steps"] = DEFAULT_STEPS
    _warmup(d)


def _warmup(d: dict[str, Any]) -> None:
    steps = d["steps"]
    if d["warmup_ratio"] is not None:
        d["warmup_steps"] = math.ceil(d["warmup_ratio"] * steps)
    elif d["warmup_steps"] is None:
        d["warmup_steps"] = steps * DEFAULT_WARMUP_SHARE // 100
    elif d["warmup_steps"] >= steps > 1:
        raise OptionError(
            f"--warmup-steps: {d['warmup_steps']} is not fewer than the run's {steps} steps: the "
            "learning rate would never reach --lr; lower it or use --warmup-ratio"
        )


def epoch_steps(epochs: float, sequences: int, global_batch: int) -> int:
    """Optimizer steps for `epochs` passes over `sequences` at `global_batch` sequences a step."""
    return max(1, math.ceil(epochs * sequences / global_batch))


def with_epochs(opts: Any, *, sequences: int, global_batch: int) -> Any:
    """`opts` (a TrainOptions, whose module imports this one) with --epochs turned into --steps and
    its warm-up, once the data is known."""
    if opts.epochs is None:
        return opts
    if sequences < 1:
        raise OptionError(f"--epochs: the training data holds no sequences ({opts.data})")
    d = opts.to_dict()
    d["steps"] = epoch_steps(opts.epochs, sequences, global_batch)
    _warmup(d)
    if d["profile"] is not None:
        from training.options.metrics import check_profile

        check_profile(d["profile"], d["steps"])
    return dataclasses.replace(opts, steps=d["steps"], warmup_steps=d["warmup_steps"])


def lr_at(step: int, opts: Any) -> float:
    """The learning rate of `step` (0-based): linear warm-up, then the schedule to the last step."""
    warmup, steps = opts.warmup_steps or 0, opts.steps or 1
    if step < warmup:
        return opts.lr * (step + 1) / warmup
    if opts.lr_schedule == "constant":
        return opts.lr
    frac = min(1.0, (step - warmup) / max(1, steps - warmup))
    if opts.lr_schedule == "linear":
        return opts.lr * (1 - (1 - MIN_LR_RATIO) * frac)
    return opts.lr * (MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * frac)))

"""The job's length and learning-rate schedule settings (steps or epochs, warmup_steps or warmup_ratio,
lr_schedule, weight_decay, grad_clip) reach `python -m training` as its own flags, unset ones as the
training command's defaults; a bad value is one settings line naming the field."""

from __future__ import annotations

import re

import pytest

from config.loader import ENVIRONMENTS_DIR, SettingsError, parse_settings
from k8s.job import rayjob_name, training_args
from training.options.train import parse_args

DEV = (ENVIRONMENTS_DIR / "dev.yaml").read_text()
PROD = (ENVIRONMENTS_DIR / "prod.yaml").read_text()
CHECKPOINT = "s3://ray-train-checkpoints-111122223333-us-west-2/checkpoints"
DATA = "  data: s3://my-data-111122223333/chat/train.jsonl\n"


def _settings(text: str, name: str, *lines: str):
    added = "".join(lines).rstrip("\n")
    text = re.sub(r"^job:.*$", lambda m: m.group(0) + "\n" + added, text, count=1, flags=re.M)
    return parse_settings(text, name=name, source=f"{name}.yaml")


SCHEDULE_FLAGS = ("--steps", "--epochs", "--lr", "--warmup-steps", "--warmup-ratio", "--lr-schedule",
                  "--weight-decay", "--grad-clip")  # fmt: skip


def _options(settings):
    """The job's schedule flags as the training command parses them (on random ids: no data read)."""
    args = training_args(settings, checkpoint_uri=CHECKPOINT)
    picked = [part for i, a in enumerate(args) if a in SCHEDULE_FLAGS for part in (a, args[i + 1])]
    return args, parse_args(["--init", "random", "--shape", "tiny", *picked])


def test_unset_schedule_settings_leave_the_arguments_and_the_job_name_as_they_were() -> None:
    settings = _settings(DEV, "dev")
    args = training_args(settings, checkpoint_uri=CHECKPOINT)
    for flag in (
        "--epochs",
        "--warmup-steps",
        "--warmup-ratio",
        "--lr-schedule",
        "--weight-decay",
        "--grad-clip",
    ):
        assert flag not in args
    assert args[args.index("--steps") + 1] == "50"
    changed = _settings(DEV, "dev", "  lr_schedule: linear\n")
    assert rayjob_name(changed, code_hash="x") != rayjob_name(settings, code_hash="x")


@pytest.mark.parametrize("text,name", [(DEV, "dev"), (PROD, "prod")])
def test_schedule_settings_become_the_training_flags(text: str, name: str) -> None:
    settings = _settings(
        text, name, "  warmup_ratio: 0.05\n  lr_schedule: constant\n  weight_decay: 0.01\n  grad_clip: 0.5\n"
    )
    _, opts = _options(settings)
    assert (opts.warmup_ratio, opts.lr_schedule, opts.weight_decay, opts.grad_clip) == (
        0.05,
        "constant",
        0.01,
        0.5,
    )
    assert opts.warmup_steps == -(-settings.job.steps * 5 // 100)


def test_epochs_replace_steps_in_the_arguments() -> None:
    settings = _settings(
        PROD.replace("  steps:", "  # steps:"), "prod", "  epochs: 1.5\n  warmup_steps: 20\n"
    )
    args = training_args(settings, checkpoint_uri=CHECKPOINT)
    assert "--steps" not in args and args[args.index("--epochs") + 1] == "1.5"
    assert args[args.index("--warmup-steps") + 1] == "20"


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            "  lr_schedule: step\n",
            "job.lr_schedule: 'step' is not a schedule; use one of cosine, linear, constant",
        ),
        ("  warmup_ratio: 1.5\n", "job.warmup_ratio: "),
        ("  warmup_steps: -1\n", "job.warmup_steps: "),
        ("  weight_decay: -0.1\n", "job.weight_decay: "),
        ("  grad_clip: -1\n", "job.grad_clip: "),
        ("  epochs: 0\n", "job.epochs: "),
        ("  epochs: 2\n" + DATA, "job.epochs: set steps or epochs, not both"),
        (
            "  warmup_steps: 5\n  warmup_ratio: 0.1\n",
            "job.warmup_ratio: set warmup_steps or warmup_ratio, not both",
        ),
        ("  warmup_steps: 50\n", "job.warmup_steps: 50 is not fewer than steps (50)"),
    ],
)
def test_a_bad_schedule_setting_is_one_line_naming_the_field(lines: str, expected: str) -> None:
    with pytest.raises(SettingsError) as info:
        _settings(DEV, "dev", lines)
    (line,) = str(info.value).splitlines()
    assert line.removeprefix("dev.yaml: ").startswith(expected), line


def test_epochs_need_real_data() -> None:
    with pytest.raises(SettingsError, match=r"job\.epochs: needs real data"):
        _settings(DEV.replace("  steps: 50", "  # steps"), "dev", "  epochs: 1\n")

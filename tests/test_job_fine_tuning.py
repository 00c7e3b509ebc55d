"""Fine-tuning settings flow one way: environment file -> job settings -> RayJob arguments, and
the Ray pods' role may read an s3:// eval set like the training data."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from config.loader import load_settings
from config.settings.workload import JobSettings
from k8s.job import training_args
from stacks.workload_stack import s3_inputs

CKPT = "s3://ray-train-checkpoints-111122223333-us-west-2/checkpoints"


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_prod_fine_tunes_on_s3_chat_data_with_an_eval_set() -> None:
    settings = load_settings("prod")
    job = settings.job
    assert job.data.startswith("s3://") and job.eval_data and job.eval_data.startswith("s3://")
    args = training_args(settings, checkpoint_uri=CKPT)
    assert _flag(args, "--data") == job.data and _flag(args, "--eval-data") == job.eval_data
    assert _flag(args, "--data-format") == "chat" and _flag(args, "--eval-every") == str(job.eval_every)
    assert _flag(args, "--early-stop-patience") == "3" and "--export" in args
    assert {i.setting for i in s3_inputs(settings)} == {"job.data", "job.eval_data"}


def test_dev_keeps_the_random_token_smoke_job() -> None:
    settings = load_settings("dev")
    args = training_args(settings, checkpoint_uri=CKPT)
    assert settings.job.data == "random" and "--eval-data" not in args and "--eval-fraction" not in args


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"eval_fraction": 0.1}, "needs real data"),
        (
            {"data": "s3://bucket-a/data", "eval_data": "s3://bucket-a/eval", "eval_fraction": 0.1},
            "set eval_data or eval_fraction",
        ),
        ({"data": "s3://bucket-a/data", "early_stop_patience": 2}, "needs an eval set"),
        ({"data": "s3://bucket-a/data", "eval_data": "eval.jsonl"}, "is not an eval set"),
        ({"data": "s3://bucket-a/data", "eval_fraction": 1.0}, "less than 1"),
    ],
)
def test_bad_fine_tuning_settings_name_the_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises((ValidationError, ValueError), match=message):
        JobSettings(**fields)

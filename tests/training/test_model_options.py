"""The training CLI's model flags: LoRA's settings, --export-merged, and the dimensions synthesis
planned for, which the driver checks against the model it loads."""

from __future__ import annotations

import pytest

from training.dims import Dims
from training.lora_spec import LoraSpec
from training.options import OptionError, TrainOptions, parse_args

BASE = ["--global-batch-size", "8", "--num-workers", "2"]


def test_lora_flags_become_a_spec_that_survives_the_trip_to_the_workers() -> None:
    opts = parse_args([*BASE, *LoraSpec(8, 16.0, 0.1, ("q_proj", "v_proj")).as_args(), "--export-merged"])
    assert opts.lora == LoraSpec(8, 16.0, 0.1, ("q_proj", "v_proj")) and opts.export_merged
    assert TrainOptions.from_dict(opts.to_dict()).lora == opts.lora  # workers get to_dict()'s copy
    assert parse_args(BASE).lora is None


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--lora-rank", "0"], "--lora-rank: 0 is not a rank"),
        (["--lora-rank", "8", "--lora-alpha", "0"], "--lora-alpha: 0.0 must be > 0"),
        (["--lora-rank", "8", "--lora-dropout", "1"], "--lora-dropout: 1.0 must be in [0, 1)"),
        (["--lora-rank", "8", "--lora-targets", "q_proj,q_proj"], "--lora-targets: ['q_proj', 'q_proj']"),
        (["--lora-alpha", "16"], "--lora-alpha: needs --lora-rank"),
        (["--lora-rank", "8", "--init", "random"], "--lora-rank: needs --init pretrained"),
        (["--export-merged"], "--export-merged: merges LoRA's adapters"),
        (["--planned-dims", "28 layers"], "--planned-dims: '28 layers' is not a signature"),
    ],
)
def test_bad_model_flags_are_refused_by_name(argv: list[str], needle: str) -> None:
    with pytest.raises(OptionError) as info:
        parse_args([*BASE, *argv])
    assert needle in str(info.value)


def test_the_driver_stops_on_a_model_of_other_dimensions() -> None:
    from training.driver import check_model

    planned = Dims.of("qwen2.5-7b").signature()
    opts = parse_args([*BASE, "--init", "random", "--shape", "tiny", "--planned-dims", planned])
    with pytest.raises(OptionError) as info:
        check_model(opts)
    message = str(info.value)
    assert message.startswith("--planned-dims: the job was planned for another architecture")
    assert "hidden 3584 -> 128" in message and "layers 28 -> 4" in message
    same = parse_args(
        [*BASE, "--init", "random", "--shape", "tiny", "--planned-dims", Dims.of("tiny").signature()]
    )
    check_model(same)

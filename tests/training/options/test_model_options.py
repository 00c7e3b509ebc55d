"""The training CLI's --planned-dims: the dimensions synthesis planned for, which the driver checks
against the model it loads."""

from __future__ import annotations

import pytest

from training.model.dims import Dims
from training.options.train import OptionError, parse_args

BASE = ["--global-batch-size", "8", "--num-workers", "2"]


def test_a_malformed_signature_is_refused_by_name() -> None:
    with pytest.raises(OptionError) as info:
        parse_args([*BASE, "--planned-dims", "28 layers"])
    assert "--planned-dims: '28 layers' is not a signature" in str(info.value)


def test_the_driver_stops_on_a_model_of_other_dimensions() -> None:
    from training.run.driver import check_model

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

"""The batch rule (training.sizing.batch) decides alike for the settings, the options and the driver."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training.options.train import OptionError, parse_args
from training.sizing.batch import accumulation_steps

sizes = st.integers(min_value=1, max_value=64)


@given(micro=sizes, workers=sizes, accum=sizes)
def test_whole_splits_give_their_accumulation_steps(micro: int, workers: int, accum: int) -> None:
    assert accumulation_steps(micro * workers * accum, micro, workers) == accum


@given(global_batch=sizes, micro=sizes, workers=sizes)
def test_anything_else_is_refused(global_batch: int, micro: int, workers: int) -> None:
    steps = accumulation_steps(global_batch, micro, workers)
    assert (steps is None) == (global_batch % (micro * workers) != 0)


@settings(max_examples=30, deadline=None)
@given(global_batch=st.integers(1, 48), micro=st.integers(1, 8), workers=st.integers(1, 8))
def test_options_follow_the_rule(global_batch: int, micro: int, workers: int) -> None:
    argv = ["--init", "random", "--shape", "tiny", "--global-batch-size", str(global_batch)]
    argv += ["--micro-batch-size", str(micro), "--num-workers", str(workers), "--no-liger"]
    if accumulation_steps(global_batch, micro, workers) is None:
        with pytest.raises(OptionError, match="--global-batch-size"):
            parse_args(argv)
    else:
        assert parse_args(argv).global_batch_size == global_batch


@pytest.mark.dev_packages  # the settings side (config/) is not in the image: CI runs this in make test
@settings(max_examples=20, deadline=None)
@given(global_batch=st.integers(1, 64), micro=st.integers(1, 8))
def test_settings_follow_the_rule(global_batch: int, micro: int) -> None:
    pytest.importorskip("ruamel.yaml", reason="the settings side (config/) is not installed here")
    from ruamel.yaml import YAML

    from config.loader import ENVIRONMENTS_DIR, SettingsError, parse_settings

    data = YAML(typ="safe", pure=True).load((ENVIRONMENTS_DIR / "dev.yaml").read_text())
    # Short sequences keep every micro-batch here inside an L4's memory: this test is about the
    # batch rule, and the memory plan (config/memory.py) has its own message and tests.
    job = {"global_batch_size": global_batch, "micro_batch_size": micro, "seq_len": 256}
    data.setdefault("job", {}).update(job)
    text = json.dumps(data)
    if micro > global_batch:
        return  # its own message, on micro_batch_size
    workers = parse_settings(json.dumps({**data, "job": {}}), name="dev", source="dev.yaml").num_workers
    if accumulation_steps(global_batch, micro, workers) is None:
        with pytest.raises(SettingsError, match=r"job\.global_batch_size"):
            parse_settings(text, name="dev", source="dev.yaml")
    else:
        assert parse_settings(text, name="dev", source="dev.yaml").job.global_batch_size == global_batch

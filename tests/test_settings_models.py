"""The job's model is sized from its own config at synthesis, LoRA's settings are checked, and a job
that fits nowhere is refused before anything starts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from config.loader import SettingsError, environments_dir, parse_settings
from config.memory import job_memory, plan_options
from config.settings import Settings
from training.model.dims import Dims
from training.model.lora_spec import LoraSpec
from training.model.shapes import SHAPES
from training.sizing.memory_plan import GIB

SOURCE = "config/environments/prod.yaml"


def prod_with(check_memory: bool = True, **job: Any) -> Settings:
    data: dict[str, Any] = YAML(typ="safe", pure=True).load((environments_dir() / "prod.yaml").read_text())
    data["job"] = {**data["job"], **job}
    for key in [k for k, v in job.items() if v is None]:
        del data["job"][key]
    return parse_settings(json.dumps(data), name="prod", source=SOURCE, check_memory=check_memory)


def error_of(**job: Any) -> str:
    with pytest.raises(SettingsError) as info:
        prod_with(**job)
    return str(info.value)


def test_the_plan_sizes_the_model_the_job_names() -> None:
    # Before, every job was planned as Qwen2.5-1.5B whatever job.model said.
    small = prod_with(model="Qwen/Qwen2.5-1.5B", lora=None, check_memory=False)
    big = prod_with(model="Qwen/Qwen2.5-7B", lora=None, check_memory=False)
    gpu = big.gpu_nodes.instance
    assert plan_options(big.job, gpu, 2)["shape"] == Dims.from_config(SHAPES["qwen2.5-7b"])
    assert plan_options(small.job, gpu, 2)["shape"] == Dims.from_config(SHAPES["qwen2.5-1.5b"])
    assert job_memory(big.job, gpu, 2).device_bytes > 3 * job_memory(small.job, gpu, 2).device_bytes
    llama = prod_with(model="meta-llama/Llama-3.1-8B", check_memory=False)
    assert llama.job.model_plan.dims.vocab == 128256 and not llama.job.model_plan.dims.tied


def test_a_full_7b_fine_tune_on_l4s_is_refused_and_lora_is_offered() -> None:
    message = error_of(model="Qwen/Qwen2.5-7B", lora=None)
    assert "job.micro_batch_size: needs" in message
    assert "job.lora: {} (LoRA rank 16" in message and "job.nodes: 4 with job.sharding: full" in message


def test_lora_reaches_the_plan() -> None:
    job = prod_with(model="Qwen/Qwen2.5-7B", lora={"rank": 8}).job
    assert plan_options(job, prod_with().gpu_nodes.instance, 2)["lora"] == LoraSpec(rank=8)


def test_a_model_that_fits_no_job_is_refused(tmp_path: Path) -> None:
    huge = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 32768, "intermediate_size": 131072,
            "num_hidden_layers": 160, "num_attention_heads": 256, "num_key_value_heads": 8}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(huge))
    message = error_of(model="s3://models-111122223333/huge", config_json=str(tmp_path / "config.json"))
    assert "fits no job on g6.12xlarge: not with LoRA, activation checkpointing, full sharding" in message


@pytest.mark.parametrize(
    ("job", "field", "needle"),
    [
        ({"model": "someone/secret-7b"}, "job.model", "not in the model catalogue"),
        (
            {"model": "s3://models-111122223333/qwen"},
            "job.config_json",
            "set job.config_json to a local copy",
        ),
        ({"model": "/models/qwen"}, "job.config_json", "read only inside the job"),
        ({"config_json": "config/models/missing.json"}, "job.config_json", "no such file"),
        ({"shape": "gpt5"}, "job.shape", "not a known shape"),
        ({"init": "random", "lora": None}, "job.shape", "needed with init: random"),
        (
            {"model": "Qwen/Qwen2.5-7B", "shape": "llama-3.1-8b"},
            "job.shape",
            "is catalogue entry 'qwen2.5-7b'",
        ),
        ({"lora": {"rank": 0}}, "job.lora.rank", "whole number >= 1"),
        ({"lora": {"alpha": 0}}, "job.lora.alpha", "use a whole number >= 1"),
        ({"lora": {"alpha": 1.5}}, "job.lora.alpha", "1.5; use a whole number >= 1"),
        ({"lora": {"target_modules": "all-linear"}}, "job.lora.target_modules", "'all-linear': give a list"),
        ({"lora": {"dropout": 1}}, "job.lora.dropout", "must be in [0, 1)"),
        # YAML's true is no rank of 1; text and fractions are no rank either.
        ({"lora": {"rank": True}}, "job.lora.rank", "True; use a whole number >= 1"),
        ({"lora": {"rank": "sixteen"}}, "job.lora.rank", "'sixteen'; use a whole number >= 1"),
        ({"lora": {"rank": 8.5}}, "job.lora.rank", "8.5; use a whole number >= 1"),
        ({"lora": {"alpha": True}}, "job.lora.alpha", "True; use a whole number >= 1"),
        ({"lora": {"dropout": "5%"}}, "job.lora.dropout", "'5%'; use a number in [0, 1), e.g. 0.05"),
        ({"lora": 16}, "job.lora", "16; a mapping of LoRA's settings ({} for its defaults"),
        ({"model": "qwen/qwen2.5-7b"}, "job.model", "did you mean 'Qwen/Qwen2.5-7B'?"),
        # A variant name the release does not have (Qwen3's chat models carry no -Instruct), and a typo.
        (
            {"model": "Qwen/Qwen3-8B-Instruct"},
            "job.model",
            "did you mean 'Qwen/Qwen3-8B' or 'Qwen/Qwen3-8B-Base'? Otherwise set job.config_json to a "
            "local copy of its config.json (`hf download Qwen/Qwen3-8B-Instruct config.json --local-dir "
            "config/models/qwen3-8b-instruct`, then job.config_json: config/models/qwen3-8b-instruct)",
        ),
        (
            {"model": "Qwen/Qwen2.5-7B-Instuct"},
            "job.model",
            "did you mean 'Qwen/Qwen2.5-7B-Instruct'? Otherwise",
        ),
        (
            {"model": "/models/mine"},
            "job.config_json",
            "config/models/my-model.json, from the folder the image or volume mounts at /models/mine",
        ),
        ({"model": "Qwen/Qwen2.5-7B", "lora": {}, "float8": True}, "job.float8", "not with job.lora"),
        (
            {"lora": {"target_modules": ["q_proj", "c_attn"]}},
            "job.lora.target_modules",
            "c_attn: not a linear",
        ),
        # Qwen2.5-7B's k_proj is 3584 -> 512: rank 512 is no low-rank update.
        ({"lora": {"rank": 512}}, "job.lora.rank", "512 is not below the smaller side of its targets (512"),
        ({"lora": {}, "init": "random", "shape": "qwen2.5-1.5b"}, "job.lora", "needs init: pretrained"),
        ({"lora": None, "export_merged": True}, "job.export_merged", "needs job.lora"),
        (
            {"model": "google/gemma-2-9b", "seq_len": 16384},
            "job.seq_len",
            "beyond the model's 8192 positions",
        ),
    ],
)
def test_bad_model_settings_are_refused_naming_the_field(
    job: dict[str, Any], field: str, needle: str
) -> None:
    message = error_of(**job)
    assert f"{field}: " in message and needle in message, message
    assert message.count("\n") <= 1  # one line after the file's header


def test_a_config_file_of_another_model_than_a_catalogue_id_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SHAPES["llama-3.2-3b"]))
    message = error_of(model="Qwen/Qwen2.5-7B-Instruct", config_json=str(tmp_path / "config.json"), lora={})
    assert "job.config_json: not Qwen/Qwen2.5-7B-Instruct's config: catal" in message
    assert "tied 0 -> 1; drop job.config_json" in message
    (tmp_path / "config.json").write_text(json.dumps(SHAPES["qwen2.5-7b"]))  # its own: accepted
    s = prod_with(model="Qwen/Qwen2.5-7B-Instruct", config_json=str(tmp_path / "config.json"), lora={})
    assert s.job.model_plan.dims == Dims.from_config(SHAPES["qwen2.5-7b"])


def test_a_multimodal_releases_text_shape_is_refused_for_a_pretrained_model() -> None:
    message = error_of(model="google/gemma-3-4b-it", shape="gemma-3-4b", lora={})
    assert "job.shape: 'gemma-3-4b' is the text decoder of a multimodal release" in message


def test_unsupported_architecture_in_a_config_file_is_refused(tmp_path: Path) -> None:
    moe = {"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
           "num_hidden_layers": 48, "num_attention_heads": 32}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(moe))
    message = error_of(model="s3://models-111122223333/moe", config_json=str(tmp_path / "config.json"))
    assert "job.config_json: model_type 'qwen3_moe' is not a decoder the loop can shard" in message


def test_a_config_file_sizes_a_model_in_s3(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SHAPES["qwen3-8b"]))
    s = prod_with(model="s3://models-111122223333/q3", config_json=str(tmp_path / "config.json"), lora={})
    assert s.job.model_plan.dims == Dims.from_config(SHAPES["qwen3-8b"])
    assert job_memory(s.job, s.gpu_nodes.instance, 2).device_bytes < 21.96 * GIB


def _with_sets(env: str, *items: str) -> Settings:
    from config.loader import load_settings

    return load_settings(env, environments_dir(), check_memory=False, overrides=list(items))


def test_one_lora_field_is_set_per_job_keeping_the_files_others() -> None:
    prod = _with_sets("prod").job.lora
    assert prod is not None and prod.dropout == 0.05
    lora = _with_sets("prod", "job.lora.rank=8", "job.lora.alpha=16").job.lora
    assert lora is not None and (lora.rank, lora.alpha, lora.dropout) == (8, 16, 0.05)
    # An environment without LoRA: the field given, LoRA's defaults for the rest.
    assert _with_sets("dev").job.lora is None
    dev = _with_sets("dev", "job.lora.rank=8").job.lora
    assert dev is not None and (dev.rank, dev.spec.targets) == (8, LoraSpec().targets)


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["job.lora=null", "job.lora.rank=8"], "job.lora.rank is set twice"),
        (["job.lora.rank=8", "job.lora.rank=4"], "job.lora.rank is set twice"),
        (["job.lora.rnak=8"], "unknown field job.lora.rnak; did you mean job.lora.rank?"),
        (["job.steps.max=3"], "job.steps has no fields; set it as job.steps=VALUE"),
        (["job.lora.rank.x=3"], "only job.FIELD (or job.lora.FIELD) can be set per job"),
    ],
)
def test_bad_section_overrides_are_one_line(items: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(message)):
        _with_sets("prod", *items)


def test_an_empty_lora_key_is_refused_not_read_as_a_full_fine_tune() -> None:
    # `lora:` with its fields commented out reads as null: a full fine-tune the file did not mean.
    text = (environments_dir() / "prod.yaml").read_text()
    start = text.index("  lora:")
    end = text.index("\n  ", text.index("dropout", start))
    emptied = text[:start] + "  lora:\n  #  rank: 16" + text[end:]
    with pytest.raises(SettingsError) as info:
        parse_settings(emptied, name="prod", source=SOURCE)
    (line,) = str(info.value).splitlines()
    assert line == (
        f"{SOURCE}: job.lora: empty; write `lora: {{}}` for LoRA with its defaults (rank 16, alpha 32, "
        "every linear layer), give its fields, or remove the key (or write `lora: null`) for a full "
        "fine-tune"
    )
    # Said outright, as a file or a JSON dump of the settings writes it: a full fine-tune.
    for null in ("  lora: null  # full", "  lora: ~"):
        full = parse_settings(
            text[:start] + null + text[end:], name="prod", source=SOURCE, check_memory=False
        )
        assert full.job.lora is None


def test_a_config_folder_sizes_the_job_as_its_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SHAPES["qwen3-8b"]))
    s = prod_with(model="s3://models-111122223333/q3", config_json=str(tmp_path), lora={})
    assert s.job.model_plan.dims == Dims.from_config(SHAPES["qwen3-8b"])
    empty = tmp_path / "empty"
    empty.mkdir()
    message = error_of(model="s3://models-111122223333/q3", config_json=str(empty), lora={})
    assert f"job.config_json: {empty}: no config.json in that folder" in message

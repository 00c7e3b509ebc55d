"""The catalogue's architectures: Dims counts what `transformers` builds from the same config."""

from __future__ import annotations

import re
from typing import Any

import pytest

from training.model.dims import ArchitectureError, Dims
from training.model.shapes import CATALOGUE, SHAPES, catalogue_name_of
from training.sizing.flops import flops_per_token


def _meta_model(name: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from training.model.build import shape_config

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(shape_config(name))


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_params_and_linear_shapes_equal_what_transformers_builds(name: str) -> None:
    model = _meta_model(name)
    dims = Dims.from_config(SHAPES[name])
    seen: set[int] = set()
    built = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            built += p.numel()
    assert dims.params == built
    layer = model.model.layers[0]
    assert sum(p.numel() for p in layer.parameters()) == dims.layer_params
    linears = {n.rsplit(".", 1)[-1]: m for n, m in layer.named_modules() if hasattr(m, "in_features")}
    assert {k: (m.in_features, m.out_features) for k, m in linears.items()} == dims.linear_shapes()


def test_published_counts_agree() -> None:
    # Independent of transformers: keras-hub's Gemma 3 presets (keras_hub/src/models/gemma3/
    # gemma3_presets.py: "params" of gemma3_4b_text and gemma3_12b_text) and Llama 3.1 8B's.
    assert Dims.from_config(SHAPES["gemma-3-4b"]).params == 3_880_099_328
    assert Dims.from_config(SHAPES["gemma-3-12b"]).params == 11_765_788_416
    assert Dims.from_config(SHAPES["llama-3.1-8b"]).params == 8_030_261_248


def test_every_entry_names_its_sources() -> None:
    for name, entry in CATALOGUE.items():
        assert entry["sources"] and entry["published"].startswith("https://huggingface.co/"), name
        assert entry["config"]["model_type"], name


def test_head_dim_other_than_hidden_over_heads() -> None:
    qwen3 = Dims.from_config(SHAPES["qwen3-14b"])  # 40 heads x 128 = 5120 = d; 8B: 32 x 128 = 4096 = d
    gemma = Dims.from_config(SHAPES["gemma-2-9b"])  # 16 heads x 256 = 4096 != 3584
    assert qwen3.q_dim == 5120
    assert gemma.q_dim == 4096 and gemma.hidden == 3584
    # PaLM appendix B: the attention term is 12 L (H Q) T, not 12 L d T.
    with_q = flops_per_token(gemma.params, gemma.layers, gemma.q_dim, 4096)
    with_d = flops_per_token(gemma.params, gemma.layers, gemma.hidden, 4096)
    assert with_q - with_d == 12 * gemma.layers * (4096 - 3584) * 4096


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"model_type": "qwen3_moe", "hidden_size": 2048}, "'qwen3_moe' is not a decoder the loop can shard"),
        (
            {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text"}},
            "text_config (model_type 'gemma3_text') is the decoder",
        ),
        ({"model_type": "llama", "hidden_size": 64}, "no vocab_size, intermediate_size"),
    ],
)
def test_architectures_the_loop_cannot_shard_are_refused(config: dict[str, Any], needle: str) -> None:
    with pytest.raises(ArchitectureError, match=re.escape(needle)):
        Dims.from_config(config)


def test_catalogue_knows_published_ids() -> None:
    assert catalogue_name_of("Qwen/Qwen2.5-7B-Instruct") == "qwen2.5-7b"
    assert catalogue_name_of("meta-llama/Llama-3.1-8B") == "llama-3.1-8b"
    assert catalogue_name_of("someone/unknown-7b") is None


def test_signature_names_what_differs() -> None:
    planned = Dims.from_config(SHAPES["qwen2.5-7b"]).signature()
    other = Dims.from_config(SHAPES["qwen2.5-1.5b"])
    diff = other.signature_mismatch(planned)
    assert "layers 28 -> 28" not in diff and "hidden 3584 -> 1536" in diff
    assert Dims.from_config(SHAPES["qwen2.5-7b"]).signature_mismatch(planned) == []

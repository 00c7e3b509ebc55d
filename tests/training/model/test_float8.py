"""float8 training: which linears convert, and which GPUs are refused."""

from __future__ import annotations

import pytest
import torch

from training.model.build import (
    apply_float8,
    check_float8_device,
    float8_filter,
    shape_config,
)
from training.model.precision import FLOAT8_MIN_TOKENS, float8_by_default
from training.options.train import OptionError, parse_args


def _qwen_on_meta() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(shape_config("qwen2.5-1.5b"))


# torchao is not installed in the image (it travels in the code asset: tests/training/test_vendored.py runs it
# there); here it is .venv's, the version config/image.toml vendors, on the same torch.
@pytest.mark.dev_packages
def test_float8_converts_the_large_projections_and_keeps_kv_and_lm_head_in_bf16() -> None:
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    model = _qwen_on_meta()
    converted = apply_float8(model, all_gather=False)
    # q, o (1536 x 1536), gate, up (1536 -> 8960), down (8960 -> 1536) in each of 28 layers; k and v
    # project to 256 and stay bf16, as does the tied lm_head (the fused loss reads its weight).
    assert len(converted) == 5 * 28
    layer = model.model.layers[0]
    for name in ("q_proj", "o_proj"):
        assert isinstance(getattr(layer.self_attn, name), Float8Linear)
    for name in ("gate_proj", "up_proj", "down_proj"):
        assert isinstance(getattr(layer.mlp, name), Float8Linear)
    for name in ("k_proj", "v_proj"):
        assert not isinstance(getattr(layer.self_attn, name), Float8Linear)
    assert not isinstance(model.lm_head, Float8Linear)


def test_float8_filter_by_size() -> None:
    assert float8_filter(torch.nn.Linear(1024, 2048, device="meta"), "model.layers.0.mlp.up_proj")
    assert not float8_filter(torch.nn.Linear(1536, 256, device="meta"), "model.layers.0.self_attn.k_proj")
    assert not float8_filter(torch.nn.Linear(1536, 151936, device="meta"), "lm_head")
    assert not float8_filter(torch.nn.LayerNorm(2048, device="meta"), "model.norm")


@pytest.mark.parametrize(
    ("capability", "name"),
    [((8, 6), "NVIDIA A10G"), ((8, 0), "NVIDIA A100-SXM4-80GB"), (None, "cpu")],
)
def test_gpus_without_fp8_tensor_cores_are_refused(capability: tuple[int, int] | None, name: str) -> None:
    with pytest.raises(ValueError, match=r"--float8: .*compute capability >= 8\.9.*--no-float8"):
        check_float8_device(capability, name)


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0)])
def test_ada_hopper_and_blackwell_are_accepted(capability: tuple[int, int]) -> None:
    check_float8_device(capability, "gpu")  # L4/L40S, H100/H200, B200


def test_float8_all_gather_needs_float8() -> None:
    with pytest.raises(OptionError, match="--float8-all-gather: needs --float8"):
        parse_args(["--init", "random", "--float8-all-gather"])


@pytest.mark.parametrize(
    ("capability", "compiled", "torchao", "tokens", "on"),
    [
        ((9, 0), True, True, 16 * 2048, True),  # H100/H200 with the GPU defaults
        ((8, 9), True, True, 8 * 2048, True),  # L4 (g6), L40S (g6e) at the smallest measured size
        ((8, 9), True, True, 8 * 2048 - 1, False),  # smaller micro-batches: not measured to pay
        ((8, 6), True, True, 16 * 2048, False),  # A10G (g5): no FP8 tensor cores, bf16 without an error
        ((8, 0), True, True, 16 * 2048, False),  # A100
        (None, True, True, 16 * 2048, False),  # CPU workers
        ((9, 0), False, True, 16 * 2048, False),  # eager layers: float8's scaling would not be fused
        ((9, 0), True, False, 16 * 2048, False),  # no torchao in this environment
    ],
)
def test_float8_default_follows_the_gpu_and_the_micro_batch(
    capability: tuple[int, int] | None, compiled: bool, torchao: bool, tokens: int, on: bool
) -> None:
    assert FLOAT8_MIN_TOKENS == 8 * 2048  # the smallest micro-batch measured (BENCHMARKS.md)
    assert float8_by_default(capability, compiled=compiled, torchao=torchao, tokens=tokens) is on


def test_float8_unset_by_default_and_explicit_either_way() -> None:
    assert parse_args(["--init", "random"]).float8 is None
    assert parse_args(["--init", "random", "--no-float8"]).float8 is False

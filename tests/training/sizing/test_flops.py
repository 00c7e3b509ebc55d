"""FLOPs per token and MFU, checked against the published Qwen2.5-1.5B figures."""

from __future__ import annotations

import pytest
import torch

from training.model.build import SHAPES, shape_config
from training.sizing.flops import count_params, flops_per_token, mfu, peak_tflops


def _meta_model(shape: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # nothing allocated, nothing downloaded
        return AutoModelForCausalLM.from_config(shape_config(shape))


def test_qwen25_15b_params_and_flops() -> None:
    model = _meta_model("qwen2.5-1.5b")
    n = count_params(model)
    assert n == 1_543_714_304  # the tied lm_head is counted once
    cfg = SHAPES["qwen2.5-1.5b"]
    f = flops_per_token(n, cfg["num_hidden_layers"], cfg["hidden_size"], 2048)
    assert round(f / 1e9, 2) == 10.32
    assert f == 6 * n + 12 * 28 * 1536 * 2048


def test_mfu_of_a_known_h200_rate() -> None:
    # 40.4k tokens/s on one H200 (989 TFLOP/s bf16 dense) at 10.32 GFLOP/token is 42.2 % MFU.
    f = flops_per_token(1_543_714_304, 28, 1536, 2048)
    util = mfu(40_400, f, 1, peak_tflops("NVIDIA H200"))
    assert util == pytest.approx(0.4216, abs=5e-4)
    assert mfu(40_400, f, 8, 989.0) == pytest.approx(util / 8)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H200", 989.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA A10G", None),
        ("Tesla T4", None),
    ],
)
def test_peak_table(name: str, peak: float | None) -> None:
    assert peak_tflops(name) == peak


def test_no_mfu_without_peak() -> None:
    assert mfu(1000.0, 1e9, 2, None) is None

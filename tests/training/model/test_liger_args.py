"""Each catalogue family's Liger patch gets the arguments its own signature takes (Gemma's patches
take `geglu`, not `swiglu`: a TypeError at model build on every GPU run before). The signatures are
read from the locked liger-kernel wheel the job ships (wheels/, by `ast`: Liger imports Triton, which
this machine lacks), so a new Liger release with other names fails here, not on a GPU."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

from training.model.build import liger_arguments
from training.model.shapes import SHAPES

ROOT = Path(__file__).resolve().parents[3]


def _liger_signatures() -> dict[str, list[str]]:
    (wheel,) = sorted((ROOT / "wheels").glob("liger_kernel-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        source = z.read("liger_kernel/transformers/monkey_patch.py").decode()
    return {
        node.name.removeprefix("apply_liger_kernel_to_"): [a.arg for a in node.args.args]
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("apply_liger_kernel_to_")
    }


SIGNATURES = _liger_signatures()
MODEL_TYPES = sorted({fields["model_type"] for fields in SHAPES.values()})


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("layers", [True, False])
def test_every_family_gets_only_arguments_its_liger_patch_takes(model_type: str, layers: bool) -> None:
    params = SIGNATURES[model_type]  # every family of the catalogue has a patch in the locked Liger
    args = liger_arguments(params, layers=layers)
    assert set(args) <= set(params)
    assert args["fused_linear_cross_entropy"] is True and args["cross_entropy"] is False
    mlp = [flag for flag in ("swiglu", "geglu") if flag in args]
    assert len(mlp) == 1 and args[mlp[0]] is layers and args["rms_norm"] is layers and args["rope"] is layers


def test_gemma_families_get_geglu_and_the_others_swiglu() -> None:
    assert "geglu" in liger_arguments(SIGNATURES["gemma2"], layers=True)
    assert "geglu" in liger_arguments(SIGNATURES["gemma3_text"], layers=True)
    for model_type in ("qwen2", "qwen3", "llama", "mistral"):
        assert "swiglu" in liger_arguments(SIGNATURES[model_type], layers=True)


def test_a_patch_without_the_fused_loss_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"--liger: .*no fused linear cross-entropy"):
        liger_arguments(SIGNATURES["pixtral"], layers=True)

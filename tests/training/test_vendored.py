"""The job's packages reach the driver and the workers from the code asset's `_vendor/`, without
pip. Runs in both CI stages; in the image stage (Python 3.13, the image's torch and Triton) it also
imports Liger's kernels the way the job does."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sys.path.insert(0, str(ROOT))
    try:
        from stacks import code_asset
    finally:
        sys.path.remove(str(ROOT))
    return code_asset.stage(tmp_path_factory.mktemp("asset") / "job")


def _in_working_dir(job: Path, code: str) -> dict:
    # As Ray starts the job: cwd is the unpacked working_dir, nothing of this checkout on the path.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=job,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_liger_comes_from_the_asset(staged: Path) -> None:
    got = _in_working_dir(
        staged,
        "import json, importlib.metadata as m, importlib.util as u, training; "
        "spec = u.find_spec('liger_kernel'); "
        "print(json.dumps({'origin': spec.origin, 'version': m.version('liger-kernel')}))",
    )
    assert got["origin"].startswith(str(staged / "_vendor" / "liger_kernel"))
    assert got["version"] == "0.8.5"


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton, as the image has")
def test_liger_loss_patch_imports_on_the_images_torch(staged: Path) -> None:
    # training.model.build.apply_liger's import and lookup: Triton compiles nothing until a GPU runs it,
    # but reads every kernel's source at import (plain files, so it can).
    got = _in_working_dir(
        staged,
        "import json, training, liger_kernel.transformers as lk; "
        "print(json.dumps({'qwen2': hasattr(lk, 'apply_liger_kernel_to_qwen2'), 'file': lk.__file__}))",
    )
    assert got["qwen2"] is True
    assert got["file"].startswith(str(staged / "_vendor"))


def test_torchao_float8_comes_from_the_asset_and_converts_on_the_images_torch(staged: Path) -> None:
    # The image has no torchao; the job's --float8 (on by default on FP8 GPUs) uses the asset's pure-
    # Python copy with whatever torch the image has. training.model.build.apply_float8 on the real model
    # shape (on the meta device): the same conversion, filter and config the job runs.
    got = _in_working_dir(
        staged,
        "import json, importlib.metadata as m, torch, training, torchao; "
        "from transformers import AutoModelForCausalLM; "
        "from training.model.build import apply_float8, shape_config\n"
        "with torch.device('meta'):\n"
        "    model = AutoModelForCausalLM.from_config(shape_config('qwen2.5-1.5b'))\n"
        "done = apply_float8(model, all_gather=True)\n"
        "print(json.dumps({'file': torchao.__file__, 'version': m.version('torchao'), 'layers': len(done),"
        " 'q': type(model.model.layers[0].self_attn.q_proj).__name__}))",
    )
    assert got["file"].startswith(str(staged / "_vendor" / "torchao"))
    assert got["version"] == "0.18.0"
    assert got["layers"] == 5 * 28 and got["q"] == "Float8Linear"


def test_peft_from_the_asset_trains_and_writes_an_adapter_peft_loads_on_the_images_versions(
    staged: Path,
) -> None:
    # LoRA's peft and accelerate reach the job only through the asset (the image has neither), so
    # this is where they meet the image's transformers and torch: training.model.lora.apply_lora (peft's
    # inject_adapter_in_model) on a real model, a backward that reaches the adapters alone, then the
    # export's adapter folder (training.export.lora.write_adapter) loaded by PeftModel.from_pretrained.
    got = _in_working_dir(
        staged,
        "import json, tempfile, importlib.metadata as m, torch, training, peft\n"
        "from transformers import AutoModelForCausalLM\n"
        "from training.model.build import shape_config\n"
        "from training.model.lora import apply_lora\n"
        "from training.model.lora_spec import LoraSpec\n"
        "from training.export.lora import write_adapter\n"
        "torch.manual_seed(0)\n"
        "base = tempfile.mkdtemp()\n"
        "AutoModelForCausalLM.from_config(shape_config('tiny')).save_pretrained(base)\n"
        "model = AutoModelForCausalLM.from_pretrained(base)\n"
        "spec = LoraSpec(rank=4, alpha=8)\n"
        "apply_lora(model, spec, base_model=base)\n"
        "ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])\n"
        "model(input_ids=ids, labels=ids).loss.backward()\n"
        "grads = sorted(n for n, p in model.named_parameters() if p.grad is not None)\n"
        "with torch.no_grad():\n"
        "    for n, p in model.named_parameters():\n"
        "        if '.lora_B.' in n:\n"
        "            p.normal_(std=0.05)\n"
        "    ours = model(input_ids=ids).logits.float()\n"
        "    bf16 = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)\n"
        "    plain = bf16(input_ids=ids).logits.float()\n"
        "out = tempfile.mkdtemp()\n"
        "adapters = {n: p.detach() for n, p in model.named_parameters() if '.lora_' in n}\n"
        "write_adapter(out, spec, adapters, base)\n"
        "from peft import PeftModel\n"
        "loaded = PeftModel.from_pretrained(bf16, out)\n"
        "with torch.no_grad():\n"
        "    theirs = loaded(input_ids=ids).logits.float()\n"
        "print(json.dumps({'file': peft.__file__, 'version': m.version('peft'), 'grads': grads,\n"
        "                  'adapter_effect': float((ours - plain).abs().max()),\n"
        "                  'diff': float((ours - theirs).abs().max())}))",
    )
    assert got["file"].startswith(str(staged / "_vendor" / "peft"))
    assert got["version"] == "0.21.2"
    assert got["grads"] and all(".lora_" in name for name in got["grads"])
    assert got["adapter_effect"] > 0.01  # the adapters change the output ...
    assert got["diff"] < 0.02, got  # ... and peft's loaded adapter changes it the same way

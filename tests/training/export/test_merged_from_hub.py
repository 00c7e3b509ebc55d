"""`--export-merged` (and `python -m training.export --merged`) with a Hugging Face Hub id as the
base, the default kind of --model (issue 50, item 5): the base's safetensors come from the Hub
cache that from_pretrained fills, fetched there if missing, not from a local folder of that name.

No hub is reachable here: the cache is laid out as huggingface_hub writes it
(models--ORG--NAME/refs/main and snapshots/COMMIT/) and the export runs as the CLI, offline
(HF_HUB_OFFLINE=1), in a process of its own, so huggingface_hub reads the cache settings as it
would in the Ray head pod."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.family_tokenizers import save_family_tokenizer
from training.checkpoint import dcp as checkpoint
from training.model.lora_spec import LoraSpec

pytestmark = pytest.mark.dev_packages  # peft

ROOT = Path(__file__).resolve().parents[3]
HUB_ID = "acme/tiny-base"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SPEC = LoraSpec(rank=4, alpha=8, dropout=0.0)
IDS = torch.tensor([[3, 70, 71, 72, 5, 201, 30, 80, 81, 90]])


@pytest.fixture(scope="module")
def hub(single_rank_group: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, torch.Tensor]:
    """(hub cache, LoRA checkpoint naming HUB_ID, the trained model's logits on IDS)."""
    from transformers import AutoModelForCausalLM

    from training.model.build import shape_config
    from training.model.lora import apply_lora

    tmp = tmp_path_factory.mktemp("hub")
    cache = tmp / "hub-cache"
    repo = cache / f"models--{HUB_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    save_family_tokenizer("qwen2.5-instruct", snapshot)
    cfg = shape_config("tiny")
    cfg.vocab_size = 320
    torch.manual_seed(0)
    # bf16 values (apply_lora freezes the base in bf16), so the merge is compared with the same base.
    AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).to(torch.float32).save_pretrained(snapshot)
    model = apply_lora(AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32), SPEC)
    model.to(torch.float32)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-2)
    for _ in range(2):  # lora_B moves off zero: the merge changes the weights
        model(input_ids=IDS, labels=IDS).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        logits = model(input_ids=IDS).logits.float()
    ckpt = tmp / "ckpt"
    lora = {"rank": SPEC.rank, "alpha": SPEC.alpha, "dropout": SPEC.dropout, "targets": list(SPEC.targets)}
    ref = {"init": "pretrained", "shape": "", "model": HUB_ID, "lora": lora}
    checkpoint.save(str(ckpt), model, optimizer, step=2, position=0, extra={"model_ref": ref})
    return cache, ckpt, logits


def _export(cache: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    env.pop("HF_HOME", None)
    return subprocess.run([sys.executable, "-m", "training.export", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, check=False)  # fmt: skip


def test_merged_export_onto_a_hub_id_reads_the_bases_weights_from_the_hub_cache(
    hub: tuple[Path, Path, torch.Tensor], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    cache, ckpt, logits = hub
    assert not (tmp_path / HUB_ID).exists()  # no local folder of that name: the Hub's id
    out = tmp_path / "merged"
    run = _export(cache, "--checkpoint", str(ckpt), "--out", str(out), "--merged", "--dtype", "float32",
                  cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        got = merged(input_ids=IDS).logits.float()
    torch.testing.assert_close(got, logits, atol=1e-4, rtol=1e-4)
    base = AutoModelForCausalLM.from_pretrained(cache / f"models--{HUB_ID.replace('/', '--')}" / "snapshots"
                                                / COMMIT, dtype=torch.float32).eval()  # fmt: skip
    with torch.no_grad():
        assert (base(input_ids=IDS).logits - logits).abs().max() > 1e-2  # the adapters are in it


def test_a_hub_id_whose_weights_cannot_be_fetched_is_one_line_naming_model(
    hub: tuple[Path, Path, torch.Tensor], tmp_path: Path
) -> None:
    _, ckpt, _ = hub
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    out = tmp_path / "merged"
    run = _export(empty, "--checkpoint", str(ckpt), "--out", str(out), "--merged", cwd=tmp_path)
    # (torch's DCP warns that no process group exists: a line of its own, not the error's)
    lines = [line for line in run.stderr.splitlines() if "error" in line and "Warning" not in line]
    assert run.returncode == 2 and len(lines) == 1, run.stderr[-2000:]
    assert lines[0].startswith("python -m training.export: error: --model: ")
    assert HUB_ID in lines[0]
    assert not out.exists()

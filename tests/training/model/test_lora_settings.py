"""--lora-targets and --lora-dropout reach the adapters the trainer builds (not peft's or our
defaults), on a family unlike the shared tiny Qwen2 shape: Gemma 3's real config narrowed (q/k norms,
GeGLU, tied, a 262,144 vocabulary) and Llama 3.1's (untied)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from bench import family_tokenizers
from training.model.build import build_model
from training.model.lora_spec import DEFAULT_TARGETS
from training.model.shapes import narrowed

pytestmark = pytest.mark.dev_packages


def _base(tmp: Path, family: str) -> str:
    fields = narrowed(family, hidden=64, heads=2)
    build_model("random", fields, "", seed=0).save_pretrained(tmp / family)
    family_tokenizers.build(family, fields["vocab_size"]).save_pretrained(tmp / family)
    return str(tmp / family)


@pytest.mark.parametrize(
    ("family", "targets"), [("gemma-3-4b", "q_proj,down_proj"), ("llama-3.1-8b", "v_proj,up_proj")]
)
def test_non_default_targets_and_dropout_are_the_adapters_built(
    tmp_path: Path, single_rank_group: None, family: str, targets: str
) -> None:
    from training.options.train import parse_args
    from training.run.loop import _Trainer

    opts = parse_args(["--init", "pretrained", "--model", _base(tmp_path, family), "--data", "random",
                       "--seq-len", "32", "--micro-batch-size", "2", "--steps", "2", "--lora-rank", "4",
                       "--lora-alpha", "8", "--lora-dropout", "0.25", "--lora-targets", targets])  # fmt: skip
    tr = _Trainer(opts, None, place=(0, 1, torch.device("cpu")))
    wanted = set(targets.split(","))
    assert wanted != set(DEFAULT_TARGETS)
    adapted = {
        n.split(".lora_A.")[0].rsplit(".", 1)[-1] for n, _ in tr.model.named_parameters() if ".lora_A." in n
    }
    assert adapted == wanted
    trained = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert trained and all(n.split(".lora_")[0].rsplit(".", 1)[-1] in wanted for n in trained)
    drops: list[Any] = [
        m.lora_dropout["default"] for n, m in tr.model.named_modules() if hasattr(m, "lora_dropout")
    ]
    assert len(drops) == len(wanted) * tr.model.config.num_hidden_layers
    assert all(isinstance(d, torch.nn.Dropout) and d.p == 0.25 for d in drops)
    assert tr.checkpoint_extra()["model_ref"]["lora"] == {
        "rank": 4, "alpha": 8, "dropout": 0.25, "targets": tuple(targets.split(","))
    }  # fmt: skip
    tr.train_step()  # the adapters train with their dropout

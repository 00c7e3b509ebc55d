"""Model shapes by name, without torch: the catalogue of published configs (training/model/configs/,
one JSON file per model with where its numbers come from) and two test shapes. The training code
builds `--init random` models from them; the memory plan, the step-time model and the settings
(synthesis) size jobs by them (training/model/dims.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CATALOGUE_DIR = Path(__file__).resolve().parent / "configs"


def _load_catalogue() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(CATALOGUE_DIR.glob("*.json"))}


# name -> {"hf_ids": [...], "published": URL, "sources": [...], "config": {config.json fields}}
CATALOGUE: dict[str, dict[str, Any]] = _load_catalogue()

# Two small shapes of the Qwen2 layout whose vocabulary fits the byte-level tokenizer (256 bytes +
# EOS, rounded up): tiny for CPU runs, small (~10 M parameters) for the GPU check that a fine-tune
# learns (bench/sft_task.py, whose tokenizer has 264 tokens) in minutes.
TEST_SHAPES: dict[str, dict[str, Any]] = {
    "small": dict(
        model_type="qwen2",
        vocab_size=264,
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        model_type="qwen2",
        vocab_size=264,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}

# Every shape's config fields by name: the catalogue's, then the test shapes.
SHAPES: dict[str, dict[str, Any]] = {
    **{name: entry["config"] for name, entry in CATALOGUE.items()},
    **TEST_SHAPES,
}


def narrowed(name: str, *, layers: int = 2, hidden: int = 128, heads: int = 4) -> dict[str, Any]:
    """A catalogue entry's config with fewer, narrower layers (tests and bench/families.py): its own
    model type, vocabulary, soft-caps, norms, positions and tying; `layers` layers of width `hidden`
    with `heads` heads of hidden / heads, grouped-query attention kept where the model has it, Gemma's
    query scale and sliding window at that size, Gemma 3's sliding and full layers both present."""
    fields = dict(SHAPES[name])
    head_dim = hidden // heads
    grouped = fields.get("num_key_value_heads", fields["num_attention_heads"]) < fields["num_attention_heads"]
    fields.update(
        num_hidden_layers=layers,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2 if grouped else heads,
        head_dim=head_dim,
    )
    if "query_pre_attn_scalar" in fields:
        fields["query_pre_attn_scalar"] = head_dim
    if fields["model_type"].startswith("gemma"):
        fields["sliding_window"] = 32  # shorter than the test blocks: the sliding layers' mask matters
    if fields["model_type"] == "gemma3_text":
        fields["layer_types"] = ["sliding_attention", "full_attention"][:layers] + ["full_attention"] * (
            layers - 2
        )
    return fields


def catalogue_name_of(model_id: str) -> str | None:
    """The catalogue entry whose published model (or its instruction-tuned twin) is `model_id`, a
    Hugging Face id; None when the catalogue does not know it."""
    for name, entry in CATALOGUE.items():
        if model_id in entry["hf_ids"]:
            return name
    return None

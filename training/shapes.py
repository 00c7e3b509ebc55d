"""Model shapes by name, without torch: the training code builds models from them, and the memory
plan (training/memory_plan.py), which the CDK side imports at synthesis, sizes them."""

from __future__ import annotations

from typing import Any

# Qwen2.5-1.5B as published (config.json of Qwen/Qwen2.5-1.5B), and two small shapes whose
# vocabulary fits the byte-level tokenizer (256 bytes + EOS, rounded up): tiny for CPU runs, small
# for a short learning check on a GPU.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-1.5b": dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    # ~10 M parameters of the same architecture: the GPU check that a fine-tune learns
    # (bench/sft_task.py, whose tokenizer has 264 tokens) in minutes.
    "small": dict(
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

"""A decoder's sizes from its Hugging Face config, without torch: what the memory plan, the
step-time model and FLOPs count (training/sizing/memory_plan.py, training/sizing/step_time.py,
training/sizing/flops.py).

The architectures the loop can shard (a `model.layers` list of decoder layers, training/model/build.py
decoder_layers) and their layer layouts, as the `transformers` modelling files build them:
  qwen2        q/k/v with bias, o without; SwiGLU MLP; two RMSNorms per layer
  llama        no bias unless `attention_bias` (q/k/v/o) or `mlp_bias` (gate/up/down)
  mistral      no bias; head_dim from the config when given
  qwen3        as llama, plus RMSNorms over q and k per head (q_norm, k_norm: head_dim each)
  gemma2       as llama, four RMSNorms per layer (input, post-attention, pre- and post-feedforward)
  gemma3_text  gemma2's layout plus q_norm and k_norm
head_dim is the config's where it has one (Qwen3, Gemma, Llama 3.2: head_dim x heads != hidden),
else hidden / heads. Sliding-window attention (Mistral, Gemma 2/3) changes no memory or FLOP term
at training lengths: SDPA keeps no attention matrix either way, and the windows (1,024 to 4,096)
only skip work FLOPs count as dense. tests/test_dims.py checks every catalogue entry's parameter
count against what `transformers` builds from the same config on the meta device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# model_type values the loop can shard, and the layer's norms beyond the two every layer has.
SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral", "gemma2", "gemma3_text")
_FOUR_NORMS = ("gemma2", "gemma3_text")
_QK_NORM = ("qwen3", "gemma3_text")


class ArchitectureError(ValueError):
    """A config the loop cannot train (unsupported model_type, missing fields)."""


# Model types whose config class defaults tie_word_embeddings to False (the rest: True, as
# transformers' PretrainedConfig and Gemma's config classes).
UNTIED_BY_DEFAULT = frozenset({"llama", "mistral", "qwen2", "qwen3"})


@dataclass(frozen=True)
class Dims:
    """A decoder-only transformer's sizes (SwiGLU/GeGLU MLP, RMSNorm, grouped-query attention)."""

    vocab: int
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool = True
    max_seq: int = 32768
    head_dim: int = 0  # 0: hidden // heads
    qkv_bias: bool = True  # the Qwen2 layout's defaults
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    layer_norms: int = 2
    model_type: str = "qwen2"
    # Attention logits soft-capped (Gemma 2): trained with eager attention, which keeps the
    # [heads, seq, seq] probabilities (training/model/build.py attention_implementation).
    attn_softcap: bool = False

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden // self.heads)

    @classmethod
    def of(cls, shape: str) -> Dims:
        from training.model.shapes import SHAPES

        try:
            s = SHAPES[shape]
        except KeyError:
            raise ValueError(f"unknown model shape {shape!r}; known: {', '.join(SHAPES)}") from None
        return cls.from_config(s)

    @classmethod
    def from_config(cls, s: Mapping[str, Any]) -> Dims:
        """From a Hugging Face config's fields (config.json, or a built model's `config.to_dict()`);
        a multimodal config's `text_config` is not read: ArchitectureError names the model_type."""
        kind = s.get("model_type", "qwen2")
        if kind not in SUPPORTED_MODEL_TYPES and isinstance(s.get("text_config"), Mapping):
            inner = s["text_config"].get("model_type", "?")
            raise ArchitectureError(
                f"model_type {kind!r} is a multimodal model, which the loop cannot shard; its "
                f"text_config (model_type {inner!r}) is the decoder: use a config.json of that alone"
            )
        if kind not in SUPPORTED_MODEL_TYPES:
            raise ArchitectureError(
                f"model_type {kind!r} is not a decoder the loop can shard (a model.layers list of "
                f"dense decoder layers); supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        missing = [
            k
            for k in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
            )
            if not isinstance(s.get(k), int)
        ]
        if missing:
            raise ArchitectureError(f"the config has no {', '.join(missing)}")
        heads = s["num_attention_heads"]
        attention_bias = bool(s.get("attention_bias", False))
        return cls(
            vocab=s["vocab_size"],
            hidden=s["hidden_size"],
            ffn=s["intermediate_size"],
            layers=s["num_hidden_layers"],
            heads=heads,
            kv_heads=s.get("num_key_value_heads") or heads,
            # A config.json without tie_word_embeddings gets its config class's default: True for
            # Gemma's (Gemma2Config, Gemma3TextConfig), False for LlamaConfig, MistralConfig,
            # Qwen2Config and Qwen3Config (transformers models/<type>/configuration_<type>.py).
            tied=bool(s.get("tie_word_embeddings", kind not in UNTIED_BY_DEFAULT)),
            max_seq=s.get("max_position_embeddings") or 32768,
            attn_softcap=bool(s.get("attn_logit_softcapping")),
            head_dim=s.get("head_dim") or s["hidden_size"] // heads,
            qkv_bias=True if kind == "qwen2" else attention_bias,
            o_bias=attention_bias if kind in ("llama", "qwen3", "gemma2", "gemma3_text") else False,
            mlp_bias=bool(s.get("mlp_bias", False)) if kind == "llama" else False,
            qk_norm=kind in _QK_NORM,
            layer_norms=4 if kind in _FOUR_NORMS else 2,
            model_type=kind,
        )

    @property
    def q_dim(self) -> int:
        """Width of the queries and the attention output: heads x head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """A decoder layer's linear modules by name: (in_features, out_features). LoRA's adapters
        (training/model/lora_spec.py) are sized from these."""
        d, kv, q = self.hidden, self.kv_dim, self.q_dim
        return {
            "q_proj": (d, q),
            "k_proj": (d, kv),
            "v_proj": (d, kv),
            "o_proj": (q, d),
            "gate_proj": (d, self.ffn),
            "up_proj": (d, self.ffn),
            "down_proj": (self.ffn, d),
        }

    @property
    def layer_params(self) -> int:
        """The linears (weights and biases), the layer's RMSNorms and q/k norms."""
        shapes = self.linear_shapes()
        weights = sum(i * o for i, o in shapes.values())
        biases = (self.q_dim + 2 * self.kv_dim) * self.qkv_bias + self.hidden * self.o_bias
        biases += (2 * self.ffn + self.hidden) * self.mlp_bias
        norms = self.layer_norms * self.hidden + 2 * self.head_dim * self.qk_norm
        return weights + biases + norms

    @property
    def root_params(self) -> int:
        """Embedding (and lm_head when untied) plus the final norm: the root FSDP unit."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def signature(self) -> str:
        """The sizes a plan depends on, as one flag value (python -m training --planned-dims)."""
        return (
            f"layers={self.layers},hidden={self.hidden},ffn={self.ffn},heads={self.heads},"
            f"kv_heads={self.kv_heads},head_dim={self.head_dim},vocab={self.vocab},tied={int(self.tied)}"
        )

    def signature_mismatch(self, planned: str) -> list[str]:
        """The fields of `planned` (a signature) this model differs in, as 'name planned -> this'."""
        mine = dict(kv.split("=", 1) for kv in self.signature().split(","))
        theirs = dict(kv.split("=", 1) for kv in planned.split(",") if "=" in kv)
        return [f"{k} {theirs[k]} -> {v}" for k, v in mine.items() if k in theirs and theirs[k] != v]

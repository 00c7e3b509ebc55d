"""LoRA's settings, without torch: what the memory plan, the step-time model, the settings and the
loop all read (training/lora.py applies them with Hugging Face `peft`).

LoRA (Hu et al., 2021) freezes the base model and learns, beside each chosen linear layer W
(out x in), a low-rank update B A (B: out x r, A: r x in) scaled by alpha / r, so the layer computes
W x + (alpha / r) B A dropout(x). Only A and B train: the optimizer state, gradients and
checkpoints hold those alone, and the base can stay in bf16 (no fp32 master copy).
"""

from __future__ import annotations

from dataclasses import dataclass

# Every linear layer of a decoder layer (attention and MLP), by the names Llama-style Hugging Face
# decoders use (Qwen2/2.5/3, Llama 3.x, Mistral, Gemma 2/3): the choice QLoRA (Dettmers et al.,
# 2023) found needed to match full fine-tuning, and peft's "all-linear" without the output layer.
DEFAULT_TARGETS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
DEFAULT_RANK = 16
DEFAULT_ALPHA = 32.0


class LoraError(ValueError):
    """A bad LoRA setting: the message names it and says what is valid."""


@dataclass(frozen=True)
class LoraSpec:
    """rank r, alpha (the update is scaled by alpha / r), dropout on the adapters' input, and the
    decoder layers' linear modules that get adapters (by name, e.g. q_proj)."""

    rank: int = DEFAULT_RANK
    alpha: float = DEFAULT_ALPHA
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise LoraError(problem)

    def problem(self, prefix: str = "lora") -> str | None:
        """One line naming the first bad field, or None."""
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            return (
                f"{prefix}.rank: {self.rank!r} is not a rank; use a whole number >= 1 (8, 16, 64 are common)"
            )
        if not self.alpha > 0:
            return (
                f"{prefix}.alpha: {self.alpha!r} must be > 0 "
                "(the update is scaled by alpha / rank; 2 x rank is usual)"
            )
        if not 0 <= self.dropout < 1:
            return f"{prefix}.dropout: {self.dropout!r} must be in [0, 1)"
        if not self.targets:
            return f"{prefix}.target_modules: empty; name at least one of {', '.join(DEFAULT_TARGETS)}"
        if len(set(self.targets)) != len(self.targets):
            return f"{prefix}.target_modules: {list(self.targets)} names a module twice"
        return None

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def unknown_targets(self, available: set[str] | frozenset[str]) -> list[str]:
        """The targets a model's decoder layers do not have (by module name)."""
        return [t for t in self.targets if t not in available]

    def params_per_layer(self, linear_shapes: dict[str, tuple[int, int]]) -> int:
        """A and B of every target: r x (in + out) each (`linear_shapes`: name -> (in, out))."""
        return sum(self.rank * (linear_shapes[t][0] + linear_shapes[t][1]) for t in self.targets)

    def as_args(self) -> list[str]:
        """`python -m training` flags for this spec (training/options.py reads them back)."""
        return [
            "--lora-rank",
            str(self.rank),
            "--lora-alpha",
            f"{self.alpha:g}",
            "--lora-dropout",
            f"{self.dropout:g}",
            "--lora-targets",
            ",".join(self.targets),
        ]

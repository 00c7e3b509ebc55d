"""LoRA's settings, without torch: what the memory plan, the step-time model, the settings and the
loop all read (training/model/lora.py applies them with Hugging Face `peft`).

LoRA (Hu et al., 2021) freezes the base model and learns, beside each chosen linear layer W
(out x in), a low-rank update B A (B: out x r, A: r x in) scaled by alpha / r, so the layer computes
W x + (alpha / r) B A dropout(x). Only A and B train: the optimizer state, gradients and
checkpoints hold those alone, and the base can stay in bf16 (no fp32 master copy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
DEFAULT_ALPHA = 32


SETTING_NAMES = {
    "rank": "job.lora.rank",
    "alpha": "job.lora.alpha",
    "dropout": "job.lora.dropout",
    "targets": "job.lora.target_modules",
}
FLAG_NAMES = {
    "rank": "--lora-rank",
    "alpha": "--lora-alpha",
    "dropout": "--lora-dropout",
    "targets": "--lora-targets",
}


class LoraError(ValueError):
    """A bad LoRA setting: the message names it and says what is valid."""


@dataclass(frozen=True)
class LoraSpec:
    """rank r, alpha (the update is scaled by alpha / r), dropout on the adapters' input, and the
    decoder layers' linear modules that get adapters (by name, e.g. q_proj)."""

    rank: int = DEFAULT_RANK
    alpha: int = DEFAULT_ALPHA
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        problem = self.problem()
        if problem:
            raise LoraError(problem)

    @classmethod
    def checked(
        cls, rank: int, alpha: int, dropout: float, targets: tuple[str, ...], names: dict[str, str]
    ) -> LoraSpec:
        """A spec from user input, refused (LoraError) with the user's own names for the fields."""
        problem = object.__new__(cls)
        for key, value in (("rank", rank), ("alpha", alpha), ("dropout", dropout), ("targets", targets)):
            object.__setattr__(problem, key, value)
        message = cls.problem(problem, names)
        if message:
            raise LoraError(message)
        return cls(rank, alpha, dropout, tuple(targets))

    def problem(self, names: dict[str, str] | None = None) -> str | None:
        """One line naming the first bad field, or None. `names` maps the fields (rank, alpha,
        dropout, targets) to what the user wrote: SETTING_NAMES (default) or FLAG_NAMES."""
        n = names or SETTING_NAMES
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            return (
                f"{n['rank']}: {self.rank!r} is not a rank; use a whole number >= 1 (8, 16 or 64 are usual)"
            )
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, int) or self.alpha < 1:
            # peft's LoraConfig.lora_alpha is an int (adapter_config.json carries it as one).
            return f"{n['alpha']}: {self.alpha!r}; use a whole number >= 1 (the update is alpha / rank x B A)"
        if not 0 <= self.dropout < 1:
            return f"{n['dropout']}: {self.dropout!r} must be in [0, 1)"
        if not self.targets or any(not t for t in self.targets):
            return f"{n['targets']}: {list(self.targets)}; name modules such as {', '.join(DEFAULT_TARGETS)}"
        if len(set(self.targets)) != len(self.targets):
            return f"{n['targets']}: {list(self.targets)} names a module twice"
        return None

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def unknown_targets(self, available: set[str] | frozenset[str]) -> list[str]:
        """The targets a model's decoder layers do not have (by module name)."""
        return [t for t in self.targets if t not in available]

    def model_problem(
        self, linear_shapes: dict[str, tuple[int, int]], model_type: str, names: dict[str, str] | None = None
    ) -> tuple[str, str] | None:
        """(field, one line) when the targets or the rank do not suit a model's decoder layers
        (`linear_shapes`: name -> (in, out), training/model/dims.py), else None. A rank at or above a
        target's smaller side is no low-rank update: B A could then be any matrix of that shape."""
        n = names or SETTING_NAMES
        unknown = self.unknown_targets(set(linear_shapes))
        if unknown:
            return "targets", (
                f"{n['targets']}: {', '.join(unknown)}: not a linear module of {model_type}'s decoder "
                f"layers; valid: {', '.join(linear_shapes)}"
            )
        side = min(min(linear_shapes[t]) for t in self.targets)
        if self.rank >= side:
            return "rank", (
                f"{n['rank']}: {self.rank} is not below the smaller side of its targets ({side} in "
                f"{model_type}'s layers), so it is no low-rank update; use 8-64 (at most {side - 1})"
            )
        return None

    def params_per_layer(self, linear_shapes: dict[str, tuple[int, int]]) -> int:
        """A and B of every target: r x (in + out) each (`linear_shapes`: name -> (in, out))."""
        return sum(self.rank * (linear_shapes[t][0] + linear_shapes[t][1]) for t in self.targets)

    def as_args(self) -> list[str]:
        """`python -m training` flags for this spec (training/options/train.py reads them back)."""
        return [
            "--lora-rank",
            str(self.rank),
            "--lora-alpha",
            str(self.alpha),
            "--lora-dropout",
            f"{self.dropout:g}",
            "--lora-targets",
            ",".join(self.targets),
        ]


def add_arguments(parser: Any) -> None:
    """`python -m training`'s LoRA flags (an argparse parser); read back by `from_options`."""
    g = parser.add_argument_group("LoRA (training/model/lora.py)")
    g.add_argument(
        "--lora-rank",
        type=int,
        default=0,
        metavar="R",
        help="train LoRA adapters of rank R on a frozen bf16 base (0: full fine-tuning, the default)",
    )
    # No defaults here (None: not given): a LoRA flag without --lora-rank is refused, not ignored;
    # from_options fills in LoraSpec's defaults.
    g.add_argument(
        "--lora-alpha", type=int, help=f"the update is scaled by alpha / rank (default {DEFAULT_ALPHA})"
    )
    g.add_argument("--lora-dropout", type=float, help="dropout on the adapters' input (default 0)")
    g.add_argument(
        "--lora-targets",
        metavar="NAMES",
        help="comma-separated linear modules of the decoder layers that get adapters (default "
        f"{','.join(DEFAULT_TARGETS)})",
    )
    g.add_argument(
        "--export-merged",
        action="store_true",
        help="with LoRA, also export the base with the adapters merged in, as a full Hugging Face folder",
    )


def flags_without_rank(options: Any) -> list[str]:
    """The LoRA flags given (not None) while --lora-rank is 0: refused, not silently ignored."""
    if options.lora_rank != 0:
        return []
    extras = ("alpha", "dropout", "targets")
    return [FLAG_NAMES[k] for k in extras if getattr(options, f"lora_{k}") is not None]


def from_options(options: Any) -> LoraSpec | None:
    """The spec of parsed options (their lora_* attributes), None for full fine-tuning; LoraError
    naming the flag when a value is bad."""
    if options.lora_rank == 0:
        return None
    alpha = DEFAULT_ALPHA if options.lora_alpha is None else options.lora_alpha
    dropout = 0.0 if options.lora_dropout is None else options.lora_dropout
    listed = options.lora_targets if options.lora_targets is not None else ",".join(DEFAULT_TARGETS)
    targets = tuple(t.strip() for t in str(listed).split(","))
    return LoraSpec.checked(options.lora_rank, alpha, dropout, targets, FLAG_NAMES)

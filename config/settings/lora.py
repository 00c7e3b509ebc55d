"""job.lora: LoRA's settings as an environment file writes them (training/model/lora_spec.py holds the
rules, which the training CLI applies to its flags too)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from config.settings.base import FieldError, SettingsModel
from training.model.lora_spec import (
    DEFAULT_ALPHA,
    DEFAULT_RANK,
    DEFAULT_TARGETS,
    SETTING_NAMES,
    LoraError,
    LoraSpec,
)


class LoraSettings(SettingsModel):
    """LoRA (training/model/lora_spec.py): a frozen bf16 base, low-rank adapters trained with FSDP2."""

    rank: int = DEFAULT_RANK
    alpha: int = DEFAULT_ALPHA  # peft's lora_alpha is a whole number
    dropout: float = 0.0
    # Linear modules of each decoder layer that get adapters, by name.
    target_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_TARGETS))

    @model_validator(mode="before")
    @classmethod
    def _kinds(cls, data: Any) -> Any:
        # What peft's documentation leads users to write: a fractional alpha, "all-linear".
        if isinstance(data, dict):
            alpha, targets = data.get("alpha"), data.get("target_modules")
            if isinstance(alpha, float) and not alpha.is_integer():
                raise FieldError(("alpha",), f"{alpha!r}; use a whole number >= 1 (peft's lora_alpha is one)")
            # YAML's true is not a rank of 1, nor "16" text a number: say what is valid.
            for name in ("rank", "alpha"):
                value = data.get(name)
                whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
                if name in data and (isinstance(value, bool) or not whole):
                    raise FieldError((name,), f"{value!r}; use a whole number >= 1")
            dropout = data.get("dropout")
            if "dropout" in data and (isinstance(dropout, bool) or not isinstance(dropout, (int, float))):
                raise FieldError(("dropout",), f"{dropout!r}; use a number in [0, 1), e.g. 0.05")
            if isinstance(targets, str):
                raise FieldError(
                    ("target_modules",),
                    f"{targets!r}: give a list of module names such as [q_proj, v_proj], or omit it "
                    f"for every linear layer of the decoder layers ({', '.join(DEFAULT_TARGETS)})",
                )
        return data

    @model_validator(mode="after")
    def _valid(self) -> LoraSettings:
        # LoraSpec's own rule (the training CLI applies the same), named as the settings are.
        try:
            LoraSpec.checked(self.rank, self.alpha, self.dropout, tuple(self.target_modules), SETTING_NAMES)
        except LoraError as exc:
            field, message = str(exc).split(": ", 1)
            raise FieldError((field.rsplit(".", 1)[1],), message) from None
        return self

    @property
    def spec(self) -> LoraSpec:
        return LoraSpec(self.rank, self.alpha, self.dropout, tuple(self.target_modules))

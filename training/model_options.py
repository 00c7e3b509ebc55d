"""`python -m training`'s flags for the model's method and plan, checked without torch: LoRA's
settings (training/lora_spec.py), the merged export, and the dimensions synthesis planned for."""

from __future__ import annotations

import argparse
import re
from typing import Any

from training.lora_spec import DEFAULT_ALPHA, DEFAULT_TARGETS, LoraError, LoraSpec

LORA_FLAGS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets")
_SIGNATURE = re.compile(r"^[a-z_]+=\d+(,[a-z_]+=\d+)*$")


class ModelOptionError(ValueError):
    """A bad model flag: the message names it."""


def add_arguments(g: Any, shapes: tuple[str, ...]) -> None:
    g.add_argument(
        "--shape",
        choices=shapes,
        default="qwen2.5-1.5b",
        help="architecture for --init random (training/model_configs/, or tiny/small)",
    )
    g.add_argument(
        "--lora-rank",
        type=int,
        default=None,
        metavar="R",
        help="train LoRA adapters of rank R on a frozen bf16 base instead of the whole model",
    )
    g.add_argument("--lora-alpha", type=float, default=None, help=f"LoRA's alpha (default {DEFAULT_ALPHA:g})")
    g.add_argument(
        "--lora-dropout", type=float, default=None, help="dropout on the adapters' input (default 0)"
    )
    g.add_argument(
        "--lora-targets",
        default=None,
        metavar="NAMES",
        help=f"comma-separated linear modules of each decoder layer (default {','.join(DEFAULT_TARGETS)})",
    )
    g.add_argument(
        "--export-merged",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with LoRA and --export: also write the merged full model beside the adapter",
    )
    g.add_argument(
        "--planned-dims",
        default=None,
        metavar="SIGNATURE",
        help="the dimensions the job was planned for (training.dims.Dims.signature, set by the chart): "
        "the job stops, naming the difference, when --model has others",
    )


def check(d: dict[str, Any]) -> None:
    """Replaces the --lora-* values by `lora` (a LoraSpec, or None for a full fine-tune)."""
    rank, alpha, dropout, targets = (d.pop(k) for k in LORA_FLAGS)
    if rank is None:
        given = [
            f"--{k.replace('_', '-')}"
            for k, v in zip(LORA_FLAGS[1:], (alpha, dropout, targets), strict=True)
            if v is not None
        ]
        if given:
            raise ModelOptionError(f"{given[0]}: needs --lora-rank (LoRA is off without it)")
        d["lora"] = None
    else:
        try:
            d["lora"] = LoraSpec(
                rank=rank,
                alpha=DEFAULT_ALPHA if alpha is None else alpha,
                dropout=0.0 if dropout is None else dropout,
                targets=DEFAULT_TARGETS
                if targets is None
                else tuple(t.strip() for t in targets.split(",") if t.strip()),
            )
        except LoraError as exc:
            field, message = str(exc).split(": ", 1)
            flag = {"lora.target_modules": "--lora-targets"}.get(field, "--" + field.replace(".", "-"))
            raise ModelOptionError(f"{flag}: {message}") from None
        if d["init"] == "random":
            raise ModelOptionError(
                "--lora-rank: needs --init pretrained: adapters on random weights learn nothing a full "
                "fine-tune would not"
            )
    if d["export_merged"] and (d["lora"] is None or not d["export"]):
        raise ModelOptionError("--export-merged: merges LoRA's adapters: needs --lora-rank and --export")
    if d["planned_dims"] is not None and not _SIGNATURE.match(d["planned_dims"]):
        raise ModelOptionError(
            f"--planned-dims: {d['planned_dims']!r} is not a signature like layers=28,hidden=3584,..."
        )


def lora_from_dict(value: Any) -> LoraSpec | None:
    """TrainOptions.from_dict: the dict dataclasses.asdict made of a LoraSpec, back."""
    if value is None or isinstance(value, LoraSpec):
        return value
    return LoraSpec(**{**value, "targets": tuple(value["targets"])})

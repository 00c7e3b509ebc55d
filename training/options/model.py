"""The model flags of `python -m training`: which model (--model, --init, --shape) and the
dimensions synthesis planned the job for (--planned-dims, config/models.py, which the driver checks
against the model it loads: training/run/driver.py), checked before any worker fetches it; LoRA's flags
checked against them."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from training.model.lora_spec import LoraError, LoraSpec, flags_without_rank
from training.model.lora_spec import from_options as lora_from_options
from training.model.shapes import SHAPES as SHAPE_TABLE
from training.options.types import OptionError, location_option

SHAPES = tuple(SHAPE_TABLE)
DEFAULT_MODEL = "Qwen/Qwen2.5-1.5B"
# Hugging Face repo ids: "name" or "org/name" of letters, digits, "-", "_", ".".
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_SIGNATURE = re.compile(r"^[a-z_]+=\d+(,[a-z_]+=\d+)*$")


def add_arguments(g: Any) -> None:
    """The "model" group's model flags (parallelism and precision follow: options_precision.py)."""
    g.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="Hugging Face id, local dir or s3:// prefix (weights with --init pretrained; "
        "tokenizer of real data: text unless --shape tiny, chat data always with its chat template)",
    )
    g.add_argument("--init", choices=("pretrained", "random"), default="pretrained")
    g.add_argument(
        "--shape",
        choices=SHAPES,
        default="qwen2.5-1.5b",
        help="architecture for --init random (training/model/configs/, or tiny/small)",
    )
    g.add_argument(
        "--planned-dims",
        default=None,
        metavar="SIGNATURE",
        help="the dimensions the job was planned for (training.model.dims.Dims.signature, set by the chart): "
        "the job stops, naming the difference, when --model has others",
    )


def check(d: dict[str, Any]) -> None:
    if d["planned_dims"] is not None and not _SIGNATURE.match(d["planned_dims"]):
        raise OptionError(
            f"--planned-dims: {d['planned_dims']!r} is not a signature like layers=28,hidden=3584,..."
        )


def check_model_ref(model: str, weights: bool = True) -> str:
    """`weights`: the model itself (config.json); else only its tokenizer is needed. Returns the
    reference to use: a local folder as an absolute path, since Ray Train's workers do not run in
    the driver's working directory (a relative path would be taken for a hub id there)."""
    if "://" in model or ":" in model.split("/", 1)[0]:
        # A remote prefix: well formed here; its files are checked when the driver fetches its
        # config (check_model).
        location_option("--model", model)
        return model
    if os.path.isdir(model):
        if not weights and (Path(model) / "tokenizer_config.json").is_file():
            return os.path.abspath(model)
        if not (Path(model) / "config.json").is_file():
            raise OptionError(f"--model: {model} has no config.json (not a Hugging Face model dir)")
        return os.path.abspath(model)
    if model.startswith((".", "/")) or not _HF_ID.match(model):
        raise OptionError(
            f"--model: {model!r} is neither an existing dir, an s3:// prefix nor a Hugging Face id"
        )
    return model


def check_lora(d: dict[str, Any]) -> None:
    """LoRA's flags: valid values, a pretrained base, and the kernels LoRA runs with."""
    given = flags_without_rank(argparse.Namespace(**d))
    if given:
        raise OptionError(f"{', '.join(given)}: only with LoRA; add --lora-rank R (16 is usual) or drop it")
    try:
        spec = lora_from_options(argparse.Namespace(**d))
    except LoraError as exc:
        raise OptionError(str(exc)) from None
    # The values a run records (run.json): LoRA's defaults when not given, as before they were
    # flag defaults, so a run started by an earlier version resumes with the same options.
    default = LoraSpec()
    d["lora_alpha"], d["lora_dropout"], d["lora_targets"] = (
        (spec or default).alpha,
        (spec or default).dropout,
        ",".join((spec or default).targets),
    )
    if spec is None:
        if d["export_merged"]:
            raise OptionError(
                "--export-merged: only with LoRA (--lora-rank R): a full fine-tune's export is the model"
            )
        return
    if d["init"] == "random":
        raise OptionError(
            "--lora-rank: LoRA adapts a pretrained model; with --init random train the whole model "
            "(drop --lora-rank) or give --init pretrained --model ID|DIR|s3://"
        )
    if d["float8"]:
        raise OptionError("--float8: not with LoRA (its frozen bf16 base is not converted); drop --float8")

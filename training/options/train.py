"""Command-line and config-file options, validated before any Ray worker starts.

The entry: TrainOptions, the parser and parse_args, which checks what the options govern in the
modules that hold them: the run (options_run.py), the model (options_model.py), parallelism and
precision (options_precision.py), the data (options_data.py), metrics and network
(options_metrics.py); the shared error and value types are in option_types.py."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any, NoReturn

from training.model.lora_spec import DEFAULT_ALPHA, DEFAULT_TARGETS, LoraSpec
from training.model.lora_spec import from_options as lora_from_options
from training.options import data as options_data
from training.options import metrics as options_metrics
from training.options import model as options_model
from training.options import precision as options_precision
from training.options import run as options_run
from training.options import schedule as options_schedule
from training.options.data import (
    DATA_SUFFIXES,
    SAMPLE_DATA,
    batch_split_error,
    check_data_path,
    check_skipped_fraction,
    check_text_field,
    corpus_listing,
    data_files,
    first_record_fields,
    resolve_data_format,
)
from training.options.metrics import TRANSPORTS, profile_range
from training.options.model import DEFAULT_MODEL, SHAPES
from training.options.precision import SHARDINGS
from training.options.types import OptionError, location_option, non_negative_int, positive
from training.sizing.batch import accumulation_steps

# Names other modules, tests and benchmarks import from here, where they were first defined.
__all__ = [
    "DATA_SUFFIXES",
    "DEFAULT_MODEL",
    "SAMPLE_DATA",
    "SHAPES",
    "SHARDINGS",
    "TRANSPORTS",
    "OptionError",
    "TrainOptions",
    "batch_split_error",
    "build_parser",
    "check_data_path",
    "check_skipped_fraction",
    "check_text_field",
    "corpus_listing",
    "data_files",
    "first_record_fields",
    "location_option",
    "parse_args",
    "profile_range",
    "resolve_data_format",
]


@dataclasses.dataclass
class TrainOptions:
    run_name: str
    storage_path: str
    output_dir: str
    num_workers: int | None
    address: str | None
    max_failures: int
    max_preemptions: int
    checkpoint_every: int
    async_checkpoint: bool
    keep_checkpoints: int
    model: str
    init: str
    shape: str
    data: str
    prepared_data: str | None  # where raw --data is prepared (None for random or prepared --data)
    text_field: str
    seq_len: int
    global_batch_size: int | None
    micro_batch_size: int | None  # None: `auto`, chosen by each worker from the memory plan (trainer.py)
    steps: int  # with --epochs: None until the data is known (training/options/schedule.py with_epochs)
    lr: float
    warmup_steps: int
    weight_decay: float
    grad_clip: float
    seed: int
    sharding: str
    compile: bool | None  # None: on for GPU workers
    activation_checkpointing: bool
    liger: bool | None  # None: on for GPU workers that have liger-kernel
    liger_layers: bool | None  # None: only when the layers are not compiled
    float8: bool | None  # None: on for compiled GPU workers with FP8 tensor cores (see --float8)
    float8_all_gather: bool
    reshard_after_forward: bool | None  # None: by the memory plan on each worker (trainer.py)
    loss_chunk_tokens: int | None  # None: by the GPU's memory (training/sizing/loss_chunks.py)
    expect_transport: str
    emulate_hosts: int | None
    profile: str | None
    peak_tflops: float | None
    log_every: int
    report_every: int
    metrics_cluster: str | None = None  # CloudWatch EMF step metrics (training/reporting/emf.py) when set
    max_skipped_fraction: float = 0.0  # of the raw --data records, when the driver prepares it
    data_format: str = "text"  # "text" or "chat" (training/methods/sft.py), resolved from "auto"
    too_long: str = "drop"  # chat: a conversation longer than --seq-len is dropped or truncated
    max_dropped_fraction: float = 0.1  # chat: the share dropped as too long before preparation stops
    eval_data: str | None = None  # held-out set: prepared data, or jsonl/parquet prepared first
    eval_prepared: str | None = None  # where raw --eval-data is prepared
    eval_fraction: float | None = None  # or: the last fraction of the training data's blocks
    eval_every: int = 0  # steps between evaluations (0: at every checkpoint) and at the end
    early_stop_patience: int = 0  # stop after this many evaluations without a lower eval loss
    export: bool = True  # a Hugging Face folder under the run at the end (training/export/command.py)
    skip_guard_eval: bool | None = None  # None: on for compiled layers on unflagged (text) data
    lora_rank: int = 0  # LoRA adapters of this rank on a frozen base (training/model/lora.py); 0: full
    lora_alpha: int = DEFAULT_ALPHA  # the flags' None (not given) becomes these in check_lora
    lora_dropout: float = 0.0
    lora_targets: str = ",".join(DEFAULT_TARGETS)
    export_merged: bool = False  # LoRA: the merged model too, beside the adapter
    planned_dims: str | None = None  # what synthesis planned for (training/model/dims.py signature)

    @property
    def lora(self) -> LoraSpec | None:
        return lora_from_options(self)

    resume: bool = False  # continue --run-name's checkpoints (training/checkpoint/run_state.py)
    job_id: str | None = None  # the job's name: a retry of the same job resumes without --resume
    epochs: float | None = None  # instead of --steps: passes over the training data
    warmup_ratio: float | None = None  # instead of --warmup-steps: a share of the steps
    lr_schedule: str = options_schedule.DEFAULT_SCHEDULE  # after the warm-up: cosine, linear, constant

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainOptions:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise OptionError(message)


def build_parser() -> argparse.ArgumentParser:
    pos_float = positive(float)
    p = _Parser(
        prog="python -m training",
        description="Train a causal LM with PyTorch FSDP2 on Ray Train (local Ray by default).",
        allow_abbrev=False,
    )
    p.add_argument("--config", metavar="FILE", help="YAML or JSON file of options; flags override it")
    options_run.add_arguments(p.add_argument_group("run"))
    g = p.add_argument_group("model")
    options_model.add_arguments(g)
    options_precision.add_arguments(g)
    options_data.add_arguments(p.add_argument_group("data"), p)
    g = p.add_argument_group("optimisation")
    options_schedule.add_arguments(g)
    g.add_argument("--lr", type=pos_float, default=1e-4)
    g.add_argument(
        "--weight-decay",
        type=float,
        default=0.0,
        help="AdamW's decoupled weight decay on weight matrices and embeddings, never on biases or norm "
        "gains (default 0.0, as transformers' Trainer, TRL and axolotl)",
    )
    g.add_argument("--grad-clip", type=float, default=1.0, help="max grad norm; 0 = off")
    g.add_argument("--seed", type=non_negative_int, default=0)
    options_metrics.add_arguments(p.add_argument_group("metrics and network"))
    return p


def _config_argv(path: str, parser: argparse.ArgumentParser) -> list[str]:
    """Turn a config file into flags placed before the command line's, so the command line wins."""
    file = Path(path)
    if not file.is_file():
        raise OptionError(f"--config: no such file: {path}")
    text = file.read_text()
    try:
        if file.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:
        raise OptionError(f"--config: {path} is not valid YAML/JSON: {exc}") from None
    if data is None:
        return []
    if not isinstance(data, dict):
        raise OptionError(f"--config: {path} must hold a mapping of option names to values")
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    argv: list[str] = []
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if dest not in actions or dest == "config":
            valid = ", ".join(sorted(d.replace("_", "-") for d in actions if d != "config"))
            raise OptionError(f"--config: unknown option '{key}' in {path}; valid: {valid}")
        flag = "--" + dest.replace("_", "-")
        if isinstance(actions[dest], argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                raise OptionError(f"{flag} (in {path}): must be true or false, got {value!r}")
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            if isinstance(value, (dict, list)):
                raise OptionError(f"{flag} (in {path}): must be a single value, got {value!r}")
            argv += [flag, str(value)]
    return argv


def parse_args(argv: list[str]) -> TrainOptions:
    """Parse flags (and --config), then check what can be checked without Ray."""
    parser = build_parser()
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    full = (_config_argv(known.config, parser) if known.config else []) + list(argv)
    ns = parser.parse_args(full)
    d = vars(ns)
    d.pop("config", None)
    options_run.check(d)
    options_model.check(d)
    manifest = options_data.check_prepared(d)
    _check_training(d)
    if d["data"] != "random" and manifest is None:
        d["data_format"] = resolve_data_format(d["data_format"], check_data_path(d["data"]), d["text_field"])
    elif manifest is not None:
        from training.data.shards import CHAT_FORMAT

        prepared = "chat" if manifest["format"] == CHAT_FORMAT else "text"
        if d["data_format"] not in ("auto", prepared):
            raise OptionError(
                f"--data-format: {d['data']} holds prepared {prepared} data, not {d['data_format']}"
            )
        d["data_format"] = prepared
    else:
        d["data_format"] = "text"
    options_data.check_eval(d)
    options_model.check_lora(d)
    from training.data.shards import FORMAT as UNFLAGGED  # text prepared before documents had flags

    unflagged = manifest is not None and manifest["format"] == UNFLAGGED
    if d["skip_guard_eval"] and d["data"] != "random" and not unflagged:
        raise OptionError(
            f"--skip-guard-eval: not with {d['data_format']} data (packed "
            f"{'conversations' if d['data_format'] == 'chat' else 'documents'} give blocks different "
            "attention masks, which only the guards tell apart); drop it or use --no-skip-guard-eval"
        )
    chat_to_prepare = d["prepared_data"] is not None and d["data_format"] == "chat"
    if (
        d["init"] == "pretrained"
        or (d["prepared_data"] is not None and d["shape"] != "tiny")
        or chat_to_prepare
    ):
        d["model"] = options_model.check_model_ref(d["model"], weights=d["init"] == "pretrained")
    return TrainOptions(**d)


def _check_training(d: dict[str, Any]) -> None:
    check_skipped_fraction(d["max_skipped_fraction"])
    if d["seq_len"] is None:
        d["seq_len"] = 256 if d["init"] == "random" and d["shape"] == "tiny" else 2048
    options_schedule.check(d)
    if d["grad_clip"] < 0:
        raise OptionError(f"--grad-clip: must be >= 0, got {d['grad_clip']}")
    if d["weight_decay"] < 0:
        raise OptionError(f"--weight-decay: must be >= 0, got {d['weight_decay']}")
    global_batch, micro, workers = d["global_batch_size"], d["micro_batch_size"], d["num_workers"]
    if micro is None and global_batch is None:
        raise OptionError(
            "--micro-batch-size auto: needs --global-batch-size (the sequences per step it splits)"
        )
    # Without --num-workers the driver applies the rule once it knows the cluster's workers.
    if global_batch is not None and accumulation_steps(global_batch, micro or 1, workers or 1) is None:
        if not workers:
            raise OptionError(
                f"--global-batch-size: must be a multiple of --micro-batch-size ({micro}), got {global_batch}"
            )
        raise OptionError(batch_split_error(global_batch, micro, workers))
    if d["liger_layers"] and d["liger"] is False:
        raise OptionError("--liger-layers: needs Liger (drop --no-liger)")
    if d["emulate_hosts"] and d["num_workers"] and d["num_workers"] % d["emulate_hosts"]:
        raise OptionError(
            f"--emulate-hosts: {d['emulate_hosts']} hosts must divide --num-workers {d['num_workers']}"
        )
    if d["profile"] is not None and d["steps"] is not None:  # with --epochs: once the steps are known
        d["profile"] = options_metrics.check_profile(d["profile"], d["steps"])
    options_precision.check_packages(d)

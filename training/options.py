"""Command-line and config-file options, validated before any Ray worker starts."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any, NoReturn

from training.batch import accumulation_steps
from training.lora_spec import DEFAULT_ALPHA, DEFAULT_TARGETS, LoraError, LoraSpec
from training.lora_spec import add_arguments as add_lora_arguments
from training.lora_spec import from_options as lora_from_options
from training.loss_chunks import LARGE_GPU_GIB, LOSS_CHUNK_TOKENS, SMALL_GPU_CHUNK_TOKENS
from training.memory_plan import AUTO_HEADROOM
from training.model_options import ModelOptionError
from training.model_options import add_arguments as add_model_arguments
from training.model_options import check as check_model_options
from training.precision import FLOAT8_MIN_TOKENS
from training.run_flags import add_run_arguments
from training.shapes import SHAPES as SHAPE_TABLE
from training.uri import LocationError, check_input, check_output

SHAPES = tuple(SHAPE_TABLE)
SHARDINGS = ("auto", "full", "hsdp")
TRANSPORTS = ("auto", "efa", "socket", "ib", "any")
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
DEFAULT_MODEL = "Qwen/Qwen2.5-1.5B"
SAMPLE_DATA = Path(__file__).resolve().parent / "sample" / "sample.jsonl"
# Hugging Face repo ids: "name" or "org/name" of letters, digits, "-", "_", ".".
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class OptionError(Exception):
    """A bad option: the message names it and says what is valid."""


def location_option(option: str, value: str, *, output: bool = False, s3_only: bool = False) -> str:
    """A location option checked by the one URI rule (training.uri), in its canonical form."""
    schemes = ("s3",) if s3_only else ("s3", "file")
    try:
        return str((check_output if output else check_input)(option, value, schemes=schemes))
    except LocationError as exc:
        raise OptionError(str(exc)) from None


@dataclasses.dataclass
class TrainOptions:
    run_name: str
    storage_path: str
    output_dir: str
    num_workers: int | None
    address: str | None
    max_failures: int
    checkpoint_every: int
    keep_checkpoints: int
    model: str
    init: str
    shape: str
    data: str
    prepared_data: str | None  # where raw --data is prepared (None for random or prepared --data)
    text_field: str
    seq_len: int
    global_batch_size: int | None
    micro_batch_size: int | None  # None: `auto`, chosen by each worker from the memory plan (loop.py)
    steps: int
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
    reshard_after_forward: bool | None  # None: by the memory plan on each worker (loop.py)
    loss_chunk_tokens: int | None  # None: by the GPU's memory (training/loss_chunks.py)
    expect_transport: str
    emulate_hosts: int | None
    profile: str | None
    peak_tflops: float | None
    log_every: int
    report_every: int
    metrics_cluster: str | None = None  # CloudWatch EMF step metrics (training/emf.py) when set
    max_skipped_fraction: float = 0.0  # of the raw --data records, when the driver prepares it
    data_format: str = "text"  # "text" or "chat" (training/sft.py), resolved from "auto"
    too_long: str = "drop"  # chat: a conversation longer than --seq-len is dropped or truncated
    eval_data: str | None = None  # held-out set: prepared data, or jsonl/parquet prepared first
    eval_prepared: str | None = None  # where raw --eval-data is prepared
    eval_fraction: float | None = None  # or: the last fraction of the training data's blocks
    eval_every: int = 0  # steps between evaluations (0: at every checkpoint) and at the end
    early_stop_patience: int = 0  # stop after this many evaluations without a lower eval loss
    export: bool = True  # a Hugging Face folder under the run at the end (training/export.py)
    skip_guard_eval: bool | None = None  # None: on for compiled layers on unflagged (text) data
    lora_rank: int = 0  # LoRA adapters of this rank on a frozen base (training/lora.py); 0: full
    lora_alpha: int = DEFAULT_ALPHA
    lora_dropout: float = 0.0
    lora_targets: str = ",".join(DEFAULT_TARGETS)
    export_merged: bool = False  # LoRA: the merged model too, beside the adapter
    planned_dims: str | None = None  # what synthesis planned for (training/dims.py signature)

    @property
    def lora(self) -> LoraSpec | None:
        return lora_from_options(self)

    resume: bool = False  # continue --run-name's checkpoints (training/run_state.py)
    job_id: str | None = None  # the job's name: a retry of the same job resumes without --resume

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainOptions:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise OptionError(message)


def _positive(kind: type) -> Any:
    def conv(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    conv.__name__ = f"positive {'integer' if kind is int else 'number'}"
    return conv


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


# argparse names the type in "invalid <name> value: 'abc'".
_non_negative_int.__name__ = "non-negative integer"


def batch_split_error(global_batch: int, micro: int | None, workers: int) -> str:
    """--global-batch-size does not split into the workers' equal micro-batches: one line."""
    if micro is None:
        return f"--global-batch-size: {global_batch} is not a multiple of the {workers} workers"
    return (
        f"--global-batch-size: {global_batch} is not a multiple of micro batch × "
        f"workers = {micro} × {workers} = {micro * workers}"
    )


def _micro_batch(text: str) -> int | None:
    if text == "auto":
        return None
    value = int(text) if text.isdigit() else 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'auto', got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    pos_int, pos_float = _positive(int), _positive(float)
    p = _Parser(
        prog="python -m training",
        description="Train a causal LM with PyTorch FSDP2 on Ray Train (local Ray by default).",
        allow_abbrev=False,
    )
    p.add_argument("--config", metavar="FILE", help="YAML or JSON file of options; flags override it")
    g = p.add_argument_group("run")
    add_run_arguments(g)  # --run-name, --resume, --job-id
    g.add_argument(
        "--storage-path",
        help="checkpoint storage: local dir or s3://bucket/prefix (default: OUTPUT_DIR/checkpoints)",
    )
    g.add_argument("--output-dir", help="where summary.json and the plot go (default: runs/RUN_NAME)")
    g.add_argument(
        "--num-workers",
        type=pos_int,
        help="training workers (default: the cluster's GPUs, or 2 CPU workers without GPUs)",
    )
    g.add_argument("--address", help="Ray cluster address ('auto' on the cluster); none = local Ray")
    g.add_argument(
        "--max-failures",
        type=_non_negative_int,
        default=3,
        help="worker-group restarts from the last checkpoint before giving up",
    )
    g.add_argument("--checkpoint-every", type=pos_int, default=50, metavar="STEPS")
    g.add_argument("--keep-checkpoints", type=int, default=2, help="checkpoints kept (>= 2)")
    g.add_argument("--log-every", type=pos_int, default=1, metavar="STEPS",
                   help="progress line on rank 0 every STEPS steps")  # fmt: skip
    g.add_argument(
        "--report-every",
        type=pos_int,
        default=10,
        metavar="STEPS",
        help="ray.train.report every STEPS steps (and at each checkpoint); every step "
        "is in summary.json. Each report waits for the Train controller's poll",
    )
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="Hugging Face id, local dir or s3:// prefix (weights with --init pretrained; "
        "tokenizer of real data: text unless --shape tiny, chat data always with its chat template)",
    )
    g.add_argument("--init", choices=("pretrained", "random"), default="pretrained")
    add_model_arguments(g, shapes=SHAPES)  # --shape, --planned-dims
    g.add_argument(
        "--sharding",
        choices=SHARDINGS,
        default="auto",
        help="full: FSDP over all ranks; hsdp: shard inside a node, replicate across "
        "nodes; auto: hsdp with more than one node of several GPUs each, else full",
    )
    g.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile each decoder layer (default: on for GPU workers)",
    )
    g.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=False)
    g.add_argument(
        "--liger",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Liger's fused linear cross-entropy, which never builds the [tokens, vocab] logits "
        "(needs liger-kernel; default: on for GPU workers where it is installed)",
    )
    g.add_argument(
        "--liger-layers",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --liger, also Liger's RMSNorm, RoPE and SwiGLU kernels inside the layers (default: "
        "only when the layers are not compiled: torch.compile fuses those itself and can recompute "
        "them in the backward instead of saving them, which Liger's opaque kernels prevent)",
    )
    g.add_argument(
        "--float8",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torchao float8 GEMMs (tensorwise scaling) for the linears with both dimensions >= 1024 "
        "(needs FP8 tensor cores: L4/L40S/H100/H200; default: on for compiled GPU workers that have "
        f"them at micro-batches of >= {FLOAT8_MIN_TOKENS} tokens, where torchao is installed)",
    )
    g.add_argument(
        "--float8-all-gather",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --float8, FSDP all-gathers those weights in float8 (half the traffic; scales "
        "precomputed after each optimizer step)",
    )
    g.add_argument(
        "--reshard-after-forward",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="free each layer's gathered parameters after its forward; --no-... keeps them for the "
        "backward and, when accumulating, until the step's last backward: one all-gather per layer "
        "per step instead of two per micro-batch, for 2 B x the layers' parameters (default: kept "
        f"on a GPU whose memory plan still leaves {AUTO_HEADROOM * 100:.0f}%% of it free with them, "
        "after the micro-batch is chosen; freed on CPU workers)",
    )
    g.add_argument(
        "--skip-guard-eval",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="after two training steps in a process, call the compiled layers without evaluating "
        "the guards that would pick another compiled graph (torch.compiler.set_stance("
        "skip_guard_eval_unsafe=True), inside the training micro-batches only): 8 %% less host "
        "time at 1 x 2048 on an H200 (BENCHMARKS.md). Default: on with compiled layers on text or "
        "random data, whose every micro-batch has one shape; off for chat data, whose attention "
        "mask differs between blocks",
    )
    g.add_argument(
        "--loss-chunk-tokens",
        type=_non_negative_int,
        default=None,
        metavar="TOKENS",
        help="with Liger's loss, at least this many tokens per chunk of logits (rounded up to a power "
        f"of two; 2 B x TOKENS x vocab of logits at once). Default: {LOSS_CHUNK_TOKENS} on GPUs of "
        f"{LARGE_GPU_GIB:.0f} GiB or more (1.29x faster at 1 x 2048 and 1.02x at 16 x 2048 on an H200, "
        f"BENCHMARKS.md), {SMALL_GPU_CHUNK_TOKENS} on smaller ones (L4); 0 = Liger's own chunks (~64 "
        "per micro-batch for a 152k vocabulary, each re-reading the lm_head weight)",
    )
    g = p.add_argument_group("data")
    g.add_argument(
        "--data",
        default="random",
        help="'random' token ids; prepared token shards (a folder or URI holding the manifest.json "
        "that python -m training.prepare writes); or a .jsonl/.parquet file or folder, local or "
        "s3://, which is prepared first into --prepared-data",
    )
    g.add_argument(
        "--prepared-data",
        metavar="LOCATION",
        help="where jsonl/parquet --data is tokenized to (local dir or s3://; default: "
        "STORAGE_PATH/_prepared/RUN_NAME); unchanged input is not prepared twice",
    )
    g.add_argument("--text-field", default="text", help="text column of the jsonl/parquet records")
    g.add_argument(
        "--max-skipped-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="with jsonl/parquet --data: share of records (0 <= F < 1) that may lack a string text "
        "field or be malformed, skipped and counted; default 0: the first one is an error naming "
        "its file and line",
    )
    g.add_argument("--seq-len", type=pos_int, help="tokens per sequence (default 2048; 256 for --shape tiny)")
    g.add_argument(
        "--global-batch-size",
        type=pos_int,
        help="sequences per optimizer step (default: micro batch × workers)",
    )
    g.add_argument(
        "--micro-batch-size",
        type=_micro_batch,
        default=1,
        metavar="N|auto",
        help="sequences per worker pass (default 1); auto (needs --global-batch-size): the largest that "
        "splits a worker's share of the step evenly and, by the memory plan, leaves "
        f"{AUTO_HEADROOM * 100:.0f}%% of its GPU free (else the largest that fits); CPU workers take "
        "their whole share at once",
    )
    _add_fine_tuning_arguments(g, p)
    g = p.add_argument_group("optimisation")
    g.add_argument("--steps", type=pos_int, default=100)
    g.add_argument("--lr", type=pos_float, default=1e-4)
    g.add_argument("--warmup-steps", type=_non_negative_int, help="default: 10%% of --steps")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--grad-clip", type=float, default=1.0, help="max grad norm; 0 = off")
    g.add_argument("--seed", type=_non_negative_int, default=0)
    g = p.add_argument_group("metrics and network")
    g.add_argument(
        "--expect-transport",
        choices=TRANSPORTS,
        default="auto",
        help="inter-node NCCL transport the job requires before training (auto: "
        "'any' on CPU or one node, else $RAYTRAIN_EXPECT_TRANSPORT or 'any')",
    )
    g.add_argument(
        "--emulate-hosts",
        type=pos_int,
        metavar="N",
        help="testing on one machine: split the workers into N hosts as NCCL sees them (one "
        "NCCL_HOSTID each), so NCCL uses its network transport between them and --sharding auto "
        "sees N nodes",
    )
    g.add_argument(
        "--profile",
        metavar="FIRST:LAST",
        help="record steps FIRST..LAST (1-based) with torch.profiler; rank 0 writes a Chrome trace "
        "and a per-kernel table to OUTPUT_DIR/profile",
    )
    g.add_argument(
        "--peak-tflops",
        type=pos_float,
        help="peak bf16 TFLOP/s per GPU for MFU when the GPU is not in the table",
    )
    g.add_argument(
        "--metrics-cluster",
        type=_cluster_name,
        metavar="NAME",
        help="on EKS: rank 0 writes each step's tokens/s, MFU, loss and step time (and the held-out "
        "loss, perplexity and accuracy on the steps that evaluate) as CloudWatch "
        "embedded-metric-format lines to its container's stdout, with dimension ClusterName=NAME",
    )
    return p


def _add_fine_tuning_arguments(g: Any, parser: argparse.ArgumentParser) -> None:
    """Chat data, held-out evaluation and the export (docs/fine-tuning.md); LoRA's own group."""
    add_lora_arguments(parser)
    pos_float = _positive(float)
    g.add_argument(
        "--data-format",
        choices=("auto", "text", "chat"),
        default="auto",
        help="text: --text-field of each record; chat: 'messages' (role/content turns) or "
        "'prompt'/'completion' records, rendered with --model's chat template, the loss only on the "
        "assistant's tokens (docs/fine-tuning.md); auto: by the first record, or the prepared data",
    )
    g.add_argument(
        "--too-long",
        choices=("drop", "truncate"),
        default="drop",
        help="chat data: a conversation longer than --seq-len is dropped or truncated (counted in "
        "the manifest and summary.json either way)",
    )
    g.add_argument(
        "--eval-data",
        metavar="DATA",
        help="held-out set, evaluated every --eval-every steps and at the end: prepared data or "
        "jsonl/parquet like --data (prepared the same way, beside --prepared-data)",
    )
    g.add_argument(
        "--eval-fraction",
        type=pos_float,
        metavar="F",
        help="instead of --eval-data: hold out the last F (0 < F < 1) of the training data's blocks",
    )
    g.add_argument(
        "--eval-every",
        type=_non_negative_int,
        default=0,
        metavar="STEPS",
        help="steps between evaluations (default 0: at every checkpoint); always at the end",
    )
    g.add_argument(
        "--early-stop-patience",
        type=_non_negative_int,
        default=0,
        metavar="N",
        help="stop (with a checkpoint) after N evaluations without a lower eval loss; 0 = never",
    )
    g.add_argument(
        "--export",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="at the end, write the final checkpoint as a Hugging Face folder (safetensors, config, "
        "tokenizer with its chat template) to STORAGE_PATH/RUN_NAME/model (python -m training.export)",
    )


def _cluster_name(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9-]{0,99}", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an EKS cluster name")
    return text


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
    _check_run(d)
    try:
        check_model_options(d)
    except ModelOptionError as exc:
        raise OptionError(str(exc)) from None
    manifest = _check_prepared(d)
    _check_training(d)
    if d["data"] != "random" and manifest is None:
        d["data_format"] = resolve_data_format(d["data_format"], check_data_path(d["data"]), d["text_field"])
    elif manifest is not None:
        from training.shards import CHAT_FORMAT

        prepared = "chat" if manifest["format"] == CHAT_FORMAT else "text"
        if d["data_format"] not in ("auto", prepared):
            raise OptionError(
                f"--data-format: {d['data']} holds prepared {prepared} data, not {d['data_format']}"
            )
        d["data_format"] = prepared
    else:
        d["data_format"] = "text"
    _check_eval(d)
    _check_lora(d)
    if d["skip_guard_eval"] and d["data_format"] == "chat":
        raise OptionError(
            "--skip-guard-eval: not with chat data (packed conversations give blocks different "
            "attention masks, which only the guards tell apart); drop it or use --no-skip-guard-eval"
        )
    chat_to_prepare = d["prepared_data"] is not None and d["data_format"] == "chat"
    if (
        d["init"] == "pretrained"
        or (d["prepared_data"] is not None and d["shape"] != "tiny")
        or chat_to_prepare
    ):
        _check_model_ref(d["model"], weights=d["init"] == "pretrained")
    return TrainOptions(**d)


def _check_run(d: dict[str, Any]) -> None:
    """Names and paths; fills in the defaults that depend on other options."""
    if not d["run_name"] or not re.fullmatch(r"[A-Za-z0-9][\w.-]*", d["run_name"]):
        raise OptionError(f"--run-name: use letters, digits, '-', '_', '.'; got {d['run_name']!r}")
    if d["keep_checkpoints"] < 2:
        raise OptionError(f"--keep-checkpoints: must be >= 2, got {d['keep_checkpoints']}")
    if d["output_dir"] is None:
        d["output_dir"] = os.path.join("runs", d["run_name"])
    if "://" in d["output_dir"]:
        raise OptionError(f"--output-dir: a local folder, got {d['output_dir']!r}")
    d["output_dir"] = location_option("--output-dir", d["output_dir"], output=True)
    if d["storage_path"] is None:
        d["storage_path"] = os.path.join(d["output_dir"], "checkpoints")
    # Ray Train's storage: S3 or a local folder (file:// would be a second spelling of the latter).
    d["storage_path"] = location_option("--storage-path", d["storage_path"], output=True, s3_only=True)


def _check_lora(d: dict[str, Any]) -> None:
    """LoRA's flags: valid values, a pretrained base, and the kernels LoRA runs with."""
    try:
        spec = lora_from_options(argparse.Namespace(**d))
    except LoraError as exc:
        raise OptionError(str(exc)) from None
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
    d["lora_targets"] = ",".join(spec.targets)


def _check_prepared(d: dict[str, Any]) -> dict[str, Any] | None:
    """--data naming prepared shards: their manifest sets the default --seq-len and must agree
    with an explicit one. Raw --data gets its --prepared-data location. Returns the manifest."""
    from training import shards

    if d["data"] == "random":
        if d["prepared_data"] is not None:
            raise OptionError("--prepared-data: only with jsonl/parquet --data, not 'random'")
        return None
    d["data"] = location_option("--data", d["data"])
    location = shards.manifest_location(d["data"])
    if location is None:
        if d["prepared_data"] is None:
            d["prepared_data"] = shards.join(d["storage_path"], "_prepared", d["run_name"])
        d["prepared_data"] = location_option("--prepared-data", d["prepared_data"], output=True)
        return None
    d["prepared_data"] = None  # already prepared: nothing to prepare (the chart always passes it)
    try:
        manifest = shards.read_manifest(location)
    except shards.ShardError as exc:
        raise OptionError(f"--data: {exc}") from None
    if d["seq_len"] is None:
        d["seq_len"] = int(manifest["seq_len"])
    elif d["seq_len"] != manifest["seq_len"]:
        raise OptionError(
            f"--seq-len: {d['seq_len']}, but {location} holds blocks of {manifest['seq_len']} tokens; "
            f"drop --seq-len or prepare the data again with --seq-len {d['seq_len']}"
        )
    return manifest


def _check_eval(d: dict[str, Any]) -> None:
    """--eval-data or --eval-fraction, on real data; raw --eval-data gets its preparation place."""
    from training import shards

    if d["eval_data"] and d["eval_fraction"]:
        raise OptionError("--eval-fraction: give either --eval-data or --eval-fraction, not both")
    if (d["eval_data"] or d["eval_fraction"]) and d["data"] == "random":
        raise OptionError("--eval-data/--eval-fraction: only with real --data, not 'random'")
    if d["eval_fraction"] is not None and not 0 < d["eval_fraction"] < 1:
        raise OptionError(f"--eval-fraction: must be between 0 and 1, got {d['eval_fraction']}")
    if (d["early_stop_patience"] or d["eval_every"]) and not (d["eval_data"] or d["eval_fraction"]):
        raise OptionError("--eval-every/--early-stop-patience: need --eval-data or --eval-fraction")
    if not d["eval_data"]:
        return
    d["eval_data"] = location_option("--eval-data", d["eval_data"])
    if shards.manifest_location(d["eval_data"]) is None:
        check_data_path(d["eval_data"], "--eval-data")
        d["eval_prepared"] = shards.join(d["storage_path"], "_prepared", d["run_name"] + "-eval")
    if not shards.is_remote(d["eval_data"]):
        d["eval_data"] = os.path.abspath(d["eval_data"])


def _check_training(d: dict[str, Any]) -> None:
    check_skipped_fraction(d["max_skipped_fraction"])
    if d["seq_len"] is None:
        d["seq_len"] = 256 if d["init"] == "random" and d["shape"] == "tiny" else 2048
    if d["warmup_steps"] is None:
        d["warmup_steps"] = d["steps"] // 10
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
    if d["profile"] is not None:
        d["profile"] = _check_profile(d["profile"], d["steps"])
    _check_packages(d)


def _check_packages(d: dict[str, Any]) -> None:
    """Options that need a package the image may lack: say so before any worker starts."""
    import importlib.util

    if d["float8_all_gather"] and not d["float8"]:
        raise OptionError(
            "--float8-all-gather: needs --float8, given explicitly (unset, float8 is decided per worker)"
        )
    needs = (("float8", "torchao", "torchao"), ("liger", "liger_kernel", "liger-kernel"))
    for flag, package, dist_name in needs:
        if d[flag] and importlib.util.find_spec(package) is None:
            raise OptionError(f"--{flag}: needs the {dist_name} package, which is not installed")


def _check_profile(text: str, steps: int) -> str:
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    first, last = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if not m or not 1 <= first <= last <= steps:
        raise OptionError(
            f"--profile: FIRST:LAST with 1 <= FIRST <= LAST <= --steps ({steps}), e.g. 4:6; got {text!r}"
        )
    return f"{first}:{last}"


def profile_range(text: str | None) -> tuple[int, int] | None:
    """The (first, last) steps of a checked --profile value."""
    if not text:
        return None
    first, last = text.split(":")
    return int(first), int(last)


def _check_model_ref(model: str, weights: bool = True) -> None:
    """`weights`: the model itself (config.json); else only its tokenizer is needed."""
    if "://" in model or ":" in model.split("/", 1)[0]:
        # A remote prefix: well formed here; its files are checked when the driver fetches its
        # config (check_model).
        location_option("--model", model)
        return
    if os.path.isdir(model):
        if not weights and (Path(model) / "tokenizer_config.json").is_file():
            return
        if not (Path(model) / "config.json").is_file():
            raise OptionError(f"--model: {model} has no config.json (not a Hugging Face model dir)")
        return
    if model.startswith((".", "/")) or not _HF_ID.match(model):
        raise OptionError(
            f"--model: {model!r} is neither an existing dir, an s3:// prefix nor a Hugging Face id"
        )


def check_skipped_fraction(value: float) -> float:
    if not 0 <= value < 1:
        raise OptionError(f"--max-skipped-fraction: a share of the records, 0 <= F < 1; got {value}")
    return value


def data_files(data: str) -> list[str]:
    """The jsonl/parquet files a --data value names, sorted (the order is part of the data order)."""
    return corpus_listing(data)[0]


def corpus_listing(data: str) -> tuple[list[str], list[str]]:
    """(the jsonl/parquet files under `data`, sorted; the other files there, which are not used).

    A folder that cannot be listed is an error, not a silent hole in the corpus (Path.rglob skips
    what it cannot read; os.walk reports it)."""
    if "://" in data:  # s3://, or any URI pyarrow reads (file:// in tests)
        import pyarrow.fs as pafs

        scheme = data.split("://", 1)[0]
        fs, root = pafs.FileSystem.from_uri(data)
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.File:
            paths = [root]
        elif info.type == pafs.FileType.Directory:
            sel = pafs.FileSelector(root, recursive=True)
            paths = [i.path for i in fs.get_file_info(sel) if i.type == pafs.FileType.File]
        else:
            raise OptionError(f"--data: {data} does not exist or cannot be read")
        uris = sorted(f"{scheme}://{p}" for p in paths)
        return _split_corpus(uris, single=info.type == pafs.FileType.File)
    path = Path(data)
    if path.is_file():
        return _split_corpus([str(path.resolve())], single=True)
    if path.is_dir():

        def refuse(exc: OSError) -> None:
            raise OptionError(f"--data: cannot read folder {exc.filename}: {exc.strerror}")

        found = []
        for folder, _, names in os.walk(path, onerror=refuse, followlinks=True):
            found += [str(Path(folder, n).resolve()) for n in names]
        return _split_corpus(sorted(found), single=False)
    raise OptionError(f"--data: {data} does not exist ('random', a file, a folder or s3://…)")


_COMPRESSED_DATA = re.compile(r"\.(jsonl|json|parquet)\.(gz|zst|zstd|bz2|xz|zip)$", re.IGNORECASE)


def _split_corpus(files: list[str], *, single: bool) -> tuple[list[str], list[str]]:
    from training.corpus import FORMATS

    for f in files:
        if _COMPRESSED_DATA.search(f):
            raise OptionError(f"--data: {f} is compressed; decompress it first (valid: {FORMATS})")
    if single:  # named on its own: whatever it is, it is meant as data
        if not files[0].endswith(DATA_SUFFIXES):
            name = files[0].rsplit("/", 1)[-1]
            kind = "." + name.rsplit(".", 1)[1] if "." in name else "no suffix"
            raise OptionError(f"--data: {files[0]} has {kind}, not a supported format (valid: {FORMATS})")
        return files, []
    used = [f for f in files if f.endswith(DATA_SUFFIXES)]
    return used, [f for f in files if not f.endswith(DATA_SUFFIXES)]


def check_data_path(data: str, option: str = "--data") -> list[str]:
    """The jsonl/parquet files of a data option (--data, --eval-data), or one line naming it."""
    try:
        files = data_files(data)
    except OptionError as exc:
        text = str(exc)
        raise OptionError(option + text[len("--data") :] if text.startswith("--data:") else text) from None
    except Exception as exc:
        raise OptionError(f"{option}: cannot read {data}: {exc}") from None
    if not files:
        raise OptionError(f"{option}: no {'/'.join(DATA_SUFFIXES)} files under {data}")
    for f in files:
        if "://" not in f and not os.access(f, os.R_OK):
            raise OptionError(f"{option}: {f} is not readable")
    if len({f.endswith(".parquet") for f in files}) > 1:
        raise OptionError(f"{option}: {data} mixes jsonl and parquet files; use one format")
    return files


def first_record_fields(files: str | list[str]) -> tuple[str, list[str]]:
    """The first non-empty file and its first record's keys (or the parquet schema's columns):
    only that record is read. A file that is not JSON lines or Parquet is named (training/corpus.py)."""
    from training.corpus import first_record_keys
    from training.errors import DataError

    candidates = [files] if isinstance(files, str) else files
    for first_file in candidates:
        try:
            names = first_record_keys(first_file)
        except DataError as exc:
            raise OptionError(f"--data: {exc}") from None
        except Exception as exc:
            raise OptionError(f"--data: cannot read {first_file}: {exc}") from None
        if names is None:  # empty: the next file has the first record
            continue
        return first_file, list(names)
    raise OptionError(
        f"--data: {candidates[0]} is empty" if len(candidates) == 1 else "--data: every file is empty"
    )


def check_text_field(files: str | list[str], field: str) -> None:
    """The first record of the first non-empty file has the text field."""
    first_file, names = first_record_fields(files)
    if field not in names:
        raise OptionError(
            f"--text-field: no field {field!r} in the first record of {first_file} (has {names})"
        )


def resolve_data_format(requested: str, files: str | list[str], text_field: str) -> str:
    """'text' or 'chat' for --data-format (auto: chat when the first record has chat fields and no
    --text-field), checking that the first record has the fields the format reads."""
    from training.sft import chat_fields

    first_file, names = first_record_fields(files)
    if requested == "auto":
        requested = "chat" if text_field not in names and chat_fields(names) else "text"
    if requested == "chat" and not chat_fields(names):
        raise OptionError(
            f"--data-format chat: no 'messages' field and no 'prompt' and 'completion' fields in "
            f"{first_file} (has {names})"
        )
    if requested == "text" and text_field not in names:
        raise OptionError(
            f"--text-field: no field {text_field!r} in the first record of {first_file} (has {names})"
        )
    return requested

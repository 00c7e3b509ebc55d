"""The data flags of `python -m training`: the training and held-out data (a location, prepared
shards or a jsonl/parquet corpus, its listing and text/chat format), the sequence and batch sizes,
and the fine-tuning flags of the "data" group (chat, evaluation, export; LoRA's own group)."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from training.methods.sft import DEFAULT_MAX_DROPPED
from training.model.lora_spec import add_arguments as add_lora_arguments
from training.options.types import OptionError, location_option, non_negative_int, positive
from training.sizing.memory_plan import AUTO_HEADROOM

DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
SAMPLE_DATA = Path(__file__).resolve().parents[1] / "data" / "sample" / "sample.jsonl"


def add_arguments(g: Any, parser: argparse.ArgumentParser) -> None:
    """The "data" group's flags, in their --help order (LoRA's group is added to `parser`)."""
    pos_int = positive(int)
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
    _add_fine_tuning_arguments(g, parser)


def _add_fine_tuning_arguments(g: Any, parser: argparse.ArgumentParser) -> None:
    """Chat data, held-out evaluation and the export (docs/fine-tuning.md); LoRA's own group."""
    add_lora_arguments(parser)
    pos_float = positive(float)
    g.add_argument(
        "--data-format",
        choices=("auto", "text", "chat"),
        default="auto",
        help="text: --text-field of each record; chat: 'messages' (role/content turns; ShareGPT "
        "'conversations' of from/value turns) or "
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
        "--max-dropped-fraction",
        type=_share,
        default=DEFAULT_MAX_DROPPED,
        metavar="F",
        help="chat data: the share of conversations (0 <= F <= 1) that may be dropped as longer than "
        "--seq-len before preparation stops, saying so (default %(default)s; 1: never)",
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
        type=non_negative_int,
        default=0,
        metavar="STEPS",
        help="steps between evaluations (default 0: at every checkpoint); always at the end",
    )
    g.add_argument(
        "--early-stop-patience",
        type=non_negative_int,
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


def check_prepared(d: dict[str, Any]) -> dict[str, Any] | None:
    """--data naming prepared shards: their manifest sets the default --seq-len and must agree
    with an explicit one. Raw --data gets its --prepared-data location. Returns the manifest."""
    from training.data import shards

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


def check_eval(d: dict[str, Any]) -> None:
    """--eval-data or --eval-fraction, on real data; raw --eval-data gets its preparation place."""
    from training.data import shards

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


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"a share, 0 <= F <= 1; got {text}")
    return value


_share.__name__ = "share"


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


# A shard of prepared data (training/data/shards.py: shards-<fingerprint16>/<n>.bin).
_SHARD_FILE = re.compile(r"(^|/)shards-[0-9a-f]{16}/\d+\.bin$")
_COMPRESSED_DATA = re.compile(r"\.(jsonl|json|parquet)\.(gz|zst|zstd|bz2|xz|zip)$", re.IGNORECASE)


def _split_corpus(files: list[str], *, single: bool) -> tuple[list[str], list[str]]:
    from training.data.corpus import FORMATS

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
        shard = next((f for f in corpus_listing(data)[1] if _SHARD_FILE.search(f)), None)
        if shard is not None:
            from training.data.shards import MANIFEST

            folder = shard.rsplit("/", 2)[-2]
            raise OptionError(
                f"{option}: {data} holds prepared shards ({folder}/) but no {MANIFEST}: their preparation "
                f"did not finish or the manifest was removed (it is written last); prepare the data "
                f"again into {data}, or give {option} the raw corpus"
            )
        raise OptionError(f"{option}: no {'/'.join(DATA_SUFFIXES)} files under {data}")
    for f in files:
        if "://" not in f and not os.access(f, os.R_OK):
            raise OptionError(f"{option}: {f} is not readable")
    if len({f.endswith(".parquet") for f in files}) > 1:
        raise OptionError(f"{option}: {data} mixes jsonl and parquet files; use one format")
    return files


def first_record_fields(files: str | list[str]) -> tuple[str, list[str]]:
    """The first non-empty file and its first record's keys (or the parquet schema's columns):
    only that record is read. A file that is not JSON lines or Parquet is named (training/data/corpus.py)."""
    from training.common.errors import DataError
    from training.data.corpus import first_record_keys

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
    from training.methods.sft import chat_fields

    first_file, names = first_record_fields(files)
    if requested == "auto":
        requested = "chat" if text_field not in names and chat_fields(names) else "text"
    if requested == "chat" and not chat_fields(names):
        raise OptionError(
            f"--data-format chat: no 'messages' (or ShareGPT 'conversations') field and no 'prompt' and "
            f"'completion' fields in "
            f"{first_file} (has {names})"
        )
    if requested == "text" and text_field not in names:
        raise OptionError(
            f"--text-field: no field {text_field!r} in the first record of {first_file} (has {names})"
        )
    return requested

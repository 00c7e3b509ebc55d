"""A Hugging Face model folder from a training checkpoint, loadable by transformers, vLLM or Ray Serve.

`python -m training.export --checkpoint URI --out URI` (local paths or s3://); the driver runs the
same function at the end of a run (--export, on by default), writing to STORAGE_PATH/RUN_NAME/model.

The folder: config.json, generation_config.json, the tokenizer with its chat template, and the
weights as safetensors files with model.safetensors.index.json, in bf16 (the dtype the loop
computes in) unless --dtype float32.

How: the checkpoint is the DCP sharded state of training (training/checkpoint/dcp.py: fp32 master
weights and the optimizer's moments, one file per rank). The export reads the DCP metadata, groups
the model's tensors into output files of at most --shard-mb, and for one output file at a time
loads just those tensors (dcp.load of a partial state dict: ranged reads of the byte ranges that
hold them, from S3 directly) and writes them with torch.distributed.checkpoint's
HuggingFaceStorageWriter (torch 2.13: safetensors files named model-0000i-of-0000N, DCP's own
planner). So the process never holds more than one output file of the model, on the CPU; no
GPU and no whole-model gather are involved, and the optimizer state is never read.

Nothing half-written: a local --out is assembled in a temp folder beside it and renamed into
place; on S3 the stale config.json (if any) is deleted first, the weights and tokenizer are put,
and model.safetensors.index.json then config.json are written last: a folder without config.json
is not a model to transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from typing import Any

from training.data import shards
from training.export.files import (
    INDEX_FILE,
    _config_and_tokenizer,
    _open_checkpoint,
    model_tensors,
    publish,
)
from training.options.types import OptionError, location_option

DTYPES = ("bfloat16", "float32")
# The end-of-run export runs in the Ray head pod (8 GiB by default, workload.head_memory_mib): a file's
# fp32 tensors as loaded plus its bf16 copy stay ~3 GiB at 1 GiB files.
DEFAULT_SHARD_MB = 1024


def plan_files(tensors: dict[str, Any], shard_bytes: int, itemsize: int) -> dict[str, int]:
    """{name: output file index, from 1}: names in order, a new file when the next would overflow."""
    mapping, index, size = {}, 1, 0
    for name, md in tensors.items():
        n = itemsize
        for d in md.size:
            n *= int(d)
        if size and size + n > shard_bytes:
            index, size = index + 1, 0
        mapping[name] = index
        size += n
    return mapping


def _write_weights(
    fs: Any, path: str, tensors: dict[str, Any], mapping: dict[str, int], *, dtype: Any, out: str
) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    from training.checkpoint.dcp import ArrowCheckpointReader

    weight_map: dict[str, str] = {}
    total = 0
    for index in sorted(set(mapping.values())):
        names = [n for n, i in mapping.items() if i == index]
        state = {n: torch.empty(tuple(tensors[n].size), dtype=tensors[n].properties.dtype) for n in names}
        dcp.load(
            {"model": state},
            storage_reader=ArrowCheckpointReader(fs, path),
            planner=DefaultLoadPlanner(allow_partial_load=True),  # these tensors, not the optimizer
        )
        # Tensor by tensor, freeing each fp32 master copy: the peak is one file's fp32 tensors.
        converted = {n: state.pop(n).to(dtype).contiguous() for n in names}
        part = os.path.join(out, f".part-{index}")
        dcp.save(converted, storage_writer=HuggingFaceStorageWriter(part, fqn_to_index_mapping=mapping))
        with open(os.path.join(part, INDEX_FILE)) as f:
            written = json.load(f)
        for file in set(written["weight_map"].values()):
            os.replace(os.path.join(part, file), os.path.join(out, file))
        weight_map.update(written["weight_map"])
        total += int(written["metadata"]["total_size"])
        shutil.rmtree(part)
        del converted
    with open(os.path.join(out, INDEX_FILE), "w") as f:
        json.dump(
            {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2
        )


def export(checkpoint: str, out: str, *, model: str | None = None, dtype: str = "bfloat16",
           shard_mb: float = DEFAULT_SHARD_MB, replace: bool = False, log: Any = print,
           merged: bool = False) -> str:  # fmt: skip
    """Write the Hugging Face folder of `checkpoint` to `out`; returns `out`. `replace`: a local
    `out` already there (an earlier end of the same run) is swapped for the new one. A LoRA
    checkpoint gives its adapter folder, or with `merged` the merged model (training/export/lora.py)."""
    import torch

    from training.checkpoint.dcp import read_state

    if dtype not in DTYPES:
        raise OptionError(f"--dtype: one of {', '.join(DTYPES)}, got {dtype!r}")
    fs, path = _open_checkpoint(checkpoint)
    try:
        state = read_state(fs, path)
    except (OSError, ValueError) as exc:
        raise OptionError(f"--checkpoint: {checkpoint}: cannot read its train_state.json: {exc}") from None
    if not shards.is_remote(out) and os.path.exists(out) and not replace:
        raise OptionError(f"--out: {out} exists; export to a new folder (nothing is overwritten locally)")
    from training.export.lora import checkpoint_lora, export_lora

    spec = checkpoint_lora(state)
    if spec is not None:
        return export_lora(checkpoint, out, state=state, spec=spec, model=model, merged=merged, dtype=dtype,
                           shard_mb=shard_mb, replace=replace, log=log)  # fmt: skip
    if merged:
        raise OptionError(
            f"--merged: {checkpoint} is a full fine-tune's checkpoint, not LoRA's: drop --merged"
        )
    tensors = model_tensors(fs, path)
    torch_dtype = getattr(torch, dtype)
    local_parent = os.path.dirname(os.path.abspath(out)) if not shards.is_remote(out) else None
    if local_parent is not None:
        os.makedirs(local_parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".export-", dir=local_parent)
    # mkdtemp makes its folder private (0700); the published model is read by serving containers
    # and other users, as a folder save_pretrained makes would be.
    os.chmod(work, 0o755)  # noqa: S103 (a model folder to be read, like save_pretrained's)
    try:
        cfg = _config_and_tokenizer(state, model, dtype, work)
        if getattr(cfg, "tie_word_embeddings", False):
            tensors.pop("lm_head.weight", None)  # one tensor with the embedding, as save_pretrained writes it
        mapping = plan_files(tensors, int(shard_mb * 2**20), torch.finfo(torch_dtype).bits // 8)
        log(f"[export] {len(tensors)} tensors in {max(mapping.values())} files ({dtype}) from {checkpoint} "
            f"(step {state['step']})")  # fmt: skip
        _write_weights(fs, path, tensors, mapping, dtype=torch_dtype, out=work)
        publish(work, out, replace=replace)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"[export] wrote {out}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m training.export",
        description="Write a Hugging Face model folder (safetensors, config, tokenizer with its chat "
        "template) from a training checkpoint, one output file in memory at a time.",
        allow_abbrev=False,
    )
    p.add_argument("--checkpoint", required=True, help="a checkpoint folder of the run (local or s3://)")
    p.add_argument("--out", required=True, help="the model folder to write (a new local dir, or s3://)")
    p.add_argument("--model", help="tokenizer and config source (default: the run's --model)")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    p.add_argument("--shard-mb", type=float, default=DEFAULT_SHARD_MB, help="largest safetensors file, MiB")
    p.add_argument(
        "--merged",
        action="store_true",
        help="a LoRA checkpoint: the base with the adapters merged in (default: the adapter folder)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if args.shard_mb <= 0:
            raise OptionError("--shard-mb: must be > 0")
        # The one URI rule of every location option (training/common/uri.py): typos and missing or
        # unwritable places are named before anything is read or written.
        checkpoint = location_option("--checkpoint", args.checkpoint)
        out = location_option("--out", args.out, output=True)
        export(
            checkpoint, out, model=args.model, dtype=args.dtype, shard_mb=args.shard_mb, merged=args.merged
        )
    except OptionError as exc:
        print(f"python -m training.export: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What both exports share (training/export/command.py, a full fine-tune's model folder, and
training/export/lora.py, a LoRA run's adapter or merged folder): the checkpoint opened and its model
tensors listed, the config, generation config and tokenizer written, and a finished folder published
with what makes it a model last."""

from __future__ import annotations

import os
import shutil
from typing import Any

from training.chat.stop_tokens import stop_token_ids
from training.data import shards
from training.options.types import OptionError

INDEX_FILE = "model.safetensors.index.json"
MODEL_PREFIX = "model."  # checkpoint.save stores {"model": state, "optim": ..., "train": ...}


def _open_checkpoint(uri: str) -> tuple[Any, str]:
    fs, path = shards.filesystem(uri)
    import pyarrow.fs as pafs

    if fs.get_file_info(f"{path.rstrip('/')}/.metadata").type != pafs.FileType.File:
        raise OptionError(f"--checkpoint: {uri} holds no DCP checkpoint (no .metadata)")
    return fs, path


def model_tensors(fs: Any, path: str) -> dict[str, Any]:
    """{HF name: DCP TensorStorageMetadata} of the checkpoint's model weights."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from training.checkpoint.dcp import ArrowCheckpointReader

    meta = ArrowCheckpointReader(fs, path).read_metadata()
    out = {}
    for key, md in meta.state_dict_metadata.items():
        if key.startswith(MODEL_PREFIX) and isinstance(md, TensorStorageMetadata):
            out[key[len(MODEL_PREFIX) :]] = md
    if not out:
        raise OptionError(f"--checkpoint: {path} holds no model weights")
    return out


def _config_and_tokenizer(state: dict[str, Any], model: str | None, dtype: str, out: str) -> Any:
    """config.json, generation_config.json and the tokenizer, into `out`; returns the config."""
    from transformers import AutoTokenizer

    from training.model.build import local_model_dir, model_config

    ref = state.get("model_ref") or {}
    model = model or ref.get("model")
    if not model:
        raise OptionError(
            "--model: the checkpoint does not name its model; give --model (HF id, dir or s3://)"
        )
    cfg = model_config(ref.get("init", "pretrained"), ref.get("shape", ""), model)
    tok_dir = local_model_dir(model, weights=False)
    try:
        tok = AutoTokenizer.from_pretrained(tok_dir)
    except Exception as exc:
        raise OptionError(f"--model: cannot load the tokenizer of {model!r}: {exc}") from None
    cfg.use_cache = True  # training turned it off; serving wants the KV cache
    from training.model.build import _dtype_kwarg

    setattr(cfg, _dtype_kwarg(), dtype)
    gen = stopping_generation_config(tok, tok_dir, cfg)
    _name_architecture(cfg)
    tok.save_pretrained(out)
    gen.save_pretrained(out)
    cfg.save_pretrained(out)  # written again last by publish(): only its presence makes a model
    return cfg


def stopping_generation_config(tok: Any, model_dir: str, cfg: Any) -> Any:
    """The model's generation config (its generation_config.json, else one from its config) with
    eos_token_id every token that ends a turn or a text (training/chat/stop_tokens.py), the
    template's end of turn first, and a pad token where the tokenizer has one."""
    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(model_dir)
    except Exception:  # a random-init shape, or a model folder without one
        gen = GenerationConfig.from_model_config(cfg)
    stops = stop_token_ids(tok, gen.eos_token_id, getattr(cfg, "eos_token_id", None))
    gen.eos_token_id = stops[0] if len(stops) == 1 else (stops or None)
    if gen.pad_token_id is None and tok.pad_token_id is not None:
        gen.pad_token_id = tok.pad_token_id
    return gen


def _name_architecture(cfg: Any) -> None:
    """config.json's `architectures`, which vLLM reads to pick the model class: a random-init
    shape's config has none (transformers' causal-LM class of its model_type, then)."""
    if not getattr(cfg, "architectures", None):
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        cfg.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[cfg.model_type]]


def publish(folder: str, out: str, replace: bool = False) -> None:
    """Move a complete local folder to `out`; config.json (what makes it a model) appears last."""
    if not shards.is_remote(out):
        old = f"{out}.old-{os.getpid()}"
        if replace and os.path.exists(out):
            os.rename(out, old)
        os.rename(folder, out)  # same parent folder: atomic
        shutil.rmtree(old, ignore_errors=True)
        os.makedirs(folder)  # the caller's cleanup expects it
        return
    import pyarrow.fs as pafs

    fs, root = shards.filesystem(out)
    fs.create_dir(root, recursive=True)
    if fs.get_file_info(f"{root}/config.json").type == pafs.FileType.File:
        fs.delete_file(f"{root}/config.json")  # an older export there: not a model until done
    names = sorted(os.listdir(folder))
    last = [INDEX_FILE, "config.json", "adapter_config.json"]  # what makes a model, last
    for name in [n for n in names if n not in last] + [n for n in last if n in names]:
        pafs.copy_files(os.path.join(folder, name), f"{root}/{name}", destination_filesystem=fs)

"""A LoRA run's exports: its adapter as `peft` writes one, and on request the merged model.

`python -m training.export --checkpoint URI --out URI` on a LoRA run's checkpoint writes the adapter
folder; with `--merged`, the base with the adapters merged in, as a full Hugging Face folder. The
driver writes STORAGE_PATH/RUN_NAME/adapter at the end of a LoRA run, and RUN_NAME/model too with
--export-merged.

The adapter folder is what `peft`'s `save_pretrained` writes (peft/peft_model.py, save_pretrained;
peft/utils/save_and_load.py, get_peft_model_state_dict): adapter_config.json (LoraConfig's fields,
`base_model_name_or_path` the run's --model) and adapter_model.safetensors with the adapter name
removed from each key (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`), plus the
tokenizer with its chat template, as trainers save beside an adapter, and generation_config.json
with every token that ends the template's turns (`_serving_files` says who reads which).
`PeftModel.from_pretrained`,
vLLM's `--lora-modules` and Ray Serve LLM's LoRA loader read that layout. The adapters are written
in fp32, the precision they were trained in (a few tens of MB).

The merged folder: each adapted linear's weight becomes W + (alpha / r) B A (computed in fp32,
written in --dtype), every other tensor is the base's own. The base's safetensors files are read
tensor by tensor (safetensors' safe_open) and written in output files of at most --shard-mb, so the
process holds about one output file: the end-of-run export runs in the Ray head pod.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

from training.data import shards
from training.model.lora_spec import LoraSpec
from training.options.types import OptionError

INDEX_FILE = "model.safetensors.index.json"


def checkpoint_lora(state: dict[str, Any]) -> LoraSpec | None:
    """The LoRA spec a checkpoint's train_state.json records (None: a full fine-tune)."""
    spec = (state.get("model_ref") or {}).get("lora")
    if not spec:
        return None
    return LoraSpec(int(spec["rank"]), int(spec["alpha"]), float(spec["dropout"]), tuple(spec["targets"]))


def adapter_tensors(fs: Any, path: str, tensors: dict[str, Any]) -> dict[str, Any]:
    """{loop name: fp32 tensor} of every adapter tensor in the checkpoint (all of its model
    tensors: a LoRA checkpoint holds nothing else of the model)."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    from training.checkpoint.dcp import ArrowCheckpointReader

    state = {n: torch.empty(tuple(md.size), dtype=md.properties.dtype) for n, md in tensors.items()}
    dcp.load(
        {"model": state},
        storage_reader=ArrowCheckpointReader(fs, path),
        planner=DefaultLoadPlanner(allow_partial_load=True),  # the model's tensors, not the optimizer's
    )
    return {n: t.float() for n, t in state.items()}


def write_adapter(work: str, spec: LoraSpec, adapters: dict[str, Any], model: str) -> None:
    """adapter_config.json and adapter_model.safetensors into `work`."""
    from safetensors.torch import save_file

    from training.model.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_key, peft_config

    keyed = {}
    for name, tensor in adapters.items():
        key = adapter_key(name)
        if key is None:
            raise OptionError(
                f"--checkpoint: {name} is not a LoRA tensor: the checkpoint mixes a full fine-tune in"
            )
        keyed[key] = tensor.contiguous()
    save_file(keyed, os.path.join(work, ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = peft_config(spec, base_model=model).to_dict()
    config["target_modules"] = sorted(spec.targets)  # JSON holds a list, as peft writes a set
    config["peft_type"] = "LORA"
    config["task_type"] = "CAUSAL_LM"
    with open(os.path.join(work, ADAPTER_CONFIG), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True, default=str)


def check_adapters_fit(adapters: dict[str, Any], model: str) -> None:
    """Refuse an adapter folder for a base whose layers have other shapes than the adapters':
    PeftModel.from_pretrained would fail on it with a size mismatch. A base whose dimensions
    training/model/dims.py cannot read is not checked."""
    from transformers import AutoConfig

    from training.model.build import local_model_dir
    from training.model.dims import ArchitectureError, Dims

    try:
        cfg = AutoConfig.from_pretrained(local_model_dir(model, weights=False))
    except Exception as exc:
        raise OptionError(f"--model: cannot load the config of {model!r}: {exc}") from None
    try:
        dims = Dims.from_config(cfg.to_dict())
    except ArchitectureError:
        return
    shapes = dims.linear_shapes()
    for name, tensor in adapters.items():
        parts = name.split(".")
        at = next((i for i, p in enumerate(parts) if p.startswith("lora_")), None)
        if at is None or "layers" not in parts or parts[at - 1] not in shapes:
            continue
        layer, target = int(parts[parts.index("layers") + 1]), parts[at - 1]
        size_in, size_out = shapes[target]
        shape = tuple(tensor.shape)
        want = (shape[0], size_in) if parts[at] == "lora_A" else (size_out, shape[1])
        if layer >= dims.layers or shape != want:
            raise OptionError(
                f"--model: {model} is not the base these adapters were trained on ({name} is "
                f"{list(shape)}; its {target} is {size_in} -> {size_out} in {dims.layers} layers): "
                "export onto the base the run trained on"
            )


def _serving_files(model: str, out: str) -> list[int]:
    """The tokenizer and generation_config.json beside the adapter, so that it stops at the chat
    template's end of turn when served; returns the stop ids written.

    A base release names <|endoftext|> (Qwen2.5-*B, Qwen3-*-Base) or <|end_of_text|> (Llama 3.x)
    as its EOS, while the template ends every trained answer with <|im_end|> / <|eot_id|>; nothing
    of the adapter changes what the base's own files say. What reads what (docs/fine-tuning.md,
    "Serving a LoRA adapter"):
    - transformers and peft stop at the loaded model's generation_config.eos_token_id, the base's
      (transformers/generation/utils.py adjust_generation_fn reads the base's folder, also when
      AutoModelForCausalLM.from_pretrained is given the adapter folder: integrations/peft.py
      maybe_load_adapters swaps in base_model_name_or_path; peft's PeftModel.generate keeps the
      base's generation_config). The folder's generation_config.json is what to pass them:
      `generate(..., generation_config=GenerationConfig.from_pretrained(ADAPTER))`.
    - vLLM stops at its tokenizer's eos_token_id plus the generation config's eos_token_id
      (SamplingParams.update_from_generation_config). Earlier releases took a LoRA request's EOS from
      the adapter's own tokenizer (InputPreprocessor.get_eos_token_id(lora_request)); V1 uses the
      base's and tells users to give `--tokenizer ADAPTER` (v1/engine/input_processor.py,
      _validate_lora).
      `--generation-config ADAPTER` loads this generation_config.json.
    So the tokenizer written here names the end-of-turn token its EOS, as the families' instruct
    releases do (Qwen2.5-*-Instruct: <|im_end|>; Llama-3.1-*-Instruct: <|eot_id|>), and the
    generation config lists it first with the base's own EOS ids."""
    from transformers import AutoConfig, AutoTokenizer

    from training.chat.stop_tokens import end_of_turn_ids
    from training.export.files import stopping_generation_config
    from training.model.build import local_model_dir

    base_dir = local_model_dir(model, weights=False)
    try:
        tok = AutoTokenizer.from_pretrained(base_dir)
    except Exception as exc:
        raise OptionError(f"--model: cannot load the tokenizer of {model!r}: {exc}") from None
    try:
        cfg = AutoConfig.from_pretrained(base_dir)
    except Exception as exc:
        raise OptionError(f"--model: cannot load the config of {model!r}: {exc}") from None
    gen = stopping_generation_config(tok, base_dir, cfg)
    ends = end_of_turn_ids(tok)
    if ends:
        tok.eos_token = tok.convert_ids_to_tokens(ends[0])
    tok.save_pretrained(out)
    gen.save_pretrained(out)
    stops = gen.eos_token_id
    return [stops] if isinstance(stops, int) else list(stops or [])


def base_weights_dir(model: str) -> str:
    """A local folder with the base's safetensors files (and their index): `model` itself when it is
    a folder, its copy when it is s3:// (training/model/build.py local_model_dir), and for a Hugging
    Face Hub id the snapshot in the Hub cache that from_pretrained fills and reads
    (huggingface_hub's snapshot_download: the same cache, HF_TOKEN and HF_HUB_OFFLINE; only the
    weight files are fetched, once)."""
    from training.model.build import local_model_dir

    if "://" in model or os.path.isdir(model):
        return local_model_dir(model, weights=True)
    from huggingface_hub import snapshot_download

    try:
        return str(snapshot_download(model, allow_patterns=["*.safetensors", INDEX_FILE]))
    except Exception as exc:
        raise OptionError(
            f"--model: cannot fetch the weights of {model!r} from the Hugging Face Hub to merge into "
            f"({' '.join(str(exc).split())[:300]}); give --model a local folder or s3:// copy of the base"
        ) from None


def base_weight_files(base_dir: str) -> list[str]:
    """The base model's safetensors files, in its index's order (one file: model.safetensors)."""
    index = os.path.join(base_dir, INDEX_FILE)
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(base_dir, name) for name in files]
    single = os.path.join(base_dir, "model.safetensors")
    if not os.path.exists(single):
        raise OptionError(
            f"--model: {base_dir} has no safetensors weights (model.safetensors or {INDEX_FILE}), "
            "which the merge reads; give a base saved as safetensors (save_pretrained writes them)"
        )
    return [single]


def merged_deltas(spec: LoraSpec, adapters: dict[str, Any]) -> dict[str, Any]:
    """{base weight name: (alpha / r) B A} for every adapted linear, in fp32."""
    a_suffix, b_suffix = ".lora_A.default.weight", ".lora_B.default.weight"
    deltas = {}
    for name, a in adapters.items():
        if not name.endswith(a_suffix):
            continue
        module = name[: -len(a_suffix)]
        b = adapters.get(module + b_suffix)
        if b is None:
            raise OptionError(f"--checkpoint: {module} has lora_A but no lora_B")
        deltas[module + ".weight"] = spec.scaling * (b.float() @ a.float())
    return deltas


def write_merged(work: str, base_dir: str, deltas: dict[str, Any], *, dtype: Any, shard_bytes: int) -> int:
    """The base's tensors with the deltas added, as safetensors files of at most `shard_bytes`
    with their index; returns the tensors written. Every delta must find its base weight."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    files = base_weight_files(base_dir)
    sizes: dict[str, int] = {}
    itemsize = dtype.itemsize
    for path in files:
        with safe_open(path, "pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                shape = [int(d) for d in f.get_slice(key).get_shape()]
                if key in deltas and list(deltas[key].shape) != shape:
                    raise OptionError(
                        f"--model: {base_dir}'s {key} is {shape}, the adapter was trained on "
                        f"{list(deltas[key].shape)}: merge onto the base the run trained on"
                    )
                n = 1
                for d in shape:
                    n *= d
                sizes[key] = n * itemsize
    missing = sorted(set(deltas) - set(sizes))
    if missing:
        raise OptionError(
            f"--model: {base_dir} lacks {missing[0]} (and {len(missing) - 1} more) that the adapter "
            "adapts: merge onto the base the run trained on"
        )
    plan, index, size = {}, 1, 0
    for key, n in sizes.items():
        if size and size + n > shard_bytes:
            index, size = index + 1, 0
        plan[key] = index
        size += n
    total = max(plan.values())
    names = {i: f"model-{i:05d}-of-{total:05d}.safetensors" for i in range(1, total + 1)}
    if total == 1:
        names = {1: "model.safetensors"}
    bucket: dict[str, Any] = {}
    current = 1
    for path in files:
        with safe_open(path, "pt") as f:
            for key in f.keys():  # noqa: SIM118
                if plan[key] != current:
                    save_file(bucket, os.path.join(work, names[current]), metadata={"format": "pt"})
                    bucket, current = {}, plan[key]
                tensor = f.get_tensor(key)
                if key in deltas:
                    tensor = tensor.float() + deltas[key]
                bucket[key] = tensor.to(dtype).contiguous()
    save_file(bucket, os.path.join(work, names[current]), metadata={"format": "pt"})
    with open(os.path.join(work, INDEX_FILE), "w") as f:
        weight_map = {k: names[i] for k, i in sorted(plan.items())}
        json.dump({"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}, f, indent=2)
    return len(plan)


def export_lora(
    checkpoint: str,
    out: str,
    *,
    state: dict[str, Any],
    spec: LoraSpec,
    model: str | None = None,
    merged: bool = False,
    dtype: str = "bfloat16",
    shard_mb: float = 1024,
    replace: bool = False,
    log: Any = print,
) -> str:
    """The adapter folder (or with `merged`, the merged model folder) of a LoRA checkpoint at `out`."""
    import torch

    from training.export.files import _config_and_tokenizer, _open_checkpoint, model_tensors, publish

    model = model or (state.get("model_ref") or {}).get("model")
    if not model:
        raise OptionError(
            "--model: the checkpoint does not name its base model; give --model (HF id, dir or s3://)"
        )
    fs, path = _open_checkpoint(checkpoint)
    adapters = adapter_tensors(fs, path, model_tensors(fs, path))
    local_parent = os.path.dirname(os.path.abspath(out)) if not shards.is_remote(out) else None
    if local_parent is not None:
        os.makedirs(local_parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".export-", dir=local_parent)
    os.chmod(work, 0o755)  # noqa: S103 (a folder to be read by serving containers)
    try:
        if merged:
            base_dir = base_weights_dir(model)
            deltas = merged_deltas(spec, adapters)
            ref = {**state.get("model_ref", {}), "init": "pretrained"}  # the base's own config
            _config_and_tokenizer({**state, "model_ref": ref}, model, dtype, work)
            n = write_merged(
                work, base_dir, deltas, dtype=getattr(torch, dtype), shard_bytes=int(shard_mb * 2**20)
            )
            log(f"[export] {n} tensors of {model}, {len(deltas)} merged with LoRA ({dtype}): {checkpoint}")
        else:
            check_adapters_fit(adapters, model)
            write_adapter(work, spec, adapters, model)
            stops = _serving_files(model, work)
            log(f"[export] LoRA adapter (r={spec.rank}, {len(adapters)} tensors, base {model}, stops at "
                f"ids {stops}), {checkpoint}")  # fmt: skip
        publish(work, out, replace=replace)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"[export] wrote {out}")
    return out

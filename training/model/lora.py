"""LoRA adapters on a Hugging Face decoder with `peft`, trained under FSDP2.

The settings live in training/model/lora_spec.py (torch-free: the memory plan and the settings read them).
Here: the adapters are injected into the model in place (`peft.inject_adapter_in_model`: the model
keeps its class, its `model.layers` and its config, so Liger, torch.compile per layer and the FSDP2
plan apply unchanged), the base is frozen in bf16 (no fp32 master copy: it never changes) and the
adapters A and B are fp32 masters, as every trained parameter is under the loop's mixed precision
(FSDP2 casts them to bf16 for compute and reduces their gradients in fp32).

FSDP2 allows frozen and trained parameters of different dtypes in one unit: only the trained ones
must share a dtype (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, `_init_mp_dtypes`:
"FSDP expects uniform original parameter dtype" is checked over the parameters that require grad);
with `param_dtype=bfloat16` every parameter is gathered in bf16.

Names: peft keeps each adapted linear as `<name>.base_layer` and adds `<name>.lora_A.default` /
`<name>.lora_B.default`. `adapter_state_dict` maps the trained tensors to the keys peft's
`save_pretrained` writes (`base_model.model.<module>.lora_A.weight`), the format
`PeftModel.from_pretrained`, vLLM and Ray Serve LLM load.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from training.common.errors import InputError
from training.model.lora_spec import LoraSpec

ADAPTER_NAME = "default"
# An embedding row that training never touched, by the field's test (Unsloth's and axolotl's
# fix_untrained_tokens: the row's largest value <= 1e-16; "1e-23 for bfloat16"). Llama 3 base
# releases ship their chat tokens so (<|eot_id|>, the header tokens): meta-pytorch/torchtune#2429,
# unslothai/unsloth#915.
UNTRAINED_MAX = 1e-16
# peft's own file names (peft.utils.constants: CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME).
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def layer_linear_names(model: nn.Module) -> set[str]:
    """The names of the nn.Linear modules inside the decoder layers (q_proj, ..., down_proj):
    what `target_modules` may name."""
    from training.model.build import decoder_layers

    names: set[str] = set()
    for layer in decoder_layers(model):
        for name, module in layer.named_modules():
            if isinstance(module, nn.Linear) and name:
                names.add(name.rsplit(".", 1)[-1])
    return names


def peft_config(spec: LoraSpec, base_model: str | None = None) -> Any:
    """peft's LoraConfig for `spec`. peft matches a name in target_modules against the end of each
    module's name; the decoder layers' linears (q_proj ... down_proj) have no namesake outside the
    layers in the supported text decoders (lm_head, embed_tokens, norm are named otherwise)."""
    from peft import LoraConfig

    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=list(spec.targets),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model,
    )


def apply_lora(model: nn.Module, spec: LoraSpec, *, base_model: str | None = None) -> nn.Module:
    """Freeze `model` in bf16 and inject fp32 LoRA adapters (in place; returns `model`).
    A target the decoder layers lack is refused naming it (InputError: every attempt would fail)."""
    from peft import inject_adapter_in_model

    available = layer_linear_names(model)
    unknown = spec.unknown_targets(available)
    if unknown:
        raise InputError(
            f"--lora-targets: {', '.join(unknown)} not in the model's decoder layers "
            f"({type(model).__name__}); its linear layers are {', '.join(sorted(available))}"
        )
    model.requires_grad_(False)
    model.to(torch.bfloat16)
    inject_adapter_in_model(peft_config(spec, base_model), model, adapter_name=ADAPTER_NAME)
    for name, param in model.named_parameters():
        if ".lora_" in name:
            param.data = param.data.float()
            param.requires_grad_(True)
        else:
            param.requires_grad_(False)
    return model


def untrained_tokens(model: nn.Module, token_ids: list[int]) -> list[int]:
    """The ids among `token_ids` whose input-embedding row, or output-layer row, is untrained
    (UNTRAINED_MAX). The output row decides whether the model can emit the token at all: an untied
    model (Llama 3.1/3.2 base, Qwen2.5-7B and larger, Mistral, Qwen3-8B and larger) has one of its own,
    which LoRA trains no more than the embedding (Unsloth's fix_untrained_tokens reads both)."""
    rows: list[Any] = [model.get_input_embeddings().weight]  # type: ignore[operator]
    head = model.get_output_embeddings()  # type: ignore[operator]
    if head is not None and head.weight is not rows[0]:
        rows.append(head.weight)
    return [t for t in token_ids if any(float(w[t].detach().max()) <= UNTRAINED_MAX for w in rows)]


def check_end_of_turn_trained(model: nn.Module, tokenizer: Any, model_name: str) -> None:
    """Refuse LoRA on chat data when a token that ends the answers has an untrained embedding or
    output row: the adapters train neither, so the model could never learn to end its answers (BENCHMARKS.md,
    "A LoRA fine-tune that learns": a LoRA run whose answers need untrained rows does not learn)."""
    from training.chat.stop_tokens import end_of_turn_ids

    bad = untrained_tokens(model, end_of_turn_ids(tokenizer))
    if bad:
        names = ", ".join(repr(tokenizer.convert_ids_to_tokens(t)) for t in bad)
        raise InputError(
            f"--model: {model_name}'s embedding or output row of {names}, which ends every answer of its "
            f"template, is untrained (all values <= {UNTRAINED_MAX:g}, as base releases ship their chat "
            "tokens): LoRA trains no embedding, so the model would never learn to stop; LoRA-tune the "
            "instruct release of this model, or fine-tune it fully (no --lora-rank)"
        )


def adapter_key(name: str) -> str | None:
    """The key peft's save_pretrained gives a trained tensor (None: not an adapter tensor).
    `model.layers.0.self_attn.q_proj.lora_A.default.weight` ->
    `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`."""
    if ".lora_" not in name:
        return None
    return "base_model.model." + name.replace(f".{ADAPTER_NAME}.", ".")

"""Model construction and the FSDP2 sharding plan."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

# The shape table and the mesh rule live in torch-free modules: the memory plan, which synthesis
# imports, sizes the same shapes over the same shard groups.
from training.common.hub_token import ensure_hf_token
from training.model.precision import FLOAT8_MIN_CAPABILITY
from training.model.shapes import SHAPES
from training.model.sharding import mesh_shape


def shape_config(shape: str | dict[str, Any]) -> Any:
    """The config `--init random` builds: a catalogue entry's published fields (or a test shape's, or
    the fields given) in the config class of its model_type (Qwen2Config, LlamaConfig, Gemma2Config)."""
    from transformers import AutoConfig

    fields = dict(SHAPES[shape] if isinstance(shape, str) else shape)
    return AutoConfig.for_model(fields.pop("model_type"), **fields, use_cache=False)


def fetch_s3_dir(uri: str, dest: str, weights: bool = True) -> str:
    """Copy a model prefix (s3://, any pyarrow URI) to a local dir, optionally without weights."""
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(uri)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    os.makedirs(dest, exist_ok=True)
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        rel = os.path.relpath(info.path, root)
        if not weights and rel.endswith((".safetensors", ".bin", ".pt", ".pth")):
            continue
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        pafs.copy_files(info.path, target, source_filesystem=fs)
    return dest


def local_model_dir(model: str, weights: bool) -> str:
    """A path or id that from_pretrained accepts. An s3:// prefix is copied once per node: the ranks
    of a node share one folder (a file lock makes the others wait for the first copy). A hub id
    gets the job's token first, where the job names one (training/common/hub_token.py)."""
    if "://" not in model:
        if not os.path.isdir(model):
            ensure_hf_token()
        return model
    import fcntl
    import hashlib

    key = hashlib.sha256(f"{model}|{weights}".encode()).hexdigest()[:16]
    dest = os.path.join(tempfile.gettempdir(), f"raytrain-model-{key}")
    done = os.path.join(dest, ".complete")
    with open(dest + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(done):
            fetch_s3_dir(model, dest, weights=weights)
            Path(done).touch()
    return dest


def model_config(init: str, shape: str, model: str) -> Any:
    """The model's config (random init: the named shape; pretrained: the model's own config)."""
    if init == "random":
        return shape_config(shape)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(local_model_dir(model, weights=False))


def attention_implementation(config: Any) -> str:
    """PyTorch's SDPA kernels, except for a model that soft-caps its attention logits (Gemma 2:
    `attn_logit_softcapping`): SDPA has no soft-cap, so transformers 5.13 (the image) computed Gemma 2's
    attention without it under sdpa, and 5.24 refuses sdpa for it (models/gemma2/modeling_gemma2.py:
    `_supports_sdpa = False  # sdpa does not support softcapping`; integrations/sdpa_attention.py:
    "`sdpa` attention does not support `softcap`"). Eager attention applies it on every release
    (modeling_gemma2.py eager_attention_forward: `attn_weights = attn_weights / softcap`, tanh,
    `* softcap`) and is what transformers and Liger advise for training Gemma 2 (Liger's gemma2
    lce_forward warns under any other). flex_attention applies it too (integrations/flex_attention.py
    score_mod), but needs its own compiled kernel inside the per-layer compiled graphs; eager builds the
    [heads, seq, seq] scores, which per-layer compile fuses with the soft-cap and softmax."""
    return "eager" if getattr(config, "attn_logit_softcapping", None) else "sdpa"


def _dtype_kwarg() -> str:
    # transformers renamed torch_dtype to dtype in 4.56; the DLC may ship an older release.
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def build_model(
    init: str, shape: str | dict[str, Any], model: str, seed: int, dtype: torch.dtype = torch.float32
) -> nn.Module:
    """The model on the CPU (FSDP2 moves each rank's shard to its device): fp32, the master weights
    of a full fine-tune; bf16 for LoRA's frozen base."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    if init == "random":
        config = shape_config(shape)
        kwargs = {_dtype_kwarg(): dtype, "attn_implementation": attention_implementation(config)}
        m = AutoModelForCausalLM.from_config(config, **kwargs)
    else:
        from transformers import AutoConfig

        path = local_model_dir(model, weights=True)
        config = AutoConfig.from_pretrained(path)
        kwargs = {_dtype_kwarg(): dtype, "attn_implementation": attention_implementation(config)}
        m = AutoModelForCausalLM.from_pretrained(path, config=config, **kwargs)
    m.config.use_cache = False
    return m


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no model.layers: not a supported decoder")
    return layers


def sharding_plan(model: nn.Module) -> list[tuple[str, list[str]]]:
    """FSDP units in the order fully_shard is applied: one per decoder layer, then the root.

    Each unit lists the parameter names it owns. The root owns everything outside the layers, so
    the embedding and a tied lm_head (one tensor) land in one unit and are gathered once.
    """
    layers = decoder_layers(model)
    units: list[tuple[str, list[str]]] = []
    in_layers: set[int] = set()
    for i, layer in enumerate(layers):
        names = [f"model.layers.{i}.{n}" for n, _ in layer.named_parameters()]
        units.append((f"model.layers.{i}", names))
        in_layers.update(id(p) for p in layer.parameters())
    root = [n for n, p in model.named_parameters() if id(p) not in in_layers]
    units.append(("", root))
    return units


def host_layout(keys: list[str]) -> tuple[int, int | None]:
    """(hosts, ranks per host) from each rank's host key, in rank order. Ranks per host is None
    when hosts hold different numbers of ranks or a host's ranks are not contiguous: an HSDP mesh
    of (hosts, ranks per host) would then put ranks of different hosts in one shard group."""
    hosts: list[str] = []
    for key in keys:
        if not hosts or hosts[-1] != key:
            hosts.append(key)
    distinct = len(set(keys))
    if len(hosts) != distinct or len(keys) % distinct:
        return distinct, None
    per_host = len(keys) // distinct
    if any(keys.count(h) != per_host for h in hosts):
        return distinct, None
    return distinct, per_host


def make_mesh(device_type: str, sharding: str, world: int, local_world: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    shape = mesh_shape(sharding, world, local_world)
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


def recompute_materialized_pointwise() -> None:
    """Let the compiled layers' backward recompute pointwise results it has to materialize.

    By default inductor's partitioner saves any pointwise output the backward needs in memory, and
    the SwiGLU product silu(gate) * up feeds down_proj's weight gradient, so each layer kept it
    beside gate and up: three [tokens, 8960] tensors. Recomputing it from gate and up is one fused
    elementwise pass in the backward and drops about a third of the saved activations (Qwen2.5-1.5B
    at batch 8 on an H200: peak 50.2 -> 40.5 GiB at the same step time, BENCHMARKS.md).
    Process-wide, so set once, before the first compile.
    """
    import torch._functorch.config as functorch_config

    if hasattr(functorch_config, "ban_recompute_materialized_backward"):
        functorch_config.ban_recompute_materialized_backward = False


# float8 GEMMs (e4m3 with tensorwise scales) only pay where both dimensions are large: on the H200 at
# this model's shapes (16,384 tokens) they ran 1.53-1.70x bf16, except k/v projections (N = 256) at
# 0.78x. lm_head stays bf16 too: the fused loss reads its weight directly, not through nn.Linear.
FLOAT8_MIN_DIM = 1024


def float8_filter(module: nn.Module, fqn: str) -> bool:
    """Which nn.Linear layers run their GEMMs in float8."""
    if fqn.endswith("lm_head") or not isinstance(module, nn.Linear):
        return False
    return min(module.in_features, module.out_features) >= FLOAT8_MIN_DIM and (
        module.in_features % 16 == 0 and module.out_features % 16 == 0  # _scaled_mm's alignment
    )


def check_float8_device(capability: tuple[int, int] | None, name: str) -> None:
    """--float8 needs FP8 tensor cores; say which GPUs have them instead of failing in a kernel."""
    if capability is None or capability < FLOAT8_MIN_CAPABILITY:
        have = (
            "no GPU" if capability is None else f"{name} (compute capability {capability[0]}.{capability[1]})"
        )
        raise ValueError(
            f"--float8: float8 matmuls need FP8 tensor cores (compute capability >= 8.9: L4, L40S, "
            f"H100, H200, B200, e.g. g6, g6e, p5 instances); this worker has {have}. Use --no-float8."
        )


def apply_float8(model: nn.Module, *, all_gather: bool) -> list[str]:
    """torchao float8 training (tensorwise scaling) on the linears `float8_filter` picks, before
    fully_shard. With `all_gather`, FSDP gathers the weights in float8 (half of bf16's traffic);
    the loop must then call `precompute_float8_scales` after each optimizer step. Returns the
    converted layers' names."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    picked = [n for n, m in model.named_modules() if float8_filter(m, n)]
    convert_to_float8_training(
        model,
        config=Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather),
        module_filter_fn=float8_filter,
    )
    return picked


def precompute_float8_scales(model: nn.Module) -> None:
    """One all-reduce of every float8 weight's amax after the optimizer step, instead of one per
    layer inside the next forward (torchao's recommendation with float8 all-gather)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def apply_fsdp(
    model: nn.Module,
    mesh: Any,
    *,
    mixed_precision: bool = True,
    compile_layers: bool = False,
    activation_checkpointing: bool = False,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """fully_shard each decoder layer, then the root (bf16 compute, fp32 master and reduction).

    `reshard_after_forward=False` keeps every layer's gathered bf16 parameters from the forward to
    the backward: one all-gather per layer per step instead of two, for the gathered (unsharded)
    bf16 copies of every layer's parameters: 2 bytes x the layers' parameters of memory."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6 kept FSDP2 under _composable
        from torch.distributed._composable.fsdp import (
            MixedPrecisionPolicy,
            fully_shard,
        )

    if activation_checkpointing:
        hf: Any = model
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_precision
        else MixedPrecisionPolicy()
    )
    layers = decoder_layers(model)
    if compile_layers:
        recompute_materialized_pointwise()
    for i, layer in enumerate(layers):
        if compile_layers:
            layer.compile()
        # The last layer's params are needed again at once by the backward: keep them gathered.
        fully_shard(
            layer,
            mesh=mesh,
            mp_policy=mp,
            reshard_after_forward=reshard_after_forward and i < len(layers) - 1,
        )
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


# The MLP kernel flag of each Liger patch: SwiGLU for Llama, Mistral, Qwen2/3; GeGLU for Gemma 1-3
# (liger_kernel 0.8.5 transformers/monkey_patch.py: apply_liger_kernel_to_gemma2(rope, cross_entropy,
# fused_linear_cross_entropy, rms_norm, geglu, model), apply_liger_kernel_to_qwen2(..., swiglu, model)).
MLP_KERNEL_FLAGS = ("swiglu", "geglu")


def liger_patch(model_type: str) -> Any:
    """Liger's patch for `model_type` (apply_liger_kernel_to_<model_type>), None when Liger has none."""
    import liger_kernel.transformers as lk

    return getattr(lk, f"apply_liger_kernel_to_{model_type}", None)


def liger_arguments(parameters: Any, *, layers: bool) -> dict[str, bool]:
    """The keyword arguments for a Liger patch that takes `parameters` (its signature's names): the
    fused loss always, its RMSNorm, RoPE and MLP kernel (whichever of SwiGLU or GeGLU the family's
    patch names) with `layers`. Only names the patch takes: Gemma's patches have no `swiglu`."""
    wanted = {
        "fused_linear_cross_entropy": True,
        "cross_entropy": False,
        "rope": layers,
        "rms_norm": layers,
        **{flag: layers for flag in MLP_KERNEL_FLAGS},
    }
    names = set(parameters)
    if "fused_linear_cross_entropy" not in names:
        raise ValueError("--liger: this Liger patch has no fused linear cross-entropy")
    return {name: value for name, value in wanted.items() if name in names}


def apply_liger(model: nn.Module, *, layers: bool) -> None:
    """Liger's fused linear cross-entropy, which never builds the full [tokens, vocab] logits, and
    with `layers` its RMSNorm, RoPE and SwiGLU/GeGLU kernels too. Applied to this instance, before
    fully_shard. Compiled layers leave those three to inductor: it fuses them as well, and its
    partitioner recomputes the norms in the backward rather than saving their outputs, which it
    cannot do through Liger's opaque Triton calls (BENCHMARKS.md). Liger's Gemma 2/3 losses apply
    the final logit soft-cap themselves (liger_kernel/transformers/model/gemma2.py lce_forward:
    `final_logit_softcapping=self.config.final_logit_softcapping`)."""
    import inspect

    model_type = getattr(getattr(model, "config", None), "model_type", "")
    patch = liger_patch(model_type)
    if patch is None:
        raise ValueError(f"--liger: liger-kernel has no patch for model type {model_type!r}")
    patch(**liger_arguments(inspect.signature(patch).parameters, layers=layers), model=model)

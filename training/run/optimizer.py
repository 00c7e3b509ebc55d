"""The optimizer: AdamW over the trained parameters, weight decay only where the field applies it.

--weight-decay defaults to 0.0, as transformers' TrainingArguments (training_args.py `weight_decay:
float = field(default=0.0, ...)`), and so TRL's SFTConfig and axolotl, which inherit it. When it is
set, it never reaches biases or norm gains: transformers' Trainer.get_decay_parameter_names leaves
out every parameter named like `bias`, `layernorm`, `rmsnorm`, `norm` or `*_norm` (Gemma's four
norms per layer, Qwen3's and Gemma 3's q/k norms, Qwen2's attention biases); here every
one-dimensional tensor and every bias, which are those parameters in the catalogue's families.
Embeddings and LoRA's A and B are decayed as that Trainer decays them (their names match none of its
patterns; nanoGPT's configure_optimizers likewise decays "all weight tensors in matmuls + embeddings").
"""

from __future__ import annotations

from typing import Any

import torch


def decayed(name: str, param: torch.Tensor) -> bool:
    """Whether weight decay applies to this parameter: matrices (linear layers, embeddings, LoRA's A
    and B), never biases or norm gains."""
    return param.ndim >= 2 and not name.endswith("bias")


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW's parameter groups over the trained parameters (LoRA: the adapters alone): those weight
    decay applies to, then the rest with none. Empty groups are left out."""
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in trained if decayed(n, p)], "weight_decay": weight_decay},
        {"params": [p for n, p in trained if not decayed(n, p)], "weight_decay": 0.0},
    ]
    return [g for g in groups if g["params"]]


def build_optimizer(
    model: torch.nn.Module, *, lr: float, weight_decay: float, fused: bool
) -> torch.optim.Optimizer:
    """AdamW (betas 0.9, 0.95) over `param_groups`; `fused` on the GPU."""
    return torch.optim.AdamW(
        param_groups(model, weight_decay), lr=lr, betas=(0.9, 0.95), fused=True if fused else None
    )

"""Which tokens the loss is taken on, and the one divisor of an optimizer step.

The loss of a step is the mean over the target tokens of the whole global batch: every micro-batch
of every rank. Each micro-batch's loss is therefore a *sum* over its target tokens divided by the
step's target count, not a per-micro-batch mean: with masked tokens (chat data, where only the
answers count) micro-batches hold different numbers of targets, and averaging their means weights a
short answer's tokens as much as a long one's (the gradient-accumulation bug that several trainers
shipped; transformers' Trainer fixed it by passing `num_items_in_batch`).

The same keyword reaches both loss paths: transformers' ForCausalLMLoss (loss/loss_utils.py:
`reduction = "sum" if num_items_in_batch is not None`, then `/ num_items_in_batch`) and Liger's
fused linear cross-entropy (liger_kernel/transformers/model/loss_utils.py, LigerForCausalLMLoss:
the same rule), both with ignore_index -100. FSDP2 averages gradients over the ranks, so a rank
divides by the step's count / world size: after the average, the gradient is sum / count.
"""

from __future__ import annotations

import torch

from training.data.shards import FLAG_START, FLAG_TARGET

IGNORE_INDEX = -100  # transformers' and Liger's ignore_index: a label that takes no loss


def labels_and_positions(
    ids: torch.Tensor, flags: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Labels (the ids, IGNORE_INDEX where a token is no target) and position ids (None: the
    model's own 0..seq_len-1). Causal LMs shift labels inside the loss: label t is predicted from
    the tokens before t. With flags, positions restart at 0 on each conversation's first token:
    transformers turns restarting position ids into a block-diagonal causal mask when no attention
    mask is given (masking_utils.find_packed_sequence_indices), so packed conversations never attend
    to one another, and each sees the positions it would see alone."""
    if flags is None:
        return ids, None
    flags = flags.to(torch.int32)
    labels = torch.where((flags & FLAG_TARGET) != 0, ids, torch.full_like(ids, IGNORE_INDEX))
    index = torch.arange(ids.shape[-1], dtype=torch.long).expand_as(ids)
    starts = torch.where((flags & FLAG_START) != 0, index, torch.zeros_like(index))
    positions = index - torch.cummax(starts, dim=-1).values
    return labels, positions


def count_targets(labels: torch.Tensor) -> int:
    """Tokens the loss is taken on: labels after the shift (position 0 predicts nothing) that are
    not IGNORE_INDEX. A host tensor: counted before the copy to the GPU, no device sync."""
    return int((labels[..., 1:] != IGNORE_INDEX).sum())

"""Held-out evaluation: loss, perplexity and token accuracy on the target tokens of an eval set.

The eval set is prepared data of its own (--eval-data) or the last --eval-fraction of the training
data's blocks (held out by position: the training run never reads them). Every rank evaluates a
strided share of the blocks and the sums are all-reduced, so every rank gets the same figures
(and early stopping takes the same decision everywhere). Every rank runs the same number of
forwards, padding its share with a block whose targets are all masked: FSDP's all-gathers are
collectives, and a rank with one forward fewer would leave the others waiting.

Targets are those of training (training/methods/loss.py): every next token for text, the assistant's
tokens for chat data. No [micro, seq, vocab] logits are made (2.5 GB in bf16 at 4 x 2048 tokens of
a 151,936-word vocabulary, which the memory plan does not count): a pre-hook on the output layer
takes its input, the final hidden states, scores them one row's chunk of positions at a time with
the layer's own weight (gathered by FSDP for the root's forward, bf16 as the loop computes) and the
model's final logit soft-cap (Gemma 2), and hands the layer only the last position. The extra
memory is one chunk of [tokens, vocab] floats.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from training.methods.loss import IGNORE_INDEX, labels_and_positions

CHUNK = 1024  # positions turned to fp32 logits at once


def held_out_split(n_blocks: int, fraction: float) -> int:
    """The first held-out block of --eval-fraction: the last ceil(fraction · n) blocks, at least one
    and leaving at least one to train on."""
    if n_blocks < 2:
        raise ValueError(f"--eval-fraction: {n_blocks} block(s) of data cannot be split into train and eval")
    held = min(n_blocks - 1, max(1, math.ceil(fraction * n_blocks)))
    return n_blocks - held


def rank_share(n_blocks: int, rank: int, world: int, micro: int) -> list[list[int]]:
    """This rank's eval micro-batches: blocks rank, rank + world, ...; -1 pads every rank to the same
    number of micro-batches of `micro` rows."""
    per_rank = math.ceil(n_blocks / world)
    forwards = math.ceil(per_rank / micro)
    mine = list(range(rank, n_blocks, world))
    mine += [-1] * (forwards * micro - len(mine))
    return [mine[i : i + micro] for i in range(0, len(mine), micro)]


def _read(blocks: Any, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(ids, labels, positions) for real blocks; a pad row (-1) reuses block 0 with no targets."""
    real = [i if i >= 0 else 0 for i in idx]
    ids = torch.from_numpy(blocks.take(real).astype("int64"))
    flags = torch.from_numpy(blocks.take_flags(real)) if getattr(blocks, "has_flags", False) else None
    labels, positions = labels_and_positions(ids, flags)
    labels = labels.clone()
    for row, i in enumerate(idx):
        if i < 0:
            labels[row] = IGNORE_INDEX
    return ids, labels, positions


class _ScoredHead:
    """The output layer's pre-hook: scores the hidden states against `labels` into `sums` (loss
    sum, correct, targets) chunk by chunk; the layer itself computes the last position only."""

    def __init__(self, sums: torch.Tensor, softcap: float | None = None) -> None:
        self.sums = sums
        self.labels: torch.Tensor | None = None
        # Gemma 2's final_logit_softcapping: the model's logits are cap * tanh(logits / cap) (its
        # forward: transformers models/gemma2/modeling_gemma2.py Gemma2ForCausalLM.forward; Liger's
        # fused loss the same, liger_kernel/transformers/model/gemma2.py); scored uncapped, the loss is
        # another number (49.0 where the model's own was 27.8).
        self.softcap = softcap

    def __call__(self, head: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0]
        assert self.labels is not None
        weight: Any = head.weight  # the root's, gathered by FSDP for this forward
        bias: Any = getattr(head, "bias", None)
        for row in range(hidden.shape[0]):
            target = self.labels[row, 1:]
            for at in range(0, target.shape[0], CHUNK):
                t = target[at : at + CHUNK]
                keep = t != IGNORE_INDEX
                if not bool(keep.any()):
                    continue
                h = hidden[row, at : at + t.shape[0]][keep]  # position p predicts p + 1
                lg = torch.nn.functional.linear(h, weight, bias).float()
                if self.softcap:
                    lg = torch.tanh(lg / self.softcap) * self.softcap
                t = t[keep]
                self.sums[0] += torch.nn.functional.cross_entropy(lg, t, reduction="sum").double()
                self.sums[1] += (lg.argmax(-1) == t).sum()
                self.sums[2] += t.numel()
        return (hidden[:, -1:], *args[1:])


@torch.no_grad()
def evaluate(
    model: Any, blocks: Any, *, rank: int, world: int, micro: int, device: torch.device
) -> dict[str, float]:
    """Collective: every rank calls it with the same blocks. Returns eval_loss, eval_perplexity,
    eval_accuracy (share of target tokens whose argmax is right) and eval_tokens."""
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, targets
    scorer = _ScoredHead(sums, getattr(model.config, "final_logit_softcapping", None))
    hook = model.get_output_embeddings().register_forward_pre_hook(scorer)
    was_training = model.training
    model.eval()
    try:
        for idx in rank_share(len(blocks), rank, world, micro):
            ids, labels, positions = _read(blocks, idx)
            ids, scorer.labels = ids.to(device), labels.to(device)
            pos = positions.to(device) if positions is not None else None
            model(input_ids=ids, position_ids=pos, use_cache=False)
    finally:
        hook.remove()
        model.train(was_training)
    dist.all_reduce(sums)
    loss_sum, correct, targets = (float(x) for x in sums.tolist())
    if targets == 0:
        raise ValueError("the eval set has no target tokens")
    loss = loss_sum / targets
    return {
        "eval_loss": loss,
        "eval_perplexity": math.exp(min(loss, 700.0)),
        "eval_accuracy": correct / targets,
        "eval_tokens": int(targets),
    }


class EarlyStop:
    """Stop after `patience` evaluations without a lower eval loss (0: never). Rebuilt from the
    metric history on resume, so a resumed run takes the decision the uninterrupted one would."""

    def __init__(self, patience: int, history: list[dict[str, Any]]) -> None:
        self.patience = patience
        self.best: float | None = None
        self.since_best = 0
        self.improved = False  # the last evaluation was the lowest so far
        for h in history:
            if h.get("eval_loss") is not None:
                self.observe(float(h["eval_loss"]))

    def observe(self, loss: float) -> bool:
        """Record one evaluation; True when training should stop. A non-finite loss (a run gone to
        NaN) is never the best, and never blocks a later finite one from being it."""
        self.improved = math.isfinite(loss) and (self.best is None or loss < self.best)
        if self.improved:
            self.best, self.since_best = loss, 0
        else:
            self.since_best += 1
        return self.patience > 0 and self.since_best >= self.patience

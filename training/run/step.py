"""One rank's training step: the learning rate, the step's micro-batches (forward, backward, the
loss divided by the step's target tokens), the optimizer and the step's metrics."""

from __future__ import annotations

import resource
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from training.methods.loss import count_targets, labels_and_positions
from training.model.build import precompute_float8_scales
from training.options.schedule import lr_at
from training.reporting.progress import say
from training.sizing.flops import mfu

if TYPE_CHECKING:
    from training.data.batches import Batches
    from training.data.shards import TokenBlocks
    from training.options.train import TrainOptions
    from training.reporting.timing import StepTimer

# Training steps a process runs with every guard evaluated before --skip-guard-eval applies: the
# first compiles the layers, the second sees the steady state (gathered parameters, grad sync).
SKIP_GUARDS_AFTER = 2


def _peak_mem_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    # CPU: the process's peak resident set (ru_maxrss is KiB on Linux).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


class Step:
    """The step of training/run/trainer.py's Trainer, which builds what it reads."""

    opts: TrainOptions
    model: Any
    optimizer: torch.optim.Optimizer
    batches: Batches
    blocks: TokenBlocks | None
    timer: StepTimer
    rank: int
    world: int
    device: torch.device
    on_gpu: bool
    global_batch: int
    accum: int
    skip_guards: bool
    steps_here: int
    step: int
    position: int
    reshard_after_forward: bool
    loss_kwargs: dict[str, Any]
    float8: bool
    flops_tok: float
    peak: float | None
    history: list[dict[str, Any]]

    def accumulate_gradients(self) -> tuple[torch.Tensor, float, int | torch.Tensor]:
        """Forward and backward over this rank's micro-batches of the step at self.position.

        Every micro-batch's loss is its sum over target tokens divided by the step's target count
        over all ranks and micro-batches, divided by the world size (training/methods/loss.py): with
        FSDP2's average over ranks, the step's gradient is that of the mean over the global batch.
        Returns (this rank's share of the step's loss, on the device; data wait in seconds; the
        step's target tokens over all ranks)."""
        tw = time.perf_counter()
        # The whole step's micro-batches first (prefetched during the last step): the divisor
        # must be known before the first backward.
        parts = [self.batches.micro_batch_parts(self.position, mb) for mb in range(self.accum)]
        data_wait = time.perf_counter() - tw
        inputs = [(ids, *labels_and_positions(ids, flags)) for ids, flags in parts]
        local = sum(count_targets(labels) for _, labels, _ in inputs)
        targets: int | torch.Tensor
        divisor: float | torch.Tensor
        if self.blocks is not None and self.blocks.has_flags:
            targets = torch.tensor(float(local), device=self.device)
            dist.all_reduce(targets)  # one scalar per step; queued, no host wait
            divisor = targets.clamp(min=1.0) / self.world
        else:  # every token of every block is a target: the count is known
            targets = self.global_batch * (self.opts.seq_len - 1)
            divisor = targets / self.world
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float32)
        warm = self.skip_guards and self.steps_here >= SKIP_GUARDS_AFTER
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=warm):
            self._micro_batches(inputs, divisor, loss_sum)
        return loss_sum, data_wait, targets

    def _micro_batches(
        self, inputs: list[Any], divisor: float | torch.Tensor, loss_sum: torch.Tensor
    ) -> None:
        """Forward and backward of each micro-batch; the losses are added into `loss_sum`."""
        model = self.model
        on = self.device
        for mb, (ids_h, labels_h, pos_h) in enumerate(inputs):
            ids, labels = ids_h.to(on, non_blocking=True), labels_h.to(on, non_blocking=True)
            positions = pos_h.to(on, non_blocking=True) if pos_h is not None else None
            # Reduce-scatter gradients only after the step's last micro-batch.
            model.set_requires_gradient_sync(mb == self.accum - 1)
            if not self.reshard_after_forward:
                # Keep the gathered parameters from one micro-batch to the next (FSDP2's
                # set_reshard_after_backward): one all-gather per layer per step.
                model.set_reshard_after_backward(mb == self.accum - 1)
            loss = model(
                input_ids=ids,
                labels=labels,
                position_ids=positions,
                use_cache=False,
                num_items_in_batch=divisor,
                **self.loss_kwargs,
            ).loss
            loss.backward()
            loss_sum += loss.detach().float()

    def train_step(self) -> dict[str, Any]:
        opts, model = self.opts, self.model
        self.timer.start()
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.step, opts)
        loss_sum, data_wait, targets = self.accumulate_gradients()
        grad_norm = None
        if opts.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), opts.grad_clip)
            grad_norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.float8 and opts.float8_all_gather:
            precompute_float8_scales(model)
        dist.all_reduce(loss_sum)
        # The step ends when the host has seen the GPU finish it, the all-reduce included: NCCL
        # returns to the host as soon as the collective is queued (training/reporting/timing.py).
        dt, end = self.timer.stop()
        self.steps_here += 1
        self.step += 1
        self.position += self.global_batch
        self._note_data_epochs(self.position - self.global_batch, self.position)
        tps = self.global_batch * opts.seq_len / dt
        metrics: dict[str, Any] = {
            "step": self.step,
            "loss": loss_sum.item() / self.world,
            "target_tokens": int(targets),
            "tokens_per_s": tps,
            "step_time_s": dt,
            "end_s": end,
            "data_wait_s": data_wait,
            "peak_mem_gib": _peak_mem_gib(self.device),
            "lr": lr_at(self.step - 1, opts),
            "grad_norm": float(grad_norm) if grad_norm is not None else None,
        }
        util = mfu(tps, self.flops_tok, self.world, self.peak) if self.on_gpu else None
        if util is not None:
            metrics["mfu"] = util
        self.history.append(metrics)
        return metrics

    def _note_data_epochs(self, first: int, end: int) -> None:
        """Log (rank 0) when this step's sequences [first, end) start another pass over the data."""
        if self.blocks is None or self.rank != 0 or not len(self.blocks):
            return
        n = len(self.blocks)
        for epoch in range(first // n + 1, (end - 1) // n + 1):
            say(
                f"[train] step {self.step}: data epoch {epoch + 1} begins: all {n} sequences of the "
                f"prepared data were read, the run repeats them (reshuffled)"
            )

"""One rank's checkpoints, reports and evaluations: resuming, the held-out evaluation and its early
stop, ray.train.report with or without a checkpoint, and what train_state.json holds."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Any

import torch

from training.checkpoint import dcp as checkpoint
from training.checkpoint.best import scored  # each checkpoint scored by its held-out loss
from training.methods.evaluate import EarlyStop, evaluate
from training.reporting.progress import say

if TYPE_CHECKING:
    from training.data.shards import TokenBlocks
    from training.options.train import TrainOptions


class Reporting:
    """The checkpoint and evaluation side of training/run/trainer.py's Trainer, which builds what it reads."""

    opts: TrainOptions
    model: Any
    optimizer: torch.optim.Optimizer
    blocks: TokenBlocks | None
    eval_blocks: Any
    rank: int
    world: int
    device: torch.device
    micro: int
    step: int
    position: int
    data_fingerprint: str | None
    stopped_early: bool
    history: list[dict[str, Any]]
    resumes: list[dict[str, Any]]
    transport: dict[str, Any]
    n_params: int
    flops_tok: float
    peak: float | None
    device_name: str
    backend: str
    nodes: int
    global_batch: int
    accum: int
    compile: bool
    liger: bool
    liger_layers: bool
    skip_guards: bool
    loss_chunk_tokens: int
    float8: bool
    float8_layers: list[str]
    reshard_after_forward: bool
    mesh_shape: tuple[int, ...]
    vocab_size: int

    def resume(self, ckpt_dir: str, filesystem: Any = None) -> None:
        meta = checkpoint.load(ckpt_dir, self.model, self.optimizer, filesystem=filesystem)
        self.step, self.position = meta["step"], meta["position"]
        saved = meta.get("data_fingerprint")
        if self.rank == 0 and saved != self.data_fingerprint:
            say(f"[train] warning: resuming on other data (fingerprint {saved} -> {self.data_fingerprint})")
        self.history = [h for h in meta.get("history", []) if h["step"] <= self.step]
        self.resumes = [
            *meta.get("resumes", []),
            {
                "from_step": self.step,
                "world_size": self.world,
                "rng_restored": meta["rng_restored"],
                # What this rank read of the checkpoint (rank 0's record is the one kept).
                "read_bytes": meta["read"]["bytes"],
                "read_files": meta["read"]["files"],
            },
        ]
        if self.rank == 0:
            say(f"[train] resumed from step {self.step} (data position {self.position})")

    def run_eval(self) -> dict[str, Any]:
        """Collective: the held-out figures, the same on every rank (training/methods/evaluate.py)."""
        t0 = time.perf_counter()
        out: dict[str, Any] = evaluate(
            self.model,
            self.eval_blocks,
            rank=self.rank,
            world=self.world,
            micro=self.micro,
            device=self.device,
        )
        out["eval_time_s"] = time.perf_counter() - t0
        return out

    def save_and_report(self, metrics: dict[str, Any]) -> None:
        import ray.train

        tmp = tempfile.mkdtemp(prefix="raytrain-ckpt-")
        try:
            checkpoint.save(
                tmp,
                self.model,
                self.optimizer,
                step=self.step,
                position=self.position,
                extra=self.checkpoint_extra(),
            )
            ray.train.report(scored(metrics), checkpoint=ray.train.Checkpoint.from_directory(tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def checkpoint_extra(self) -> dict[str, Any]:
        """What train_state.json holds beside step and position (training/checkpoint/dcp.py)."""
        return {
            "history": self.history,
            "resumes": self.resumes,
            "transport": self.transport,
            "n_params": self.n_params,
            "flops_per_token": self.flops_tok,
            "peak_tflops": self.peak,
            "device": self.device_name,
            "backend": self.backend,
            "nodes": self.nodes,
            "global_batch_size": self.global_batch,
            "micro_batch_size": self.micro,
            "accum_steps": self.accum,
            "compile": self.compile,
            "liger": self.liger,
            "liger_layers": self.liger_layers,
            "skip_guard_eval": self.skip_guards,
            "loss_chunk_tokens": self.loss_chunk_tokens,
            "float8": self.float8,
            "float8_layers": len(self.float8_layers),
            "reshard_after_forward": self.reshard_after_forward,
            "mesh": list(self.mesh_shape),
            "data_fingerprint": self.data_fingerprint,
            # What the export needs to write config.json and the tokenizer (training/export/command.py).
            "model_ref": {
                "init": self.opts.init,
                "shape": self.opts.shape,
                "model": self.opts.model,
                "lora": dataclasses.asdict(self.opts.lora) if self.opts.lora is not None else None,
            },
            "stopped_early": self.stopped_early,
            # For the plot: random ids have a chance-level loss of ln(vocab); shards may repeat.
            "vocab_size": self.vocab_size,
            "data_sequences": len(self.blocks) if self.blocks is not None else None,
        }


def report(tr: Reporting, metrics: dict[str, Any], first: bool, improved: bool = False) -> None:
    """A checkpoint at every --checkpoint-every, the end, an early stop and an evaluated step whose
    held-out loss is the lowest so far (`improved`); else metrics only. The last makes the exported
    "best" the lowest held-out loss of the run, whether or not --eval-every divides
    --checkpoint-every (training/checkpoint/best.py). Every rank takes the same branch (the same
    figures on every rank): ray.train.report is a barrier."""
    import ray.train

    opts = tr.opts
    due = tr.step % opts.checkpoint_every == 0 or tr.step == opts.steps
    if tr.stopped_early or due or improved:
        tr.save_and_report(metrics)
    elif first or tr.step % opts.report_every == 0:
        ray.train.report(metrics)


def eval_into(tr: Reporting, early: EarlyStop, metrics: dict[str, Any]) -> bool:
    """Evaluate (every rank: the same figures, so the same early-stop decision) into the step's
    metrics and history. True when the held-out loss is the lowest so far."""
    figures = tr.run_eval()
    metrics.update(figures)
    tr.history[-1].update(figures)
    tr.stopped_early = early.observe(figures["eval_loss"])
    if tr.stopped_early and tr.rank == 0:
        best = "none finite" if early.best is None else f"best {early.best:.4f}"
        say(
            f"[train] early stop at step {tr.step}: no lower eval loss in {early.patience} "
            f"evaluations ({best})"
        )
    return early.improved

"""One rank's checkpoints, reports and evaluations: resuming, the held-out evaluation and its early
stop, ray.train.report with or without a checkpoint, and what train_state.json holds."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from training.checkpoint import dcp as checkpoint
from training.checkpoint import notice
from training.checkpoint.best import scored  # each checkpoint scored by its held-out loss
from training.methods.evaluate import EarlyStop, evaluate
from training.reporting.progress import say

if TYPE_CHECKING:
    from training.data.shards import TokenBlocks
    from training.options.train import TrainOptions


@dataclasses.dataclass
class PendingSave:
    """A checkpoint being written beside training: its folder, the metrics of its step, the write."""

    path: str
    metrics: dict[str, Any]
    step: int
    future: Any  # concurrent.futures.Future of dcp.async_save
    stall_s: float  # what the step waited: the copy off the GPU


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
    preemptions: list[dict[str, Any]]
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

    on_gpu: bool
    saver: checkpoint.AsyncSaver | None = None
    pending: PendingSave | None = None

    def resume(self, ckpt_dir: str, filesystem: Any = None) -> None:
        meta = checkpoint.load(ckpt_dir, self.model, self.optimizer, filesystem=filesystem)
        self.step, self.position = meta["step"], meta["position"]
        # The checkpoint's own record of notices, and the run's file (a notice whose save did not
        # complete is only there): each with the steps it cost (training/checkpoint/notice.py).
        self.preemptions = notice.preemptions_after_resume(
            meta.get("preemptions", []),
            notice.run_notices(self.opts.storage_path, self.opts.run_name),
            self.step,
        )
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
        """A checkpoint written now, whole, and reported: the end of a run, an early stop, a notice.
        A save in flight is completed and reported first."""
        import ray.train

        self.finish_pending(wait=True)
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

    def start_save(self, metrics: dict[str, Any]) -> None:
        """A periodic checkpoint: --async-checkpoint starts it beside training (the step waits for
        the copy off the GPU only) and reports it once written (finish_pending); else as at the end."""
        if not self.opts.async_checkpoint:
            self.save_and_report(metrics)
            return
        self.finish_pending(wait=True)  # at most one save in flight
        if self.saver is None:
            self.saver = checkpoint.AsyncSaver(self.on_gpu)
        tmp = tempfile.mkdtemp(prefix="raytrain-ckpt-")
        t0 = time.perf_counter()
        future = self.saver.start(
            tmp, self.model, self.optimizer, step=self.step, position=self.position,
            extra=self.checkpoint_extra(),
        )  # fmt: skip
        self.pending = PendingSave(tmp, scored(metrics), self.step, future, time.perf_counter() - t0)

    def finish_pending(self, wait: bool, now: dict[str, Any] | None = None) -> bool:
        """Collective (every rank, the same calls): report the save in flight once every rank's
        write is complete (Ray Train then uploads it beside training and registers it, for resume
        and as best, only once uploaded: CheckpointUploadMode.ASYNC, Ray 2.58 and 2.60). A write
        that failed on any rank is dropped on every rank, said, and saved again now, whole. True
        when a report was made. `now`: this step's metrics, for the save made again."""
        import ray.train
        from ray.train import CheckpointUploadMode

        pending = self.pending
        if pending is None:
            return False
        if wait:
            with contextlib.suppress(Exception):  # judged below, on every rank together
                pending.future.result()
        failed = pending.future.done() and pending.future.exception() is not None
        # On the training's own group (the writer thread uses the saver's group meanwhile).
        state = torch.tensor([int(failed), int(not pending.future.done())], device=self.device)
        dist.all_reduce(state, op=dist.ReduceOp.MAX)
        any_failed, any_running = (bool(x) for x in state.tolist())
        if not any_failed and any_running:
            return False
        self.pending = None
        if any_failed:
            shutil.rmtree(pending.path, ignore_errors=True)
            if self.rank == 0:
                why = pending.future.exception() if failed else "on another rank"
                say(f"[train] warning: the checkpoint of step {pending.step} failed ({why}); saving again")
            self.save_and_report(scored(now) if now is not None else {**pending.metrics, "step": self.step})
            return True
        ray.train.report(
            {**pending.metrics, "checkpoint_stall_s": pending.stall_s},
            checkpoint=ray.train.Checkpoint.from_directory(pending.path),
            checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
            delete_local_checkpoint_after_upload=True,
        )
        return True

    def checkpoint_extra(self) -> dict[str, Any]:
        """What train_state.json holds beside step and position (training/checkpoint/dcp.py)."""
        return {
            "history": self.history,
            "resumes": self.resumes,
            "preemptions": self.preemptions,
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


def report(tr: Reporting, metrics: dict[str, Any], first: bool, improved: bool = False) -> bool:
    """A checkpoint at every --checkpoint-every (asynchronous with --async-checkpoint), and a whole
    one at the end, an early stop and an evaluated step whose held-out loss is the lowest so far
    (`improved`: the exported "best" is then the run's lowest held-out loss, whether or not
    --eval-every divides --checkpoint-every; training/checkpoint/best.py); else metrics only, unless
    a save in flight completed and was reported with its own step's metrics. Every rank takes the
    same branch (the same figures on every rank): ray.train.report is a barrier. True when this
    step's state was saved whole (nothing left in flight)."""
    import ray.train

    opts = tr.opts
    if tr.stopped_early or tr.step == opts.steps or improved:
        tr.save_and_report(metrics)
        return True
    if tr.step % opts.checkpoint_every == 0:
        tr.start_save(metrics)
        return tr.pending is None
    reported = tr.finish_pending(wait=False, now=metrics)
    if not reported and (first or tr.step % opts.report_every == 0):
        ray.train.report(metrics)
    return False


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

"""The per-worker training function that Ray Train runs on every rank: build the rank's trainer
(training/run/trainer.py), resume, gate the transport, then step (training/run/step.py), evaluate and
report with checkpoints (training/checkpoint/reporter.py)."""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping
from typing import Any

import torch

from training.checkpoint.notice import NODE_METRIC, Notice, record_notice
from training.checkpoint.reporter import Reporting, eval_into, report
from training.methods.evaluate import EarlyStop
from training.network.probe import TransportGateError, run_transport_gate
from training.options.train import TrainOptions, profile_range
from training.reporting import emf, progress
from training.reporting.progress import say
from training.run.step import SKIP_GUARDS_AFTER, lr_at
from training.run.trainer import Trainer as _Trainer
from training.run.trainer import emulated_host_id, plan_options, planned_micro_batch, planned_reshard

# The trainer and the pieces tests, benchmarks and settings import from here.
__all__ = [
    "EXPECT_ENV",
    "GC_EVERY",
    "SKIP_GUARDS_AFTER",
    "StepProfiler",
    "_Trainer",
    "emulated_host_id",
    "lr_at",
    "plan_options",
    "planned_micro_batch",
    "planned_reshard",
    "resolve_expect",
    "train_loop",
]

EXPECT_ENV = "RAYTRAIN_EXPECT_TRANSPORT"
GC_EVERY = 50  # steps between the young-generation collections the loop runs itself


def resolve_expect(flag: str, backend: str, nodes: int, env: Mapping[str, str]) -> str:
    """What the transport gate must see. Gloo and single-node runs have no inter-node NCCL traffic
    to judge, so `auto` accepts anything there; on several GPU nodes it takes the cluster's setting.
    """
    if flag != "auto":
        return flag
    if backend != "nccl" or nodes <= 1:
        return "any"
    return env.get(EXPECT_ENV, "any") or "any"


class StepProfiler:
    """--profile FIRST:LAST: torch.profiler around those steps on every rank (their collectives
    stay in step); rank 0 writes the Chrome trace and a per-operator table of device time."""

    TABLE_ROWS = 40

    def __init__(self, spec: str | None, output_dir: str, rank: int, on_gpu: bool) -> None:
        self.range = profile_range(spec)
        self.dir = os.path.join(output_dir, "profile")
        self.rank, self.on_gpu = rank, on_gpu
        self.prof: Any = None

    def before_step(self, step: int) -> None:
        """`step` is the 1-based number of the step about to run."""
        if self.range is None or step != self.range[0]:
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_gpu else [])
        self.prof = profile(activities=activities, record_shapes=False, with_stack=False)
        self.prof.__enter__()

    def after_step(self, step: int) -> list[str]:
        """Stops after the last profiled step; returns the files rank 0 wrote."""
        if self.prof is None or self.range is None or step != self.range[1]:
            return []
        if self.on_gpu:
            torch.cuda.synchronize()
        prof, self.prof = self.prof, None
        prof.__exit__(None, None, None)
        if self.rank != 0:
            return []
        os.makedirs(self.dir, exist_ok=True)
        first, last = self.range
        trace = os.path.join(self.dir, f"trace-steps{first}-{last}-rank0.json.gz")
        prof.export_chrome_trace(trace)
        sort = "self_device_time_total" if self.on_gpu else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=self.TABLE_ROWS)
        table_path = os.path.join(self.dir, f"ops-steps{first}-{last}-rank0.txt")
        with open(table_path, "w") as f:
            f.write(table + "\n")
        return [trace, table_path]


def _shown(tr: Reporting, metrics: dict[str, Any], first: bool, node: str) -> dict[str, Any]:
    """The step's metrics with what the first step's report and the progress line carry besides:
    the transport verdict and this rank's Ray node (for the head's preStop: notice.head_notice),
    once; the preemptions so far with the steps each cost."""
    if first:
        metrics = {**metrics, "transport": tr.transport, NODE_METRIC: node}
    if tr.preemptions:
        metrics["preemptions"] = [p.get("lost_steps") for p in tr.preemptions]
    return metrics


def checkpoint_on_notice(tr: Reporting, notice: Notice, metrics: dict[str, Any], checkpointed: bool) -> None:
    """Collective, after every step: on a stop notice (every rank sees it at the same step: the
    check is a barrier) the step in flight has finished; save it (unless this step just
    checkpointed), tell the pods' preStop hooks (this node's, and the head's through the report the
    controller registers), and train no further."""
    import time

    import ray.train
    import torch.distributed as dist

    info = notice.check()
    if info is None:
        return
    t0 = time.perf_counter()
    entry = notice.entry(info, tr.step)
    if tr.rank == 0:
        say(f"[train] stop notice at step {tr.step} (ranks {entry['ranks']}, {entry['notice_s']}s left)")
        try:  # counted even should the save not complete in time
            record_notice(tr.opts.storage_path, tr.opts.run_name, entry)
        except OSError as exc:
            say(f"[train] warning: could not record the notice ({exc})")
    tr.preemptions.append(entry)
    said = notice.saved_metrics(info, tr.step)
    if checkpointed:  # this step's whole checkpoint is reported already: say so to the controller
        ray.train.report({"step": tr.step, **said})
    else:
        tr.save_and_report({**metrics, "preempted": True, **said})
    dist.barrier()  # every rank's part is written and reported
    notice.saved(info, tr.step, time.perf_counter() - t0)
    notice.wait_for_stop()


def _release(tr: _Trainer, notice: Notice) -> None:
    """The rank's end here (a rank that saved on notice never gets here: its group is ended)."""
    gc.enable()
    notice.close()
    tr.batches.close()
    if tr.saver is not None:
        tr.saver.close()


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: build, resume, gate the transport, train, checkpoint."""
    import ray
    import ray.train

    opts = TrainOptions.from_dict(config["options"])
    tr = _Trainer(opts, config.get("data"), eval_data=config.get("eval_data"))
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        # Straight from the storage (S3 on the cluster): each rank reads the byte ranges of the
        # shards its load plan names, not a local copy of the whole checkpoint (as_directory()).
        tr.resume(ckpt.path, filesystem=ckpt.filesystem)

    # Every rank, after the process group is up and before the first step: fail before training
    # when inter-node traffic is not on the expected transport.
    expect = resolve_expect(opts.expect_transport, tr.backend, tr.nodes, os.environ)
    try:
        tr.transport = dict(run_transport_gate(expect, log_dir=None))
    except TransportGateError as exc:
        verdict = config.get("gate_verdict")
        if verdict is None:
            raise
        # The gate judges every rank's facts together, so all ranks land here. Returning (not
        # raising) ends the run without the FailureConfig retries: restarting the same workers
        # on the same network cannot change the verdict. The driver reads it and exits non-zero.
        if tr.rank == 0:
            ray.get(verdict.set.remote(str(exc), dict(exc.result)))
        return
    tr.transport.setdefault("expect", expect)

    notice = Notice(
        tr.rank,
        ray.train.get_context().get_local_rank(),
        opts.storage_path,
        opts.run_name,
    )
    profiler = StepProfiler(opts.profile, opts.output_dir, tr.rank, tr.on_gpu)
    # Python's automatic collector runs when allocation counts say so, on each rank at its own
    # moment; a full pass over this process's large heap (compiled graphs, Ray, transformers) stalls
    # that rank's step and, through the collectives, every other rank's. Collect at fixed steps
    # instead, the same on all ranks (as torchtitan does).
    gc.disable()
    gc.collect()
    early = EarlyStop(opts.early_stop_patience, tr.history)
    eval_every = opts.eval_every or opts.checkpoint_every
    try:
        first = True
        while tr.step < opts.steps:
            profiler.before_step(tr.step + 1)
            if tr.step and tr.step % GC_EVERY == 0:
                gc.collect(1)
            metrics = tr.train_step()
            improved = False
            if tr.eval_blocks is not None and (tr.step % eval_every == 0 or tr.step == opts.steps):
                improved = eval_into(tr, early, metrics)
            emf.publish(opts, tr.rank, metrics)
            for written in profiler.after_step(tr.step):
                say(f"[train] profile: wrote {written}")
            metrics = _shown(tr, metrics, first, notice.node_id)
            if tr.rank == 0 and (tr.step % opts.log_every == 0 or tr.step == opts.steps):
                say(progress.line(metrics, opts.steps, tr.history[-tr.steps_here :]))
            checkpointed = report(tr, metrics, first, improved)
            first = False
            if tr.stopped_early:
                break
            checkpoint_on_notice(tr, notice, metrics, checkpointed)
    finally:
        _release(tr, notice)

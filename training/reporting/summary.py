"""End-of-run summary.json and the loss/throughput plot."""

from __future__ import annotations

import json
import math
import os
import statistics
from typing import Any

from training.reporting.timing import window_throughput

SUMMARY_FILE = "summary.json"
PLOT_FILE = "training.png"


def steady_window(history: list[dict[str, Any]], resumes: list[dict[str, Any]]) -> int:
    """Index in `history` where the steady window of the last process begins.

    The window leaves out the start-up step (the first of the run, or the first after the last
    resume: process start, compile) and everything before it: step end times are read on one
    process's clock, so a window never spans a restart.
    """
    # A fresh run starts at step 1, a resumed process at from_step + 1: its start-up step.
    first = 2 + max([0, *(r["from_step"] for r in resumes)])
    for i, h in enumerate(history):
        if h["step"] >= first:
            return i
    return len(history)


def eval_summary(history: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any] | None:
    """The last evaluation's figures, the best eval loss and its step, and whether the run stopped
    early; None for a run without an eval set."""
    evals = [h for h in history if h.get("eval_loss") is not None]
    if not evals:
        return None
    best = min(evals, key=lambda h: h["eval_loss"])
    last = {k: v for k, v in evals[-1].items() if k.startswith("eval_")}
    return {**last, "step": evals[-1]["step"], "best_eval_loss": best["eval_loss"], "best_step": best["step"],
            "stopped_early": bool(meta.get("stopped_early"))}  # fmt: skip


def summarize(meta: dict[str, Any], options: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """Aggregate the per-step history kept in the final checkpoint.

    Throughput is tokens over the wall time of the steady window (`steady_window`), every step's
    end read after the host waited for the GPU (training/reporting/timing.py); MFU follows from it.
    """
    history: list[dict[str, Any]] = meta.get("history", [])
    resumes = meta.get("resumes", [])
    start = steady_window(history, resumes)
    if start >= len(history):  # a run of one step: its start-up step is all there is
        start = max(0, len(history) - 1)
    steady = history[start:]
    tokens_per_step = int(meta.get("global_batch_size") or 0) * int(options.get("seq_len") or 0)
    window = (
        window_throughput(history, start, tokens_per_step)
        if tokens_per_step and all("end_s" in h for h in steady)
        else None
    )

    def mean(key: str) -> float | None:
        vals = [h[key] for h in steady if h.get(key) is not None]
        return statistics.fmean(vals) if vals else None

    tps = window["tokens_per_s"] if window else None
    n_gpus = meta.get("world_size") or 1
    util = (
        tps * meta["flops_per_token"] / (n_gpus * meta["peak_tflops"] * 1e12)
        if tps and meta.get("flops_per_token") and meta.get("peak_tflops")
        else None
    )
    return {
        "run_name": options["run_name"],
        "eval": eval_summary(history, meta),
        "steps": meta.get("step"),
        "final_loss": history[-1]["loss"] if history else None,
        "tokens_per_s": tps,
        "mfu": util,
        "window": window,
        "step_time_s": mean("step_time_s"),
        "data_wait_s": mean("data_wait_s"),
        "data_wait_fraction": (
            sum(h["data_wait_s"] for h in steady) / sum(h["step_time_s"] for h in steady)
            if steady and all(h.get("data_wait_s") is not None for h in steady)
            else None
        ),
        "peak_mem_gib": max((h["peak_mem_gib"] for h in history), default=None),
        "n_params": meta.get("n_params"),
        "flops_per_token": meta.get("flops_per_token"),
        "peak_tflops_per_gpu": meta.get("peak_tflops"),
        "world_size": meta.get("world_size"),
        "nodes": meta.get("nodes"),
        "device": meta.get("device"),
        "backend": meta.get("backend"),
        "global_batch_size": meta.get("global_batch_size"),
        "micro_batch_size": meta.get("micro_batch_size"),  # --micro-batch-size auto: the one chosen
        "accum_steps": meta.get("accum_steps"),
        "compile": meta.get("compile"),
        "liger": meta.get("liger"),
        "liger_layers": meta.get("liger_layers"),
        "float8": meta.get("float8"),
        "float8_layers": meta.get("float8_layers"),
        "mesh": meta.get("mesh"),
        # --reshard-after-forward unset: the memory plan's choice (training/run/trainer.py).
        "reshard_after_forward": meta.get("reshard_after_forward"),
        "data_position": meta.get("position"),
        "data_fingerprint": meta.get("data_fingerprint"),
        "vocab_size": meta.get("vocab_size"),
        # Passes over the prepared data (None for random ids): above 1, the run repeated its data.
        "data_epochs": (
            meta["position"] / meta["data_sequences"]
            if meta.get("data_sequences") and meta.get("position") is not None
            else None
        ),
        "resumes": meta.get("resumes", []),
        # Stop notices (Spot reclaim, drain, preemption), each with the steps it cost
        # (training/checkpoint/notice.py): counted apart from the failures among the resumes.
        "preemptions": meta.get("preemptions", []),
        "transport": meta.get("transport"),
        "wall_time_s": wall_s,
        # The options as given: --micro-batch-size auto is None in them (the choice is above).
        "options": {**options, "micro_batch_size": options.get("micro_batch_size") or "auto"}
        if "micro_batch_size" in options
        else options,
        "history": history,
    }


def smoothed(values: list[float], span: int) -> list[float]:
    """Exponential moving average with the usual span (alpha = 2 / (span + 1)), bias-corrected so
    that the first points are not pulled towards zero."""
    alpha, avg, weight, out = 2 / (span + 1), 0.0, 0.0, []
    for v in values:
        avg = (1 - alpha) * avg + alpha * v
        weight = (1 - alpha) * weight + alpha
        out.append(avg / weight)
    return out


def chance_loss(summary: dict[str, Any]) -> float | None:
    """ln(vocab): the loss of a uniform guess, which random token ids cannot beat (None for real data)."""
    random_data = (summary.get("options") or {}).get("data") == "random"
    vocab = summary.get("vocab_size")
    return math.log(vocab) if random_data and vocab else None


def plot(summary: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = summary["history"]
    steps = [h["step"] for h in hist]
    losses = [h["loss"] for h in hist]
    span = max(1, len(hist) // 20)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax1.plot(steps, losses, color="tab:blue", alpha=0.35, linewidth=1, label="loss")
    smooth = smoothed(losses, span)
    if smooth:
        final = f"final {smooth[-1]:.3f}, last step {losses[-1]:.3f}"
        ax1.plot(steps, smooth, color="tab:blue", linewidth=2, label=f"smoothed (EMA, span {span}); {final}")
    chance = chance_loss(summary)
    if chance is not None:
        # Random ids carry nothing to learn: with the axis from 0, noise around ln(vocab) looks flat.
        label = f"chance level ln({summary['vocab_size']}) = {chance:.3f} (random data)"
        ax1.axhline(chance, color="tab:gray", linestyle="--", linewidth=1, label=label)
        ax1.set_ylim(0, 1.1 * max([chance, *losses]))
    evals = [h for h in hist if h.get("eval_loss") is not None]
    if evals:
        last = evals[-1]
        ppl = f", perplexity {last['eval_perplexity']:.2f}" if last.get("eval_perplexity") else ""
        ax1.plot(
            [h["step"] for h in evals],
            [h["eval_loss"] for h in evals],
            "o-",
            color="tab:orange",
            label=f"held-out loss; final {last['eval_loss']:.3f}{ppl}",
        )
        scored = [h for h in evals if h.get("eval_accuracy") is not None]
        if scored:  # token accuracy on the held-out targets, on its own axis (percent)
            acc = ax1.twinx()
            final = f"final {100 * scored[-1]['eval_accuracy']:.1f} %"
            acc.plot([h["step"] for h in scored], [100 * h["eval_accuracy"] for h in scored], "s--",
                     color="tab:purple", label=f"held-out token accuracy; {final}")  # fmt: skip
            acc.set_ylim(0, 100)
            acc.set_ylabel("token accuracy, %")
            acc.legend(loc="center right", fontsize="small")
    ax1.set_ylabel("loss")
    ax1.legend(loc="upper right", fontsize="small")
    epochs = summary.get("data_epochs")
    repeats = f"; data read {epochs:.1f}×" if epochs and epochs > 1 else ""
    ax1.set_title(f"{summary['run_name']}: {summary['world_size']} × {summary['device']}{repeats}")
    ax2.plot(steps, [h["tokens_per_s"] for h in hist], color="tab:green")
    if summary.get("tokens_per_s"):
        ax2.axhline(summary["tokens_per_s"], color="tab:green", linestyle=":", linewidth=1,
                    label=f"steady window {summary['tokens_per_s']:,.0f} tokens/s")  # fmt: skip
        ax2.legend(loc="best", fontsize="small")
    ax2.set_ylabel("tokens/s")
    ax2.set_xlabel("step")
    for r in summary["resumes"]:
        for ax in (ax1, ax2):
            ax.axvline(r["from_step"], color="tab:red", linestyle=":", linewidth=1)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(summary: dict[str, Any], output_dir: str, storage_path: str) -> list[str]:
    """Write summary.json and the plot to output_dir; copy both next to the checkpoints on S3."""
    os.makedirs(output_dir, exist_ok=True)
    spath = os.path.join(output_dir, SUMMARY_FILE)
    with open(spath, "w") as f:
        json.dump(summary, f, indent=2, default=str)
    ppath = os.path.join(output_dir, PLOT_FILE)
    written = [spath]
    try:
        plot(summary, ppath)
        written.append(ppath)
    except ImportError as exc:
        # An image without matplotlib must not fail a finished run: the numbers are in the json.
        print(f"[train] no plot: {exc}", flush=True)
    if "://" in storage_path:  # s3:// on the cluster: the head pod's disk does not outlive the job
        import pyarrow.fs as pafs

        scheme = storage_path.split("://", 1)[0]
        fs, root = pafs.FileSystem.from_uri(storage_path.rstrip("/") + "/" + summary["run_name"])
        fs.create_dir(root, recursive=True)
        for local in list(written):
            target = f"{root}/{os.path.basename(local)}"
            pafs.copy_files(local, target, destination_filesystem=fs)
            written.append(f"{scheme}://{target}")
    return written

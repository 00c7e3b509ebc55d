"""Training throughput: the original sample's recipe against our loop, on the same GPU(s), in one run.

    python bench/train_throughput.py [--configs original,ours,...] [--batch 16] [--seq-len 2048]
                                     [--steps 12] [--shape qwen2.5-1.5b] [--num-workers N[,N...]]
                                     [--sharding auto|full|hsdp] [--emulate-hosts H]
                                     [--nccl-log-dir DIR] [--expect-transport T] [--profile A:B]

Both run through Ray Train's TorchTrainer on the same machine, one after the other, with random
weights of the same shape and random token ids, the same tokens per step (batch x seq_len per
worker). Prints one JSON line per configuration (tokens/s, MFU, peak memory, time to first step)
and a final line with the ratio ours/original. With several worker counts (--num-workers 1,2),
our configurations run at each count (the original recipe at the smallest) and a line per count
gives the weak-scaling efficiency (tokens/s per GPU against the smallest count's). MFU uses
6N + 12*L*d*T FLOPs per token and the GPU's dense bf16 peak (989 TFLOP/s for H100/H200), for
both recipes alike.

- original: the AWS sample's recipe: the whole model in bf16, FSDP1 through Ray's
  prepare_model with size_based_auto_wrap_policy(min_num_params=1e7), plain AdamW, Hugging Face loss.
- ours*: `python -m training` as the RayJob runs it (training.run.driver.run), with the variant's options.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.args import int_list  # noqa: E402  (after the path: run as a script)

# Variants of our loop: options layered over the GPU defaults of `python -m training`.
OURS: dict[str, list[str]] = {
    "ours": [],  # the GPU defaults of `python -m training` (float8 where the GPU has FP8 cores)
    # The GPU defaults before 2026-12-02: Liger's own loss chunks, every dynamo guard evaluated,
    # parameters freed after each forward.
    "ours-before": ["--loss-chunk-tokens", "0", "--no-skip-guard-eval", "--reshard-after-forward"],
    "ours-bf16": ["--compile", "--liger", "--no-float8"],  # the GPU defaults before float8
    "ours-bf16-noreshard": ["--compile", "--liger", "--no-float8", "--no-reshard-after-forward"],
    "ours-float8": ["--compile", "--liger", "--float8"],
    "ours-float8-ag": ["--compile", "--liger", "--float8", "--float8-all-gather"],
    "ours-noreshard": ["--no-reshard-after-forward"],
    # The GPU defaults before 2026-12-03 (parameters freed after each layer's forward, whatever the memory).
    "ours-reshard": ["--reshard-after-forward"],
    # The micro-batch the memory plan picks for --batch (a worker's share of the step), over --micro-batch.
    "ours-auto": ["--micro-batch-size", "auto"],
    "ours-auto-noreshard": ["--micro-batch-size", "auto", "--no-reshard-after-forward"],
    "ours-auto-reshard": ["--micro-batch-size", "auto", "--reshard-after-forward"],
    "ours-liger-all": ["--compile", "--liger", "--liger-layers"],
    "ours-nocompile": ["--no-compile", "--liger"],
    "ours-noliger": ["--compile", "--no-liger"],
    "ours-eager": ["--no-compile", "--no-liger"],  # runs anywhere, the CPU included
}


REPORTED_OPTIONS = (
    "compile", "liger", "float8", "float8_all_gather", "reshard_after_forward", "sharding",
    "micro_batch_size", "global_batch_size",
)  # fmt: skip


def original_recipe(config: dict[str, Any]) -> None:
    """The sample's train function, step for step; rank 0 writes its timings to config['out']."""
    import functools

    import ray.train
    import ray.train.torch
    import torch
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
    from transformers import AutoModelForCausalLM

    from training.model.build import shape_config
    from training.reporting.timing import StepTimer

    device = ray.train.torch.get_device()
    torch.manual_seed(0)
    cfg = shape_config(config["shape"])
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16)
    model = ray.train.torch.prepare_model(
        model,
        parallel_strategy="fsdp",
        parallel_strategy_kwargs={
            "auto_wrap_policy": functools.partial(size_based_auto_wrap_policy, min_num_params=int(1e7))
        },
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    micro, accum, seq = config["micro_batch"], config["accum"], config["seq_len"]
    timer = StepTimer(device)  # the same clock as our loop's: ends after the host saw the GPU finish
    history = []
    for step in range(config["steps"]):
        timer.start()
        for _ in range(accum):  # the sample has no accumulation; it is how it reaches our batch
            ids = torch.randint(0, cfg.vocab_size, (micro, seq), device=device)
            loss = model(input_ids=ids, labels=ids).loss / accum
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss.item()  # the sample logs the loss every step
        dt, end = timer.stop()
        history.append({"step": step + 1, "step_time_s": dt, "end_s": end})
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    if ray.train.get_context().get_world_rank() == 0:
        Path(config["out"]).write_text(json.dumps({"history": history, "peak_mem_gib": peak}))


def run_original(args: argparse.Namespace, workers: int, use_gpu: bool) -> dict[str, Any]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out = Path(tempfile.mkdtemp(prefix="bench-original-")) / "timings.json"
    t0 = time.time()
    TorchTrainer(
        original_recipe,
        train_loop_config={
            "shape": args.shape,
            "micro_batch": args.original_micro_batch,
            "accum": args.batch // args.original_micro_batch,
            "seq_len": args.seq_len,
            "steps": args.steps,
            "out": str(out),
        },
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu),
        run_config=RunConfig(name=f"bench-original-{int(t0)}", storage_path=args.storage),
    ).fit()
    timings = json.loads(out.read_text())
    return {
        **_measured(timings["history"], args, workers),
        "peak_mem_gib": timings["peak_mem_gib"],
        "micro_batch": args.original_micro_batch,
        "accum": args.batch // args.original_micro_batch,
        "wall_s": time.time() - t0,
    }


def _measured(history: list[dict[str, Any]], args: argparse.Namespace, workers: int) -> dict[str, Any]:
    """Both recipes alike: tokens over the wall time of the window after the warm-up steps, every
    step's end read after the host waited for the GPU (training/reporting/timing.py)."""
    from training.reporting.timing import window_throughput

    window = window_throughput(history, args.warmup, workers * args.batch * args.seq_len)
    assert window is not None  # main() checks --steps > --warmup
    steady = [h["step_time_s"] for h in history[args.warmup :]]
    return {
        "tokens_per_s": window["tokens_per_s"],
        "window_s": window["wall_s"],
        "in_step_fraction": window["in_step_fraction"],
        "step_time_s": statistics.fmean(steady),
        **_spread(steady),
        "first_step_s": history[0]["step_time_s"],
    }


def run_ours(name: str, args: argparse.Namespace, workers: int) -> dict[str, Any]:
    from training.options.train import parse_args
    from training.run.driver import run

    t0 = time.time()
    argv = [
        "--run-name", f"bench-{name}-{int(t0)}",
        "--storage-path", args.storage,
        "--output-dir", str(Path(args.output_dir) / f"{name}-{workers}"),
        "--init", "random",
        "--shape", args.shape,
        "--data", "random",
        "--seq-len", str(args.seq_len),
        "--micro-batch-size", str(args.micro_batch),
        "--global-batch-size", str(args.batch * workers),
        "--steps", str(args.steps),
        "--checkpoint-every", str(args.steps),
        "--no-export",  # a Hugging Face folder of random weights measures nothing
        "--warmup-steps", "0",
        "--num-workers", str(workers),
        "--sharding", args.sharding,
        "--expect-transport", args.expect_transport,
        *(["--emulate-hosts", str(args.emulate_hosts)] if args.emulate_hosts else []),
        *(["--profile", args.profile] if args.profile else []),
        *OURS[name],
    ]  # fmt: skip
    summary = run(parse_args(argv))
    history = summary["history"]
    return {
        **_measured(history, args, workers),
        "peak_mem_gib": max(h["peak_mem_gib"] for h in history),
        "data_wait_fraction": summary.get("data_wait_fraction"),
        "wall_s": time.time() - t0,
        "options": {k: summary["options"][k] for k in REPORTED_OPTIONS},
        "micro_batch": summary.get("micro_batch_size"),  # as run (an auto variant's choice)
        "accum_steps": summary.get("accum_steps"),
        "float8_layers": summary.get("float8_layers"),
        "reshard_after_forward": summary.get("reshard_after_forward"),  # as run (the plan's choice if unset)
        "liger_layers": summary.get("liger_layers"),
        "mesh": summary.get("mesh"),
        "nodes": summary.get("nodes"),
        "transport": _transport_brief(summary.get("transport") or {}),
    }


def _spread(times: list[float]) -> dict[str, float]:
    # tokens/s is over the whole measured window (mean step time); these show one-off stalls.
    return {"step_time_median_s": statistics.median(times), "step_time_max_s": max(times)}


def _transport_brief(t: dict[str, Any]) -> dict[str, Any]:
    return {k: t[k] for k in ("expect", "ok", "status", "transport", "nodes", "busbw_gbps") if k in t}


def _worker_counts(text: str | None) -> list[int] | None:
    return sorted(set(int_list(text, minimum=1, example="1,2"))) if text else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", default="original,ours", help=f"original and/or {', '.join(OURS)}")
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument(
        "--batch", type=int, default=16, help="sequences per worker per optimizer step (both recipes)"
    )
    parser.add_argument(
        "--micro-batch", type=int, help="ours: sequences per forward/backward pass (default: --batch)"
    )
    parser.add_argument(
        "--original-micro-batch",
        type=int,
        help="the original recipe's micro-batch (default: --batch); it accumulates the rest",
    )
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the averages")
    parser.add_argument(
        "--num-workers",
        type=_worker_counts,
        help="worker (GPU) counts, e.g. 1,2 for weak scaling (default: every GPU of this machine)",
    )
    parser.add_argument("--sharding", choices=("auto", "full", "hsdp"), default="auto", help="ours only")
    parser.add_argument(
        "--emulate-hosts",
        type=int,
        help="ours only: split the workers into H hosts as NCCL sees them (NCCL_HOSTID), so NCCL "
        "uses its network transport between them",
    )
    parser.add_argument(
        "--expect-transport", default="auto", help="ours only: the in-job transport gate's expectation"
    )
    parser.add_argument(
        "--nccl-log-dir",
        help="NCCL debug logs (INIT,NET), one per process, for the transport gate and as evidence",
    )
    parser.add_argument("--profile", metavar="FIRST:LAST", help="ours only: torch.profiler over these steps")
    parser.add_argument("--storage", default=None, help="Ray Train storage (default: a temp dir)")
    parser.add_argument(
        "--output-dir", default=None, help="our runs' summaries and profiles (default: a temp dir)"
    )
    return parser


def comparisons(
    results: dict[tuple[str, int], dict[str, Any]], configs: list[str], counts: list[int]
) -> list[dict[str, Any]]:
    """Per configuration and worker count: ratio to the original recipe at that count, and weak
    scaling efficiency (tokens/s per GPU) against the smallest count. A configuration named more
    than once is compared once, by its last run (each run's own row is printed as it ends)."""
    lines = []
    for workers in counts:
        base = results.get(("original", workers))
        for name in dict.fromkeys(configs):
            if (name, workers) not in results:
                continue
            row = results[(name, workers)]
            line: dict[str, Any] = {"config": name, "workers": workers}
            if base is not None and name != "original":
                line["speedup_vs_original"] = row["tokens_per_s"] / base["tokens_per_s"]
                if row.get("peak_mem_gib") and base.get("peak_mem_gib"):
                    line["memory_vs_original"] = row["peak_mem_gib"] / base["peak_mem_gib"]
            if workers != counts[0]:
                one = results[(name, counts[0])]
                line[f"scaling_efficiency_vs_{counts[0]}"] = (
                    row["tokens_per_s_per_gpu"] / one["tokens_per_s_per_gpu"]
                )
            if len(line) > 2:
                lines.append(line)
    return lines


def _check_micro_batches(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag in ("micro_batch", "original_micro_batch"):
        value = getattr(args, flag) or args.batch
        if value < 1 or args.batch % value:
            parser.error(f"--{flag.replace('_', '-')}: must divide --batch ({args.batch}); got {value}")
        setattr(args, flag, value)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c != "original" and c not in OURS]
    if unknown:
        parser.error(f"unknown configs {unknown}; valid: original, {', '.join(OURS)}")
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    _check_micro_batches(parser, args)
    args.storage = args.storage or tempfile.mkdtemp(prefix="bench-storage-")
    args.output_dir = args.output_dir or tempfile.mkdtemp(prefix="bench-output-")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.nccl_log_dir:
        from training.network.probe import nccl_env

        os.makedirs(args.nccl_log_dir, exist_ok=True)
        # Before ray.init: the workers inherit the environment of the Ray instance started here.
        os.environ.update(nccl_env(os.path.abspath(args.nccl_log_dir)))

    import ray
    import torch

    from training.model.build import SHAPES
    from training.sizing.flops import flops_per_token, peak_tflops

    use_gpu = torch.cuda.is_available()
    if "original" in configs and not use_gpu:
        parser.error("'original' needs a GPU: Ray's prepare_model only does FSDP with use_gpu=True")
    counts = args.num_workers or [torch.cuda.device_count() if use_gpu else 2]
    gpu = torch.cuda.get_device_name(0) if use_gpu else "cpu"
    peak = peak_tflops(gpu) if use_gpu else None
    shape = SHAPES[args.shape]
    n_params = _param_count(args.shape)
    flops_tok = flops_per_token(n_params, shape["num_hidden_layers"], shape["hidden_size"], args.seq_len)
    ray.init(num_cpus=None if use_gpu else 2 * max(counts))
    env = {
        "gpu": gpu,
        "gpus_visible": torch.cuda.device_count() if use_gpu else 0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if use_gpu else None,
        "ray": ray.__version__,
        "shape": args.shape,
        "params": n_params,
        "gflop_per_token": flops_tok / 1e9,
        "batch_per_worker": args.batch,
        "micro_batch": args.micro_batch,
        "original_micro_batch": args.original_micro_batch,
        "seq_len": args.seq_len,
        "sharding": args.sharding,
        "emulate_hosts": args.emulate_hosts,
    }
    print(json.dumps({"environment": env}), flush=True)

    results: dict[tuple[str, int], dict[str, Any]] = {}
    for workers in counts:
        for name in configs:
            if name == "original" and workers != counts[0]:
                continue  # the recipe comparison is made at the smallest count; scaling is ours'
            if name == "original":
                row = run_original(args, workers, use_gpu)
            else:
                row = run_ours(name, args, workers)
            # Our run ends with a full checkpoint (fp32 weights + Adam: ~18 GB for 1.5B parameters);
            # clear it so the next configuration does not fill the disk.
            for child in Path(args.storage).iterdir():
                shutil.rmtree(child, ignore_errors=True)
            row["tokens_per_s_per_gpu"] = row["tokens_per_s"] / workers
            if peak:
                row["mfu"] = row["tokens_per_s"] * flops_tok / (workers * peak * 1e12)
            results[(name, workers)] = row
            print(json.dumps({"config": name, "workers": workers, **row}), flush=True)
    for line in comparisons(results, configs, counts):
        print(json.dumps(line), flush=True)
    return 0


def _param_count(shape: str) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from training.model.build import shape_config
    from training.sizing.flops import count_params

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape_config(shape))
    return int(count_params(model))


if __name__ == "__main__":
    sys.exit(main())

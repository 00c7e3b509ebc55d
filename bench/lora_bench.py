"""LoRA and full fine-tuning on one GPU through the loop's own trainer: step time, throughput, MFU and
peak memory against the memory plan.

    python bench/lora_bench.py --shape qwen2.5-7b --seq-len 4096 --points lora:4,lora:8,full-ac:1
                               [--steps 12] [--warmup 4] [--lora-rank 16] [--lora-alpha 32]

A point is METHOD:MICRO_BATCH with METHOD one of lora, lora-ac, full, full-ac (-ac: activation
checkpointing), one micro-batch per step. Each point runs in its own process (a fresh CUDA context
and compiler state) without Ray: `training.run.loop._Trainer` on one rank, built exactly as the RayJob's
workers build it (the GPU defaults: per-layer torch.compile, Liger's fused loss; LoRA: a frozen bf16
base with fp32 adapters by peft; full: fp32 master weights, float8 where the GPU has it), on random
weights of the named shape (no model hub here) and random tokens. The `--init random` that the CLI
refuses for LoRA is set here on purpose: a benchmark needs the shape, not trained weights.

Each point prints one JSON line:
- step times read after the host waited for the GPU (training/reporting/timing.py StepTimer), the mean and
  median over the steps after --warmup, tokens/s = tokens of those steps / their summed time, and
  MFU against the GPU's dense bf16 peak with the FLOPs the method runs (training/sizing/flops.py:
  6N + 12 L d T for full fine-tuning; lora_flops_per_token for LoRA: 4 x base matmul weights +
  6 x adapter parameters + 12 L d T);
- the peak of torch.cuda.max_memory_allocated over the measured steps and over the whole run, and
  the memory plan's allocated peak for the same options (training/sizing/memory_plan.py plan, with the
  trainer's own choices: compile, Liger, reshard, float8, LoRA), with their ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

METHODS = ("lora", "lora-ac", "full", "full-ac")


def parse_point(text: str) -> tuple[str, int]:
    method, _, micro = text.partition(":")
    if method not in METHODS or not micro.isdigit() or int(micro) < 1:
        raise argparse.ArgumentTypeError(
            f"point {text!r}: METHOD:MICRO_BATCH, METHOD one of {', '.join(METHODS)}"
        )
    return method, int(micro)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen2.5-7b")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--points", default="lora:4", help="comma-separated METHOD:MICRO_BATCH")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=4, help="steps left out of the figures (compile, caches)")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument(
        "--extra", default="", help="more `python -m training` flags for every point, space-separated"
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one point in this process
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        points = [parse_point(t.strip()) for t in args.points.split(",") if t.strip()]
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if args.steps <= args.warmup:
        parser.error("--steps must be more than --warmup")
    if args.worker:
        print(json.dumps(measure(args, parse_point(args.worker))), flush=True)
        return 0
    rc = 0
    for method, micro in points:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            *(argv or sys.argv[1:]),
            "--worker",
            f"{method}:{micro}",
        ]
        proc = subprocess.run(cmd, check=False)  # noqa: S603 (this interpreter, this script)
        if proc.returncode:
            print(
                json.dumps({"point": f"{method}:{micro}", "error": f"exit status {proc.returncode}"}),
                flush=True,
            )
            rc = 1
    return rc


def _note(line: str) -> None:
    print(f"[lora_bench {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def measure(args: argparse.Namespace, point: tuple[str, int]) -> dict[str, Any]:
    import torch

    from bench.one_rank import one_rank_group, trainer
    from training.run.loop import plan_options
    from training.sizing.memory_plan import GIB, Dims, plan

    method, micro = point
    lora = method.startswith("lora")
    import training.run.trainer as trainer_mod

    real_build = trainer_mod.build_model

    def build_on_gpu(*a: Any, **k: Any) -> Any:
        # Random weights made on the GPU: initialising 7 B parameters on the host takes minutes and
        # measures nothing (the job loads its weights from files); FSDP2 shards them where they are.
        with torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"):
            return real_build(*a, **k)

    trainer_mod.build_model = build_on_gpu
    extra = [*(["--activation-checkpointing"] if method.endswith("-ac") else []), *args.extra.split()]
    t0 = time.time()
    with one_rank_group():
        torch._dynamo.config.automatic_dynamic_shapes = False
        if lora:
            import training.options.train as options_mod

            real_parse = options_mod.parse_args

            def parse_with_lora(argv: list[str]) -> Any:  # --init random with LoRA: see the docstring
                opts = real_parse(argv)
                return dataclasses.replace(opts, lora_rank=args.lora_rank, lora_alpha=args.lora_alpha)

            options_mod.parse_args = parse_with_lora
        tr = trainer(args.shape, args.seq_len, micro, args.steps, ["--global-batch-size", str(micro), *extra])
        built_s = time.time() - t0
        _note(f"{method}:{micro} built in {built_s:.0f} s")
        rows = []
        for i in range(args.steps):
            if i == args.warmup:
                torch.cuda.reset_peak_memory_stats()
            rows.append(tr.train_step())
            _note(
                f"{method}:{micro} step {i + 1}: {rows[-1]['step_time_s']:.3f} s, "
                f"{rows[-1]['peak_mem_gib']:.1f} GiB"
            )
        run_peak = max(r["peak_mem_gib"] for r in rows)
        measured_peak = torch.cuda.max_memory_allocated() / GIB
        capacity = torch.cuda.get_device_properties(0).total_memory
        dims = Dims.from_config(tr.model.config.to_dict())
        options = plan_options(
            tr.opts,
            shape=dims,
            world=1,
            local_world=1,
            kernels=(tr.compile, tr.liger, tr.liger_layers),
            capacity=capacity,
        )
        options["reshard_after_forward"] = tr.reshard_after_forward
        planned = plan(micro_batch=micro, accum=1, float8=tr.float8, **options)
        steady = rows[args.warmup :]
        times = [r["step_time_s"] for r in steady]
        tokens = micro * args.seq_len * len(steady)
        tps = tokens / sum(times)
        return {
            "point": f"{method}:{micro}",
            "shape": args.shape,
            "seq_len": args.seq_len,
            "lora_rank": args.lora_rank if lora else None,
            "trainable_params": sum(p.numel() for p in tr.model.parameters() if p.requires_grad),
            "params": tr.n_params,
            "device": tr.device_name,
            "compile": tr.compile,
            "liger": tr.liger,
            "float8": tr.float8,
            "reshard_after_forward": tr.reshard_after_forward,
            "activation_checkpointing": tr.opts.activation_checkpointing,
            "steps_measured": len(steady),
            "step_mean_s": round(statistics.mean(times), 5),
            "step_median_s": round(statistics.median(times), 5),
            "tokens_per_s": round(tps, 1),
            "flops_per_token": tr.flops_tok,
            "mfu": round(tps * tr.flops_tok / (tr.peak * 1e12), 4) if tr.peak else None,
            "loss_first_last": [rows[0]["loss"], rows[-1]["loss"]],
            "peak_allocated_gib_measured_steps": round(measured_peak, 3),
            "peak_allocated_gib_whole_run": round(run_peak, 3),
            "planned_allocated_gib": round(planned.allocated_bytes / GIB, 3),
            "planned_peak_moment": planned.peak_moment,
            "planned_device_gib": round(planned.device_bytes / GIB, 3),
            "plan_over_measured": round(planned.allocated_bytes / GIB / measured_peak, 4),
            "reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 3),
            "build_s": round(built_s, 1),
            "wall_s": round(time.time() - t0, 1),
        }


if __name__ == "__main__":
    sys.exit(main())

"""What a checkpoint costs the step: DCP's synchronous save against the asynchronous one the loop uses
(training/checkpoint/dcp.py save and AsyncSaver), on one GPU, through the loop's own trainer.

    python bench/checkpoint_stall.py --points lora:qwen2.5-7b:4096:4,full:qwen2.5-1.5b:2048:8
                                     [--saves 3] [--dir /tmp/ckpt-bench]

A point is METHOD:SHAPE:SEQ_LEN:MICRO_BATCH (METHOD lora or full, one micro-batch per step, random
weights and tokens, the GPU defaults of `python -m training`), measured in its own process:
- the steady step time (median of the steps before any save);
- synchronous: after a step, `save` to a local folder; the stall is its wall time, the host having
  waited for the GPU before and after;
- asynchronous: after a step, `AsyncSaver.start` (the copy off the GPU into pinned host memory), then
  steps go on while the write runs; its stall is the start's wall time plus what the steps during the
  write took beyond the steady step time (the writer thread competes for the host), and the write's
  own duration is reported beside it;
- the checkpoint's size on disk, and the ratio async stall / sync stall (the issue's goal: < 10 %).
One JSON line per point.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parse_point(text: str) -> tuple[str, str, int, int]:
    parts = text.split(":")
    if len(parts) != 4 or parts[0] not in ("lora", "full") or not (parts[2].isdigit() and parts[3].isdigit()):
        raise argparse.ArgumentTypeError(
            f"point {text!r}: METHOD:SHAPE:SEQ_LEN:MICRO_BATCH, METHOD lora or full"
        )
    return parts[0], parts[1], int(parts[2]), int(parts[3])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--points", default="lora:qwen2.5-7b:4096:4,full:qwen2.5-1.5b:2048:8")
    p.add_argument("--warmup", type=int, default=5, help="steps before measuring (compile, caches)")
    p.add_argument("--steady", type=int, default=5, help="steps timed before any save")
    p.add_argument("--saves", type=int, default=3, help="saves of each kind")
    p.add_argument("--dir", default="/tmp/ckpt-bench", help="local folder the checkpoints go to")  # noqa: S108
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p


def _note(line: str) -> None:
    print(f"[checkpoint_stall {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def _size(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def measure(  # noqa: PLR0915 (one measurement after another: build, warm up, sync saves, async saves)
    args: argparse.Namespace, point: tuple[str, str, int, int]
) -> dict[str, Any]:
    import dataclasses

    import torch

    import training.run.trainer as trainer_mod
    from bench.one_rank import one_rank_group, trainer
    from training.checkpoint import dcp

    method, shape, seq_len, micro = point
    real_build = trainer_mod.build_model

    def build_on_gpu(*a: Any, **k: Any) -> Any:  # random weights made on the GPU (bench/lora_bench.py)
        with torch.device("cuda", 0):
            return real_build(*a, **k)

    trainer_mod.build_model = build_on_gpu
    if method == "lora":  # --init random with LoRA: a benchmark needs the shape (bench/lora_bench.py)
        import training.options.train as options_mod

        real_parse = options_mod.parse_args
        options_mod.parse_args = lambda argv: dataclasses.replace(
            real_parse(argv), lora_rank=16, lora_alpha=32
        )
    total = args.warmup + args.steady + 2 * args.saves * 8 + 8
    with one_rank_group():
        torch._dynamo.config.automatic_dynamic_shapes = False
        tr = trainer(shape, seq_len, micro, total, ["--global-batch-size", str(micro)])
        for _ in range(args.warmup):
            tr.train_step()
        steady = [tr.train_step()["step_time_s"] for _ in range(args.steady)]
        step_s = statistics.median(steady)
        _note(f"{method} {shape}: steady step {step_s:.3f} s")
        root = Path(args.dir) / f"{method}-{shape}"
        shutil.rmtree(root, ignore_errors=True)
        sync_s, sizes = [], []
        for i in range(args.saves):
            tr.train_step()
            torch.cuda.synchronize()
            path = str(root / f"sync-{i}")
            t0 = time.perf_counter()
            dcp.save(path, tr.model, tr.optimizer, step=tr.step, position=tr.position)
            torch.cuda.synchronize()
            sync_s.append(time.perf_counter() - t0)
            sizes.append(_size(path))
            shutil.rmtree(path, ignore_errors=True)
            _note(f"sync save {i}: {sync_s[-1]:.2f} s, {sizes[-1] / 1e9:.2f} GB")
        saver = dcp.AsyncSaver(on_gpu=True)
        starts, overlaps, writes, during = [], [], [], []
        for i in range(args.saves):
            tr.train_step()
            torch.cuda.synchronize()
            path = str(root / f"async-{i}")
            t0 = time.perf_counter()
            future = saver.start(path, tr.model, tr.optimizer, step=tr.step, position=tr.position)
            torch.cuda.synchronize()
            starts.append(time.perf_counter() - t0)
            steps_during = []
            while not future.done():
                steps_during.append(tr.train_step()["step_time_s"])
            future.result()
            writes.append(time.perf_counter() - t0)
            overlaps.append(max(0.0, sum(steps_during) - len(steps_during) * step_s))
            during.append(len(steps_during))
            shutil.rmtree(path, ignore_errors=True)
            _note(f"async save {i}: start {starts[-1]:.3f} s, write {writes[-1]:.2f} s, "
                  f"{len(steps_during)} steps beside it (+{overlaps[-1]:.3f} s)")  # fmt: skip
        saver.close()
        sync = statistics.median(sync_s)
        async_stall = statistics.median([a + b for a, b in zip(starts, overlaps, strict=True)])
        return {
            "point": f"{method}:{shape}:{seq_len}:{micro}",
            "device": tr.device_name,
            "trainable_params": sum(p.numel() for p in tr.model.parameters() if p.requires_grad),
            "checkpoint_gb": round(statistics.median(sizes) / 1e9, 3),
            "step_s": round(step_s, 4),
            "sync_stall_s": [round(x, 3) for x in sync_s],
            "async_start_s": [round(x, 4) for x in starts],
            "async_overlap_s": [round(x, 4) for x in overlaps],
            "async_write_s": [round(x, 3) for x in writes],
            "steps_beside_write": during,
            "sync_stall_median_s": round(sync, 3),
            "async_stall_median_s": round(async_stall, 4),
            "async_over_sync": round(async_stall / sync, 4),
            "sync_write_gb_per_s": round(statistics.median(sizes) / 1e9 / sync, 3),
            "torch": torch.__version__,
        }


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args, parse_point(args.worker))), flush=True)
        return 0
    try:
        points = [parse_point(t.strip()) for t in args.points.split(",") if t.strip()]
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    rc = 0
    for point in points:
        text = ":".join(str(x) for x in point)
        cmd = [sys.executable, str(Path(__file__).resolve()), *(argv or sys.argv[1:]), "--worker", text]
        proc = subprocess.run(cmd, check=False, env=os.environ)  # noqa: S603 (this interpreter, this script)
        if proc.returncode:
            print(json.dumps({"point": text, "error": f"exit status {proc.returncode}"}), flush=True)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())

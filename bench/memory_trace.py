"""What is alive at a training step's memory peak, by tensor size: one rank of the loop's trainer on
one GPU (random weights of a named shape, random tokens, as bench/lora_bench.py builds it).

    python bench/memory_trace.py --shape qwen2.5-7b --seq-len 4096 --micro-batch 4 \
        [--lora-rank 16] [--activation-checkpointing] [--warmup 3]

Runs --warmup steps, then records one step with torch.cuda.memory._record_memory_history (sizes
only: recording Python stacks failed inside checkpointed autograd functions with a SystemError),
replays its alloc / free events to the largest total, and prints one JSON line (the allocated bytes
before the step, the step's peak) and the allocations alive then, grouped by size, largest first.
A size names its tensor: [tokens, ffn] bf16 is tokens x ffn x 2 bytes. Memory held before the step
(weights, optimizer state) is in the "before" figure, not in the groups.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def alive_at_peak(events: list[dict[str, Any]]) -> tuple[int, dict[int, dict[str, Any]]]:
    """(the largest total of the allocations made in the trace, those alive then by address)."""
    live: dict[int, dict[str, Any]] = {}
    total = best = 0
    best_set: dict[int, dict[str, Any]] = {}
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
        if total > best:
            best, best_set = total, dict(live)
    return best, best_set


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen2.5-7b")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--lora-rank", type=int, default=16, help="0: full fine-tune")
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)

    import torch

    import training.options.train as options_mod
    import training.run.trainer as trainer_mod
    from bench.one_rank import one_rank_group, trainer
    from training.sizing.memory_plan import GIB

    real_build, real_parse = trainer_mod.build_model, options_mod.parse_args

    def build_on_gpu(*a: Any, **k: Any) -> Any:  # random weights made where they are trained
        with torch.device("cuda", 0):
            return real_build(*a, **k)

    trainer_mod.build_model = build_on_gpu

    def parse_with_lora(argv: list[str]) -> Any:  # --init random with LoRA, as bench/lora_bench.py
        return dataclasses.replace(real_parse(argv), lora_rank=args.lora_rank, lora_alpha=args.lora_alpha)

    if args.lora_rank:
        options_mod.parse_args = parse_with_lora
    extra = ["--global-batch-size", str(args.micro_batch)]
    extra += ["--activation-checkpointing"] if args.activation_checkpointing else []
    with one_rank_group():
        torch._dynamo.config.automatic_dynamic_shapes = False
        tr = trainer(args.shape, args.seq_len, args.micro_batch, args.warmup + 1, extra)
        for _ in range(args.warmup):
            tr.train_step()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=2_000_000, context=None)
        tr.train_step()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        best, alive = alive_at_peak([e for trace in snapshot["device_traces"] for e in trace])
        peak = torch.cuda.max_memory_allocated()
        print(json.dumps({
            "shape": args.shape, "seq_len": args.seq_len, "micro_batch": args.micro_batch,
            "lora_rank": args.lora_rank, "activation_checkpointing": args.activation_checkpointing,
            "before_gib": round(before / GIB, 3), "peak_gib": round(peak / GIB, 3),
            "made_in_step_at_peak_gib": round(best / GIB, 3),
        }))  # fmt: skip
        by_size: collections.Counter[int] = collections.Counter(e["size"] for e in alive.values())
        for size, n in sorted(by_size.items(), key=lambda kv: -kv[0] * kv[1])[:25]:
            print(f"{size:>14,d} B x {n:4d} = {size * n / GIB:8.3f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

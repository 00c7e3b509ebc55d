"""Does float8 training follow bf16's loss? Same model, data and seed; one GPU; one process.

    python bench/float8_convergence.py [--steps 250] [--micro-batch 4] [--seq-len 2048]
                                       [--configs bf16,bf16-order2,float8] [--out FILE]

Learnable data, fixed and offline: the text of this Python installation's standard library
(sorted .py files, UTF-8 bytes as token ids, documents separated by byte 0), packed into blocks
of --seq-len with the training package's own `pack`. Each configuration runs the loop's own
`_Trainer` (the same model, FSDP2, compile, Liger loss and optimizer as `python -m training`)
on a one-rank process group, with the same LR schedule, for --steps steps:

- bf16: the GPU defaults with --no-float8;
- bf16-order2: the same with another data order: the run-to-run noise of this setup;
- float8: --float8 (torchao tensorwise float8 linears).

Prints one JSON line per configuration (losses every step, step times) and a final comparison:
the mean absolute loss difference over the last --tail steps of float8 against bf16, and of the
bf16 order-2 run against bf16 (the noise). float8 "follows bf16 within noise" when its
difference is no larger than the noise.
"""

from __future__ import annotations

import argparse
import gc
import json
import socket
import statistics
import sys
import sysconfig
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CONFIGS: dict[str, tuple[list[str], int]] = {  # options over the GPU defaults, data-order seed
    "bf16": (["--no-float8"], 0),
    "bf16-order2": (["--no-float8"], 1),
    "float8": (["--float8"], 0),
    "float8-ag": (["--float8", "--float8-all-gather"], 0),
}


def stdlib_corpus(seq_len: int, max_bytes: int) -> Any:
    """Blocks [n, seq_len] of byte ids from the standard library's .py files, in sorted order."""
    from training.data import pack

    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    docs, total = [], 0
    for f in files:
        data = f.read_bytes().replace(b"\x00", b"")
        if not data:
            continue
        docs.append(list(data))
        total += len(data) + 1
        if total >= max_bytes:
            break
    return pack(docs, seq_len, eos=0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(name: str, blocks: Any, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from training.loop import _Trainer
    from training.options import parse_args

    extra, order_seed = CONFIGS[name]
    opts = parse_args(
        ["--init", "random", "--shape", args.shape, "--data", "random", "--seq-len", str(args.seq_len),
         "--micro-batch-size", str(args.micro_batch), "--steps", str(args.steps), "--lr", str(args.lr),
         "--warmup-steps", str(args.steps // 10), "--seed", "0", *extra]
    )  # fmt: skip
    tr = _Trainer(opts, None, place=(0, 1, torch.device("cuda", 0)))
    # Same initial weights in every run (seed 0); the data order is the configuration's.
    tr.batches.blocks, tr.batches.seed = blocks, order_seed
    losses, times = [], []
    for _ in range(args.steps):
        m = tr.train_step()
        losses.append(m["loss"])
        times.append(m["step_time_s"])
    row = {
        "config": name,
        "float8_layers": len(tr.float8_layers),
        "final_loss_mean": statistics.fmean(losses[-args.tail :]),
        "step_time_s": statistics.fmean(times[5:]),
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "losses": losses,
    }
    del tr
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return row


def mean_abs_diff(a: list[float], b: list[float], tail: int) -> float:
    return statistics.fmean(abs(x - y) for x, y in zip(a[-tail:], b[-tail:], strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", default="bf16,bf16-order2,float8")
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--tail", type=int, default=50, help="steps compared at the end")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--out", help="also write the JSON lines to this file")
    args = parser.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or not configs:
        parser.error(f"--configs: any of {', '.join(CONFIGS)}; unknown: {unknown}")
    if not 1 <= args.tail <= args.steps:
        parser.error("--tail: between 1 and --steps")

    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU with FP8 tensor cores (float8)")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    blocks = stdlib_corpus(args.seq_len, max_bytes=args.steps * args.micro_batch * (args.seq_len + 1) * 2)
    lines: list[dict[str, Any]] = [
        {"environment": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                         "blocks": len(blocks), "steps": args.steps, "micro_batch": args.micro_batch,
                         "seq_len": args.seq_len, "lr": args.lr}}
    ]  # fmt: skip
    print(json.dumps(lines[0]), flush=True)
    rows = {}
    for name in configs:
        rows[name] = run(name, blocks, args)
        lines.append(rows[name])
        print(json.dumps(rows[name]), flush=True)
    if "bf16" not in rows:  # compare later with a bf16 run's lines (same seed, same data)
        _write(args.out, lines)
        dist.destroy_process_group()
        return 0
    base = rows["bf16"]["losses"]
    verdict: dict[str, Any] = {"tail_steps": args.tail}
    if "bf16-order2" in rows:
        verdict["noise_mean_abs_diff"] = mean_abs_diff(rows["bf16-order2"]["losses"], base, args.tail)
    for name in configs:
        if name.startswith("float8"):
            verdict[f"{name}_mean_abs_diff"] = mean_abs_diff(rows[name]["losses"], base, args.tail)
            final = rows[name]["final_loss_mean"] - rows["bf16"]["final_loss_mean"]
            verdict[f"{name}_final_minus_bf16"] = final
    lines.append({"comparison": verdict})
    print(json.dumps({"comparison": verdict}), flush=True)
    _write(args.out, lines)
    dist.destroy_process_group()
    return 0


def _write(path: str | None, lines: list[dict[str, Any]]) -> None:
    if path:
        Path(path).write_text("".join(json.dumps(x) + "\n" for x in lines))


if __name__ == "__main__":
    sys.exit(main())

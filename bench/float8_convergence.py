"""Does float8 training follow bf16's loss? Same model, data and initial weights; one GPU; one process.

    python bench/float8_convergence.py [--steps 250] [--micro-batch 4] [--seq-len 2048]
                                       [--configs bf16,float8] [--orders 0,1,2] [--out FILE]
    python bench/float8_convergence.py --compare FILE [FILE ...] [--tail 50]

Learnable data, fixed and offline: the text of this Python installation's standard library
(sorted .py files, UTF-8 bytes as token ids, documents separated by byte 0), packed into blocks
of --seq-len with the training package's own `pack`. Each configuration runs the loop's own
`_Trainer` (the same model, FSDP2, compile, Liger loss and optimizer as `python -m training`)
on a one-rank process group, with the same LR schedule, for --steps steps, once per data order
(--orders: the seeds of the loop's deterministic shuffle; the initial weights are always seed 0):

- bf16: the GPU defaults with --no-float8;
- float8: --float8 (torchao tensorwise float8 linears);
- float8-ag: --float8 --float8-all-gather;
- bf16-order2: bf16 with data order 1 whatever --orders says (the command of the first run in
  BENCHMARKS.md).

Prints one JSON line per run (losses every step, step times) and a final comparison over the
last --tail steps. The noise is what the data order alone does to bf16: the standard deviation of
bf16's tail means across orders. Each float8 variant is compared with bf16 on the same orders
(paired): the mean of its per-order differences, their spread, and a verdict: it follows bf16
within noise when the mean difference is no larger than the noise. With one order there is no
noise estimate and no verdict.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.args import int_list  # noqa: E402  (after the path: run as a script)
from bench.one_rank import one_rank_group, release, trainer  # noqa: E402

CONFIGS: dict[str, list[str]] = {  # options over the GPU defaults
    "bf16": ["--no-float8"],
    "float8": ["--float8"],
    "float8-ag": ["--float8", "--float8-all-gather"],
}
# Older name: bf16 on data order 1.
ALIASES: dict[str, tuple[str, int]] = {"bf16-order2": ("bf16", 1)}


def stdlib_corpus(seq_len: int, max_bytes: int) -> Any:
    """Blocks [n, seq_len] of byte ids from the standard library's .py files, in sorted order."""
    from training.data.batches import pack

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


def run(name: str, order_seed: int, blocks: Any, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    schedule = ["--lr", str(args.lr), "--warmup-steps", str(args.steps // 10)]
    tr = trainer(args.shape, args.seq_len, args.micro_batch, args.steps, [*schedule, *CONFIGS[name]])
    # Same initial weights in every run (seed 0); the data order is the configuration's.
    tr.batches.blocks, tr.batches.seed = blocks, order_seed
    losses, times = [], []
    for _ in range(args.steps):
        m = tr.train_step()
        losses.append(m["loss"])
        times.append(m["step_time_s"])
    row = {
        "config": name,
        "order": order_seed,
        "float8_layers": len(tr.float8_layers),
        "final_loss_mean": statistics.fmean(losses[-args.tail :]),
        "step_time_s": statistics.fmean(times[5:]),
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
        "losses": losses,
    }
    del tr
    release()
    return row


def mean_abs_diff(a: list[float], b: list[float], tail: int) -> float:
    return statistics.fmean(abs(x - y) for x, y in zip(a[-tail:], b[-tail:], strict=True))


def compare(rows: dict[tuple[str, int], dict[str, Any]], tail: int) -> dict[str, Any]:
    """The comparison line from the runs' rows, keyed (config, data order).

    noise: the sample standard deviation of bf16's tail means across its orders. For each float8
    variant, paired with bf16 on the orders both ran: the per-order differences of the tail means,
    their mean, and `within_noise` = |mean difference| <= noise (None without two bf16 orders).
    Also, for order 0 and 1 of bf16 and each variant's order 0, the mean absolute step-by-step
    difference to bf16's order 0 (the first run's measure)."""

    def tail_mean(key: tuple[str, int]) -> float:
        return statistics.fmean(rows[key]["losses"][-tail:])

    bf16 = sorted(order for name, order in rows if name == "bf16")
    out: dict[str, Any] = {"tail_steps": tail, "bf16_orders": bf16}
    noise = statistics.stdev([tail_mean(("bf16", o)) for o in bf16]) if len(bf16) >= 2 else None
    out["noise_stdev"] = noise
    if ("bf16", 0) in rows and ("bf16", 1) in rows:
        out["noise_mean_abs_diff"] = mean_abs_diff(
            rows[("bf16", 1)]["losses"], rows[("bf16", 0)]["losses"], tail
        )
    for name in sorted({n for n, _ in rows if n != "bf16"}):
        paired = sorted(o for n, o in rows if n == name and ("bf16", o) in rows)
        if not paired:
            continue
        diffs = [tail_mean((name, o)) - tail_mean(("bf16", o)) for o in paired]
        mean = statistics.fmean(diffs)
        out[name] = {
            "orders": paired,
            "tail_minus_bf16": diffs,
            "mean_difference": mean,
            "difference_stdev": statistics.stdev(diffs) if len(diffs) >= 2 else None,
            "within_noise": None if noise is None else abs(mean) <= noise,
        }
        if (name, 0) in rows and ("bf16", 0) in rows:
            out[name]["mean_abs_diff_order0"] = mean_abs_diff(
                rows[(name, 0)]["losses"], rows[("bf16", 0)]["losses"], tail
            )
    return out


def planned_runs(config: str, orders: list[int]) -> list[tuple[str, int]]:
    """(configuration, data order) pairs one --configs entry asks for."""
    return [ALIASES[config]] if config in ALIASES else [(config, o) for o in orders]


class CompareError(ValueError):
    """A --compare file that cannot be read or does not fit with the others."""


SAME_SETUP = ("steps", "micro_batch", "seq_len", "lr")


def load_runs(paths: list[str]) -> dict[tuple[str, int], dict[str, Any]]:
    """The runs of several --out files, keyed (config, order); CompareError naming the file when
    one is missing, malformed, duplicates a run or was made with another setup (SAME_SETUP)."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    setup: tuple[str, dict[str, Any]] | None = None
    for path in paths:
        try:
            lines = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
        except (OSError, ValueError) as exc:
            raise CompareError(f"{path}: not a readable --out file of this bench ({exc})") from None
        envs = [x["environment"] for x in lines if isinstance(x, dict) and "environment" in x]
        runs = [x for x in lines if isinstance(x, dict) and "config" in x and "losses" in x]
        if len(envs) != 1 or not runs:
            raise CompareError(f"{path}: expected one environment line and at least one run")
        this = {k: envs[0].get(k) for k in SAME_SETUP}
        if setup is None:
            setup = (path, this)
        elif this != setup[1]:
            raise CompareError(f"{path}: setup {this} differs from {setup[0]}'s {setup[1]}")
        for r in runs:
            key = (str(r["config"]), int(r["order"]))
            if key in rows:
                raise CompareError(f"{path}: run {key[0]} on order {key[1]} appears twice")
            rows[key] = r
    return rows


def _int_list(text: str) -> list[int]:
    return sorted(set(int_list(text, minimum=0, example="0,1,2")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--configs", default="bf16,float8", help=f"any of {', '.join([*CONFIGS, *ALIASES])}")
    parser.add_argument("--orders", type=_int_list, default=[0, 1, 2], help="data-order seeds, e.g. 0,1,2")
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--tail", type=int, default=50, help="steps compared at the end")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--out", help="also write the JSON lines to this file")
    parser.add_argument(
        "--compare", nargs="+", metavar="FILE", help="compare the runs of earlier --out files"
    )
    args = parser.parse_args(argv)
    if args.compare:
        try:
            saved = load_runs(args.compare)
        except CompareError as exc:
            parser.error(f"--compare: {exc}")
        if not 1 <= args.tail <= min(len(r["losses"]) for r in saved.values()):
            parser.error("--tail: between 1 and the runs' steps")
        print(json.dumps({"comparison": compare(saved, args.tail)}), flush=True)
        return 0
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS and c not in ALIASES]
    if unknown or not configs:
        parser.error(f"--configs: any of {', '.join([*CONFIGS, *ALIASES])}; unknown: {unknown}")
    if not 1 <= args.tail <= args.steps:
        parser.error("--tail: between 1 and --steps")

    import torch

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU with FP8 tensor cores (float8)")
    with one_rank_group():
        _run_all(configs, args)
    return 0


def _run_all(configs: list[str], args: argparse.Namespace) -> None:
    import torch

    blocks = stdlib_corpus(args.seq_len, max_bytes=args.steps * args.micro_batch * (args.seq_len + 1) * 2)
    lines: list[dict[str, Any]] = [
        {"environment": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                         "blocks": len(blocks), "steps": args.steps, "micro_batch": args.micro_batch,
                         "seq_len": args.seq_len, "lr": args.lr}}
    ]  # fmt: skip
    print(json.dumps(lines[0]), flush=True)
    runs = [run_ for c in configs for run_ in planned_runs(c, args.orders)]
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for name, order in dict.fromkeys(runs):  # each (config, order) once, in the order asked
        rows[(name, order)] = run(name, order, blocks, args)
        lines.append(rows[(name, order)])
        print(json.dumps(rows[(name, order)]), flush=True)
        _write(args.out, lines)  # after each run: a run cut short by a time limit keeps the others
    verdict = compare(rows, args.tail)
    lines.append({"comparison": verdict})
    print(json.dumps({"comparison": verdict}), flush=True)
    _write(args.out, lines)


def _write(path: str | None, lines: list[dict[str, Any]]) -> None:
    """Replaces the file whole (written beside it, then renamed): never a half-written line."""
    if path:
        tmp = Path(f"{path}.tmp")
        tmp.write_text("".join(json.dumps(x) + "\n" for x in lines))
        tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())

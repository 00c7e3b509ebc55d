"""Peak GPU memory of one training rank, through the project's own model and sharding code.

    python bench/memory_peaks.py [--variants compile,eager,compile-ac,eager-ac] [--batches 1,4,8,16]
                                 [--accum 1] [--seq-len 2048] [--shape qwen2.5-1.5b] [--steps 3]
                                 [--gpus 1] [--sharding full] [--no-liger]

Calibration data for the memory model (training/sizing/memory_plan.py). Each variant runs in its own
process (fresh CUDA context, process-wide compiler settings as the job sets them), without Ray: a
process group of --gpus ranks (NCCL on the GPU, gloo on the CPU), the model built, patched and
sharded by training.model.build (build_model, apply_liger, apply_fsdp, make_mesh) exactly as the
RayJob's loop does, its optimizer (training.run.optimizer with the job's default options), and the
loop's step: micro-batches with gradient sync only on the last one, loss / accum, backward, gradient
clipping, optimizer step, zero_grad(set_to_none).

For each (variant, micro-batch, accumulation) point it runs --steps steps and prints one JSON line
from rank 0: the peak of torch.cuda.max_memory_allocated and max_memory_reserved over the last
step (optimizer state present) and over all steps, the peak of the last step's forward, backward
and optimizer phases, what stays allocated between steps (master weights + Adam state), and the
device memory in use seen by the driver (CUDA context, NCCL buffers and the caching allocator's
reserve). A point that runs out of memory prints a line with "oom": true. Variants:

  compile      per-layer torch.compile + SwiGLU recompute (the GPU default of `python -m training`)
  eager        no compile
  compile-ac   compile + activation checkpointing
  eager-ac     no compile + activation checkpointing
  ...-float8   the same with torchao float8 linears (training.model.build.apply_float8; on GPUs with
               FP8 tensor cores), --float8-all-gather as the loop's option of that name

Liger's fused linear cross-entropy is on when liger-kernel is installed (as in the job), off with
--no-liger; Liger's layer kernels follow the job's default (only when the layers are not compiled).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.args import int_list  # noqa: E402  (after the path: run as a script)
from bench.one_rank import free_port  # noqa: E402

VARIANT_FLAGS = {"compile": "compile", "ac": "activation_checkpointing", "float8": "float8"}
BASE_VARIANTS = ("compile", "eager", "compile-ac", "eager-ac")


def parse_variant(name: str) -> dict[str, bool]:
    """'compile-ac-float8' -> {'compile': True, 'activation_checkpointing': True, 'float8': True}."""
    parts = name.split("-")
    if not parts or parts[0] not in ("compile", "eager") or len(set(parts)) != len(parts):
        raise argparse.ArgumentTypeError(
            f"variant {name!r}: compile or eager, then optionally -ac and/or -float8 (e.g. compile-ac)"
        )
    opts = {"compile": parts[0] == "compile", "activation_checkpointing": False, "float8": False}
    for part in parts[1:]:
        if part not in ("ac", "float8"):
            raise argparse.ArgumentTypeError(f"variant {name!r}: unknown part {part!r} (ac, float8)")
        opts[VARIANT_FLAGS[part]] = True
    return opts


def _int_list(text: str) -> list[int]:
    return int_list(text, minimum=1, example="1,4,8")


def float8_available() -> bool:
    """torchao is installed (training.model.build.apply_float8 needs it) and the GPU has FP8 tensor cores."""
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        return False
    import torch

    from training.model.precision import FLOAT8_MIN_CAPABILITY

    return torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= FLOAT8_MIN_CAPABILITY


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--variants",
        default=None,
        help="comma-separated (default: compile,eager,compile-ac,eager-ac, plus the same with "
        "-float8 where float8 runs)",
    )
    p.add_argument("--batches", type=_int_list, default=[1, 4, 8, 16], help="micro-batch sizes")
    p.add_argument(
        "--accum",
        type=_int_list,
        default=[1],
        help="micro-batches per optimizer step (>1 keeps FSDP's unsharded fp32 gradients between them)",
    )
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--shape", default="qwen2.5-1.5b")
    p.add_argument("--steps", type=int, default=3, help="steps per point; the last one is measured")
    p.add_argument("--gpus", type=int, default=1, help="ranks (one GPU each), to measure sharded states")
    p.add_argument("--sharding", choices=("full", "hsdp"), default="full")
    p.add_argument("--liger", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--float8-all-gather", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke run, no peaks")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one variant in this process
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2: the optimizer state exists from the second step on")
    if args.worker:
        return _spawn_ranks(args)
    f8 = float8_available()
    names = (
        [v.strip() for v in args.variants.split(",") if v.strip()]
        if args.variants
        else [*BASE_VARIANTS, *([f"{v}-float8" for v in BASE_VARIANTS] if f8 else [])]
    )
    for name in names:
        try:
            opts = parse_variant(name)
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
        if opts["float8"] and not f8:
            parser.error(f"variant {name!r}: float8 needs torchao and a GPU with FP8 tensor cores")
    rc = 0
    for name in names:
        # A process per variant: a fresh CUDA context, and compiler settings (process-wide, like
        # the job's) that do not leak into the next variant.
        cmd = [sys.executable, str(Path(__file__).resolve()), *(argv or sys.argv[1:]), "--worker", name]
        proc = subprocess.run(cmd, check=False)  # noqa: S603 (this interpreter, this script)
        if proc.returncode:
            print(json.dumps({"variant": name, "error": f"exit status {proc.returncode}"}), flush=True)
            rc = 1
    return rc


def _spawn_ranks(args: argparse.Namespace) -> int:
    # A free port, not a fixed one: other process groups may run on the machine.
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    if args.gpus == 1:
        _rank_main(0, args)
        return 0
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(args,), nprocs=args.gpus, join=True)
    return 0


def _rank_main(rank: int, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(args.gpus), LOCAL_RANK=str(rank))
    on_gpu = args.device == "cuda"
    if on_gpu:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    dist.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=args.gpus)
    try:
        for line in measure_variant(args.worker, args, device):
            if rank == 0:
                print(json.dumps(line), flush=True)
    finally:
        dist.destroy_process_group()


def _gib(n: float | int) -> float:
    return round(n / 2**30, 3)


def measure_variant(name: str, args: argparse.Namespace, device: Any) -> list[dict[str, Any]]:
    import importlib.util

    import torch
    import torch.distributed as dist

    from training.model import build as tm
    from training.options.train import build_parser
    from training.run.optimizer import build_optimizer

    opts = parse_variant(name)
    on_gpu = device.type == "cuda"
    # The job compiles for one fixed micro-batch: keep each batch size's graph static here too
    # (dynamo would otherwise recompile with a symbolic batch dimension after the first change).
    torch._dynamo.config.automatic_dynamic_shapes = False
    liger = (importlib.util.find_spec("liger_kernel") is not None) if args.liger is None else args.liger
    world = dist.get_world_size()
    t0 = time.time()
    model = tm.build_model("random", args.shape, "", seed=0)
    # The loop's order (training/run/trainer.py _choose_kernels): Liger, then float8, then fully_shard.
    if liger:
        tm.apply_liger(model, layers=not opts["compile"])
    if opts["float8"]:
        tm.apply_float8(model, all_gather=args.float8_all_gather)
    mesh = tm.make_mesh(device.type, args.sharding, world, world if args.sharding == "full" else 1)
    model = tm.apply_fsdp(
        model,
        mesh,
        compile_layers=opts["compile"],
        activation_checkpointing=opts["activation_checkpointing"],
        reshard_after_forward=args.reshard_after_forward,
    )
    model.train()
    if on_gpu:
        torch.cuda.synchronize(device)
    sharded = torch.cuda.memory_allocated(device) if on_gpu else 0
    # The job's optimizer with the job's defaults: AdamW's parameter groups (weight decay on matrices
    # only) and its state are what take memory; neither rate changes how much.
    defaults = build_parser()
    optimizer = build_optimizer(
        model,
        lr=defaults.get_default("lr"),
        weight_decay=defaults.get_default("weight_decay"),
        fused=on_gpu,
    )
    mcfg: Any = model.config
    vocab = int(mcfg.vocab_size)
    base = {
        "variant": name,
        **opts,
        "liger": liger,
        "shape": args.shape,
        "seq_len": args.seq_len,
        "world": world,
        "sharding": args.sharding,
        "float8_all_gather": bool(opts["float8"] and args.float8_all_gather),
        "reshard_after_forward": args.reshard_after_forward,
        "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
        "device_total_gib": _gib(torch.cuda.get_device_properties(device).total_memory) if on_gpu else None,
        "torch": torch.__version__,
        "params_sharded_gib": _gib(sharded),
        "build_s": round(time.time() - t0, 1),
    }
    lines = []
    for accum in sorted(args.accum):
        for batch in sorted(args.batches):
            point = {**base, "micro_batch": batch, "accum": accum}
            try:
                point.update(
                    _measure_point(
                        model, optimizer, vocab, batch=batch, accum=accum, args=args, device=device
                    )
                )
            except torch.OutOfMemoryError as exc:
                # FSDP's state is left mid-step: later points of this process would not be clean.
                point.update(oom=True, error=str(exc).splitlines()[0][:300])
                lines.append(point)
                return lines
            lines.append(point)
            if on_gpu:
                torch.cuda.empty_cache()
    return lines


def _measure_point(
    model: Any, optimizer: Any, vocab: int, *, batch: int, accum: int, args: argparse.Namespace, device: Any
) -> dict[str, Any]:
    import torch

    on_gpu = device.type == "cuda"
    cuda = torch.cuda
    phases: dict[str, int] = {}

    def phase_start() -> None:
        if on_gpu:
            cuda.synchronize(device)
            cuda.reset_peak_memory_stats(device)

    def phase_end(key: str) -> None:
        if on_gpu:
            cuda.synchronize(device)
            peak = cuda.max_memory_allocated(device)
            phases[key] = max(phases.get(key, 0), peak)
            phases["reserved"] = max(phases.get("reserved", 0), cuda.max_memory_reserved(device))

    overall, overall_reserved = 0, 0
    t0 = time.time()
    gen = torch.Generator().manual_seed(0)
    for step in range(args.steps):
        measured = step == args.steps - 1
        if measured:
            phases.clear()
        for mb in range(accum):
            ids = torch.randint(0, vocab, (batch, args.seq_len), generator=gen).to(device)
            model.set_requires_gradient_sync(mb == accum - 1)
            phase_start()
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss / accum
            phase_end(f"forward_mb{mb}")
            phase_start()
            loss.backward()
            phase_end(f"backward_mb{mb}")
            del loss
        phase_start()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        phase_end("optimizer")
        if on_gpu:
            overall = max(overall, *(v for k, v in phases.items() if k != "reserved"))
            overall_reserved = max(overall_reserved, phases["reserved"])
    if not on_gpu:
        return {"peak_allocated_gib": None, "seconds": round(time.time() - t0, 1)}
    cuda.synchronize(device)
    free, total = cuda.mem_get_info(device)
    step_peak = max(v for k, v in phases.items() if k != "reserved")
    return {
        "peak_allocated_gib": _gib(step_peak),
        "peak_reserved_gib": _gib(phases["reserved"]),
        "peak_allocated_all_steps_gib": _gib(overall),
        "peak_reserved_all_steps_gib": _gib(overall_reserved),
        "phase_peaks_gib": {k: _gib(v) for k, v in phases.items() if k != "reserved"},
        "between_steps_gib": _gib(cuda.memory_allocated(device)),
        "device_used_gib": _gib(total - free),
        "seconds": round(time.time() - t0, 1),
    }


if __name__ == "__main__":
    sys.exit(main())

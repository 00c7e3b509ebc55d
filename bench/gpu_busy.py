"""Is a training step launch-bound? How much of a host-synced step the GPU spends working.

    python bench/gpu_busy.py [--configs bf16,float8,...] [--micro-batch 8] [--accum 1] [--seq-len 2048]
                             [--warmup 6] [--steps 4] [--out FILE]

Each configuration runs the loop's own `_Trainer` (the GPU defaults of `python -m training`:
FSDP2, per-layer compile, Liger loss, fused AdamW; one rank, random tokens, as
bench/float8_convergence.py builds it) for --warmup steps (compilation, allocator warm-up), times
--steps steps without the profiler, then --steps more under torch.profiler recording only CUDA
activity (CUPTI: kernels, copies, memsets; no CPU-side op records, so the host launches at close
to its unprofiled pace).

One JSON line per configuration: the host-synced step time without and with the profiler, the
GPU's busy time (the union of all its activity intervals) as a share of the profiled steps' wall
time, the idle time per step and the largest gaps, kernels per step, their median duration and
the share shorter than 10 us, and where the GPU waits (`idle_sites`: the idle time summed by the
kernel or copy each gap ends in, the work the GPU was waiting to be given) and where it works
(`gpu_time_by_kernel`: each kernel's, copy's and memset's time summed by name). The idle share bounds
what CUDA graphs could gain by removing launch gaps: a step whose GPU is busy 98 % of its wall
time cannot get more than 2 % faster from them.
`host_ms_per_step` splits the unprofiled steps' wall time into the host's phases, read without a
sync inside the step (HostPhases): where the GPU idles, they say which host work bounds the step.

A configuration name may end in any of the inductor settings below (-cppwrapper, -combo, -autotune,
-cdtune).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.one_rank import one_rank_group, release, trainer  # noqa: E402  (after the path: run as a script)

# Options over the GPU defaults of `python -m training`. "-before": the defaults before 2026-12-02
# (Liger's own loss chunks, every guard evaluated), which earlier tables in BENCHMARKS.md measured;
# "-chunk4096": Liger's loss in chunks of 4,096 tokens (the default on GPUs of 40 GiB or more since);
# "-ownchunks": Liger's own ~64 chunks; "-gathered": parameters kept gathered for the whole step;
# "-skipguards" / "-guards": --skip-guard-eval on / off.
CONFIGS: dict[str, list[str]] = {
    "bf16": ["--no-float8"],
    "float8": ["--float8"],
    # FSDP all-gathers the float8 weights, their scales computed once per step (one amax per weight
    # after the optimizer step instead of each layer's amax and cast in every forward).
    "float8-ag": ["--float8", "--float8-all-gather"],
    # Activation checkpointing (prod's default on the L4): each layer's forward again in its backward.
    "bf16-ac": ["--no-float8", "--activation-checkpointing"],
    "bf16-before": ["--no-float8", "--loss-chunk-tokens", "0", "--no-skip-guard-eval"],
    "float8-before": ["--float8", "--loss-chunk-tokens", "0", "--no-skip-guard-eval"],
    "float8-ownchunks": ["--float8", "--loss-chunk-tokens", "0", "--skip-guard-eval"],
    "bf16-chunk4096-guards": ["--no-float8", "--loss-chunk-tokens", "4096", "--no-skip-guard-eval"],
    "float8-chunk4096": ["--float8", "--loss-chunk-tokens", "4096", "--skip-guard-eval"],
    "bf16-gathered": ["--no-float8", "--no-reshard-after-forward"],
    "float8-gathered": ["--float8", "--no-reshard-after-forward"],
    # Since 2026-12-03 the defaults keep parameters gathered where the memory plan allows (bf16 and
    # float8 above then run gathered on an H200); "-resharded" frees them after each forward as before.
    "bf16-resharded": ["--no-float8", "--reshard-after-forward"],
    "float8-resharded": ["--float8", "--reshard-after-forward"],
    "bf16-gathered-chunk4096-guards": [
        "--no-float8", "--no-reshard-after-forward", "--loss-chunk-tokens", "4096", "--no-skip-guard-eval",
    ],
    "bf16-gathered-chunk4096-skipguards": [
        "--no-float8", "--no-reshard-after-forward", "--loss-chunk-tokens", "4096", "--skip-guard-eval",
    ],
    "float8-gathered-chunk4096": [
        "--float8", "--no-reshard-after-forward", "--loss-chunk-tokens", "4096", "--skip-guard-eval",
    ],
}  # fmt: skip
# Compiler settings a configuration name may end with (issue 30: host time at small micro-batches):
# "-cppwrapper": inductor's C++ wrapper instead of its Python one around each compiled layer's kernels;
# "-combo": inductor's combo kernels (independent small kernels launched as one); "-autotune": each
# matrix multiply of the compiled layers (float8's scaled ones included) timed against inductor's Triton
# templates, the fastest kept (max_autotune_gemm, without max-autotune's CUDA graphs; on the H200 at
# 8 x 2048 it was still autotuning after 8.5 minutes, BENCHMARKS.md); "-cdtune":
# coordinate-descent tuning of the generated pointwise and reduction kernels' block sizes.
COMPILER_SETTINGS = {
    "-cppwrapper": "cpp_wrapper",
    "-combo": "combo_kernels",
    "-autotune": "max_autotune_gemm",
    "-cdtune": "coordinate_descent_tuning",
}


def split_config(name: str) -> tuple[str, set[str]]:
    """(configuration in CONFIGS, compiler suffixes) of a name such as bf16-gathered-cppwrapper."""
    suffixes: set[str] = set()
    changed = True
    while changed:
        changed = False
        for suffix in COMPILER_SETTINGS:
            if name.endswith(suffix) and name[: -len(suffix)]:
                name, changed = name[: -len(suffix)], True
                suffixes.add(suffix)
    return name, suffixes


class HostPhases:
    """Host time of a step's phases, read without waiting for the GPU inside the step. Where the
    host is the bottleneck (the GPU idles while it launches), that is the phase's host cost; where
    the GPU is, it includes the host's waits (Liger's fused loss reads its target count with
    .item() in every forward). forward: the model's call with FSDP2's root hooks, the loss
    included; backward: the rest of the micro-batches (their backward and the copies of their
    tokens to the GPU); clip / optimizer / zero_grad: per step; other: the step's remaining wall
    time (learning rate, the step's tokens and labels, the gradient norm's full_tensor, the loss
    all-reduce, float8 scales with float8 all-gather, and the wait for the GPU at the step's end).

    A context manager: on entry it times the trainer's `_micro_batches`, its optimizer's `step`
    and `zero_grad`, the model's forward and `torch.nn.utils.clip_grad_norm_` (as the loop looks
    it up at each step); on exit, however the steps ended, all are as they were."""

    PHASES = ("forward", "micro_batches", "clip", "optimizer", "zero_grad")

    def __init__(self, tr: Any) -> None:
        self.total: dict[str, float] = dict.fromkeys(self.PHASES, 0.0)
        self.calls: dict[str, int] = dict.fromkeys(self.PHASES, 0)
        self._tr = tr
        self._t0 = 0.0
        self._undo: list[Any] = []

    def __enter__(self) -> HostPhases:
        import torch

        tr = self._tr
        try:
            pre = tr.model.register_forward_pre_hook(self._forward_start, prepend=True)
            self._undo.append(pre.remove)
            post = tr.model.register_forward_hook(self._forward_end, always_call=True)
            self._undo.append(post.remove)
            targets = [
                (tr, "_micro_batches", "micro_batches"),
                (tr.optimizer, "step", "optimizer"),
                (tr.optimizer, "zero_grad", "zero_grad"),
                (torch.nn.utils, "clip_grad_norm_", "clip"),
            ]
            for obj, name, phase in targets:
                self._patch(obj, name, phase)
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self._restore()

    def _patch(self, obj: Any, name: str, phase: str) -> None:
        """Put a timed wrapper over obj.name as an instance attribute; undo removes it again
        (or puts back what the instance itself held)."""
        own = name in vars(obj)
        saved = getattr(obj, name)
        setattr(obj, name, self._timed(phase, saved))
        self._undo.append(lambda: setattr(obj, name, saved) if own else delattr(obj, name))

    def _restore(self) -> None:
        while self._undo:
            self._undo.pop()()

    def _timed(self, phase: str, fn: Any) -> Any:
        def run(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.total[phase] += time.perf_counter() - t0
                self.calls[phase] += 1

        return run

    def _forward_start(self, *_: Any) -> None:
        self._t0 = time.perf_counter()

    def _forward_end(self, *_: Any) -> None:
        self.total["forward"] += time.perf_counter() - self._t0
        self.calls["forward"] += 1

    def per_step_ms(self, step_times_s: list[float]) -> dict[str, float]:
        """Each phase's host ms per step over the steps timed (`step_times_s`, host-synced)."""
        steps = len(step_times_s)
        t = {k: v / steps * 1e3 for k, v in self.total.items()}
        out = {
            "forward": t["forward"],
            "backward": t["micro_batches"] - t["forward"],
            "clip": t["clip"],
            "optimizer": t["optimizer"],
            "zero_grad": t["zero_grad"],
        }
        out["other"] = sum(step_times_s) / steps * 1e3 - sum(out.values())
        return {k: round(v, 2) for k, v in out.items()}


def busy_and_gaps(intervals: list[tuple[int, int]]) -> tuple[int, list[int]]:
    """(time covered by the union of [start, end) intervals, the gaps between the merged
    intervals in time order). Overlapping work on several streams counts once."""
    busy, gaps, cur_start, cur_end = 0, [], None, None
    for start, end in sorted(intervals):
        if cur_end is None or cur_start is None:
            cur_start, cur_end = start, end
        elif start > cur_end:
            busy += cur_end - cur_start
            gaps.append(start - cur_end)
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        busy += cur_end - cur_start
    return busy, gaps


def idle_sites(events: list[tuple[int, int, str]], steps: int, top: int = 8) -> list[dict[str, Any]]:
    """Where the GPU waits: each gap between the merged activity intervals of `events` (start,
    end, name) charged to the activity that ends it (the work the GPU waited to be given), summed
    by that activity's name, the largest `top` totals first, in ms per step over `steps`, with how
    many gaps and the name of the activity each most often followed."""
    sites: dict[str, dict[str, Any]] = {}
    cur_end, cur_name = None, ""
    for start, end, name in sorted(events):
        if cur_end is not None and start > cur_end:
            site = sites.setdefault(name, {"ns": 0, "gaps": 0, "after": {}})
            site["ns"] += start - cur_end
            site["gaps"] += 1
            site["after"][cur_name] = site["after"].get(cur_name, 0) + 1
        if cur_end is None or end > cur_end:
            cur_end, cur_name = end, name
    ranked = sorted(sites.items(), key=lambda kv: kv[1]["ns"], reverse=True)[:top]
    return [
        {
            "waiting_for": _short(name),
            "idle_ms_per_step": round(site["ns"] / steps / 1e6, 3),
            "gaps_per_step": site["gaps"] / steps,
            "mostly_after": _short(max(site["after"], key=site["after"].get)),
        }
        for name, site in ranked
    ]


def gpu_time_by_kernel(events: list[tuple[int, int, str]], steps: int, top: int = 15) -> list[dict[str, Any]]:
    """Where the GPU's work goes: each activity's duration summed by its name (a kernel, copy or
    memset), the largest `top` totals first, in ms per step over `steps`, with how many ran per
    step. Overlapping work is counted in full for each name, so the totals may exceed the busy time."""
    time_ns: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    for start, end, name in events:
        time_ns[name] += end - start
        runs[name] += 1
    return [
        {"name": _short(name), "ms_per_step": round(ns / steps / 1e6, 3), "per_step": runs[name] / steps}
        for name, ns in time_ns.most_common(top)
    ]


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def summarize(
    intervals_ns: list[tuple[int, int]], kernel_durations_ns: list[int], step_times_s: list[float]
) -> dict[str, Any]:
    """The profile's figures: `intervals_ns` are every device activity of the profiled steps,
    `kernel_durations_ns` the kernels' alone, `step_times_s` the same steps' host-synced times."""
    steps = len(step_times_s)
    wall_ns = sum(step_times_s) * 1e9
    busy, gaps = busy_and_gaps(intervals_ns)
    return {
        "steps": steps,
        "step_time_s": sum(step_times_s) / steps,
        "gpu_busy_share": busy / wall_ns,
        "idle_ms_per_step": (wall_ns - busy) / steps / 1e6,
        "largest_gaps_ms": [g / 1e6 for g in sorted(gaps, reverse=True)[:5]],
        "gaps_over_100us_per_step": sum(g > 100_000 for g in gaps) / steps,
        "kernels_per_step": len(kernel_durations_ns) / steps,
        "kernel_median_us": statistics.median(kernel_durations_ns) / 1e3 if kernel_durations_ns else None,
        "kernels_under_10us_share": (
            sum(d < 10_000 for d in kernel_durations_ns) / len(kernel_durations_ns)
            if kernel_durations_ns
            else None
        ),
    }


def profile(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One configuration's row; the compiler settings and the GPU's memory are reset after it,
    however it ended."""
    import torch._inductor.config as inductor_config

    steps = args.warmup + 2 * args.steps
    batch = ["--global-batch-size", str(args.micro_batch * args.accum)]
    base, suffixes = split_config(name)
    saved = {attr: getattr(inductor_config, attr) for attr in COMPILER_SETTINGS.values()}
    for suffix in suffixes:
        setattr(inductor_config, COMPILER_SETTINGS[suffix], True)
    try:
        return _profile_one(name, args, steps, [*CONFIGS[base], *batch])
    finally:
        for attr, value in saved.items():
            setattr(inductor_config, attr, value)
        release()


def _profile_one(name: str, args: argparse.Namespace, steps: int, extra: list[str]) -> dict[str, Any]:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    tr = trainer(args.shape, args.seq_len, args.micro_batch, steps, extra)
    for _ in range(args.warmup):
        tr.train_step()
    with HostPhases(tr) as phases:
        plain = [tr.train_step()["step_time_s"] for _ in range(args.steps)]
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        profiled = [tr.train_step()["step_time_s"] for _ in range(args.steps)]
    results = prof.profiler.kineto_results if prof.profiler else None
    events = [e for e in (results.events() if results else []) if e.device_type() == DeviceType.CUDA]
    named = [(e.start_ns(), e.start_ns() + e.duration_ns(), e.name()) for e in events]
    intervals = [(start, end) for start, end, _ in named]
    # Copies and memsets count as busy; only kernels are counted and sized as launches.
    kernels = [e.duration_ns() for e in events if not e.name().startswith(("Memcpy", "Memset"))]
    row = {"config": name, "micro_batch": args.micro_batch, "accum": args.accum, "seq_len": args.seq_len,
           "step_time_unprofiled_s": statistics.fmean(plain),
           "tokens_per_s": args.micro_batch * args.accum * args.seq_len / statistics.fmean(plain),
           "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
           "host_ms_per_step": phases.per_step_ms(plain),
           "reshard_after_forward": tr.reshard_after_forward}  # as run (the plan's if unset)  # fmt: skip
    row.update(summarize(intervals, kernels, profiled))
    row["idle_sites"] = idle_sites(named, len(profiled))
    row["gpu_time_by_kernel"] = gpu_time_by_kernel(named, len(profiled))
    del tr, prof
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--configs",
        default="bf16,float8",
        help=f"any of {', '.join(CONFIGS)}, each optionally ending in "
        f"one or more of {', '.join(COMPILER_SETTINGS)}; a name given twice runs twice",
    )
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--warmup", type=int, default=6, help="steps before any is measured")
    parser.add_argument("--steps", type=int, default=4, help="steps measured, with and without the profiler")
    parser.add_argument("--out", help="also write the JSON lines to this file")
    args = parser.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if split_config(c)[0] not in CONFIGS]
    if unknown or not configs:
        parser.error(
            f"--configs: any of {', '.join(CONFIGS)}, each optionally ending in one or more of "
            f"{', '.join(COMPILER_SETTINGS)}; unknown: {unknown}"
        )
    for flag in ("micro_batch", "accum", "seq_len", "warmup", "steps"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')}: a positive integer")

    import torch

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (the profile is of the GPU's timeline)")
    with one_rank_group():
        _profile_all(configs, args)
    return 0


def _profile_all(configs: list[str], args: argparse.Namespace) -> None:
    import torch

    lines: list[dict[str, Any]] = [
        {"environment": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}}
    ]
    print(json.dumps(lines[0]), flush=True)
    for name in configs:  # a name given twice runs twice: the run-to-run spread
        lines.append(profile(name, args))
        print(json.dumps(lines[-1]), flush=True)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(x) + "\n" for x in lines))


if __name__ == "__main__":
    sys.exit(main())

"""`raytrain plan --env NAME`: will the environment's training job fit its GPUs?

Prints one rank's peak GPU memory, term by term (training/sizing/memory_plan.py: sharded fp32 master
weights and AdamW state, gradients, FSDP's unsharded gradients when accumulating, gathered bf16
parameters, activations, the loss, allocator slack, CUDA context, NCCL), against the memory of one
GPU of the node group's instance type, then the largest micro-batch per sequence length for that
GPU, then the step-time model's prediction and what the job costs. Offline: it reads only the
settings, the catalogue and the pinned prices (config/prices.py); `--live` asks the AWS Price List
API for the instance rates, as `raytrain cost --live` does. Where no price is known (a region the
pinned table lacks, without --live) the fit and the speed are shown and the cost says why it is
missing.

Exit status: 0 the job fits, 1 it does not (synthesis refuses it too), 2 the settings are unusable.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from config.loader import SettingsError, config_dir_argument, env_argument, load_settings
from config.memory import (
    accumulation,
    capacity_bytes,
    fit_problem,
    job_memory,
    largest_micro_batch_for,
)
from config.prices import PriceError, RegionPrices
from config.settings import Settings
from config.settings.infrastructure import CapacityType
from config.settings.teams import queue_summary
from config.step_prediction import predict
from raytrain.cost import estimate, optional_prices
from raytrain.interruptions import interruptions
from raytrain.interruptions import lines as interruption_lines
from raytrain.plan_compare import EXIT_DOES_NOT_FIT, EXIT_FITS, EXIT_UNUSABLE
from raytrain.plan_compare import run as compare
from training.model.sharding import mesh_shape
from training.sizing.loss_chunks import LOSS_CHUNK_TOKENS
from training.sizing.memory_plan import AUTO_HEADROOM, GIB

SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="per-GPU memory plan of the environment's training job, and the largest micro-batch",
        description=(__doc__ or "").split("\n\n", 1)[0],
    )
    env_argument(parser)
    config_dir_argument(parser)
    parser.add_argument(
        "--json", action="store_true", help="print the memory plan and the predicted step as JSON"
    )
    parser.add_argument(
        "--compare",
        nargs="+",
        metavar="MODEL",
        help="instead: the job with each of these models (catalogue names such as qwen2.5-7b, Hugging "
        "Face ids, or local config.json files or folders holding one), full fine-tune and LoRA, HSDP and "
        "full sharding, side by side; exits 0 when a row fits, 1 when none does, 2 when all are refused",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="price the job with instance rates from the AWS Price List API (needs credentials), as "
        "raytrain cost --live does; without it, the pinned prices (a region they lack shows no cost)",
    )
    parser.add_argument("--profile", help="AWS profile for --live (default: the usual credential chain)")
    parser.set_defaults(func=run)


def speed(
    settings: Settings,
    prices: RegionPrices | None = None,
    spot: float | None = None,
    price_problem: str | None = None,
) -> dict[str, Any]:
    """Predicted step, job time and cost, and what each alternative would change (unmeasured on
    this hardware unless BENCHMARKS.md says so). The cost fields are None where no price is known
    (`cost_notes` says why); `price_problem`: why --live could not ask AWS."""
    job = settings.job
    base = predict(settings)
    notes = [price_problem] if price_problem else []
    per_hour: float | None
    od_per_hour: float | None = None
    try:
        est = estimate(settings, prices, spot_per_hour=spot)
    except PriceError as exc:
        per_hour = None
        notes.append(f"not priced: {exc}")
    else:
        per_hour = est.running_with(job.nodes)
        od_per_hour = est.running_on_demand_with(job.nodes)
        notes.extend(est.notes)
    world = settings.num_workers
    options = base.inputs
    alternatives = {
        "accumulate 2x more": dict(accum=options["accum"] * 2),
        # Not for LoRA: its frozen bf16 base is not converted, and the job refuses job.float8 with it.
        **(
            {"float8 on" if not options["float8"] else "float8 off": dict(float8=not options["float8"])}
            if job.lora is None
            else {}
        ),
        **(
            {
                f"Liger loss in {LOSS_CHUNK_TOKENS:,}-token chunks (--loss-chunk-tokens {LOSS_CHUNK_TOKENS}; "
                "more memory: raytrain plan's table)": dict(loss_chunk_tokens=LOSS_CHUNK_TOKENS)
            }
            if options["loss_chunk_tokens"] != LOSS_CHUNK_TOKENS
            else {}
        ),
        **_larger_micro_batch(settings, options),
        **_checkpointing_for_auto(settings, options),
        "full sharding" if len(options["mesh"]) == 2 else "HSDP": dict(
            mesh=(world,)
            if len(options["mesh"]) == 2
            else mesh_shape("hsdp", world, settings.gpu_nodes.instance.gpus)
        ),
    }
    moves = []
    for name, change in alternatives.items():
        alt = predict(settings, **change)
        moves.append(
            {"change": name, "tokens_per_s": alt.tokens_per_s, "vs_now": alt.tokens_per_s / base.tokens_per_s}
        )
    hours = job.steps * base.step_s / 3600
    # With job.epochs the step count is known only once the data is prepared (`raytrain data check`
    # prints it): the job's time and cost are then shown per job.steps steps, and said so.
    per_steps = (
        None
        if job.epochs is None
        else f"job.epochs {job.epochs:g} sets the steps once the data is prepared (`raytrain data check "
        f"--env {settings.name}` prints them): the job time and cost here are for {job.steps} steps"
    )
    return {
        "job_steps": job.steps,
        "steps_note": per_steps,
        "interruptions": interruptions(settings, base.step_s, per_hour, od_per_hour),
        "predicted": base.as_dict(),
        "job_hours": hours,
        "job_cost_usd": None if per_hour is None else hours * per_hour,
        "running_per_hour_usd": per_hour,
        "usd_per_billion_tokens": None if per_hour is None else per_hour / (base.tokens_per_s * 3600) * 1e9,
        # How the GPU nodes are priced (Spot at its ceiling, a Capacity Block left out: config/costs.py),
        # or why they are not.
        "cost_notes": notes,
        "moves": sorted(moves, key=lambda m: -m["vs_now"]),
        "checked": "the step is the GPU's work and the host's overlapped (the longer of the two, a "
        "little more when they are close), plus the exposed communication; the job time is "
        f"{job.steps} steps of it (no start-up, image pull, evaluation or idle nodes); "
        "'accumulate 2x more' doubles the global batch (a training choice, not a free speed-up). "
        "The model is checked against H200 runs and the AWS sample's 2 x g6.12xlarge figures "
        f"(tests/test_step_time.py); no {settings.gpu_nodes.instance.gpu_model} step of this job on "
        f"{settings.gpu_nodes.instance_type} has been measured",
    }


def _checkpointing_for_auto(settings: Settings, options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """With `micro_batch_size: auto` and no activation checkpointing: what auto would take with it
    (each layer then keeps only its input, so a larger micro-batch leaves the headroom)."""
    job, gpu = settings.job, settings.gpu_nodes.instance
    if job.micro_batch_size != "auto" or job.activation_checkpointing:
        return {}
    micro = job.model_copy(update={"activation_checkpointing": True}).micro_batch(gpu)
    if micro <= options["micro_batch"]:
        return {}
    accum = accumulation(job.global_batch_size, micro, settings.num_workers)
    name = (
        f"activation checkpointing on (auto then takes micro-batch {micro} x {accum}; recompute "
        "from FLOPs, not measured)"
    )
    return {name: dict(micro_batch=micro, accum=accum, activation_checkpointing=True)}


def _larger_micro_batch(settings: Settings, options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The same global batch in half the micro-batches (none to halve at one per step), with
    activation checkpointing where the memory plan says it needs it; nothing when neither fits."""
    if options["accum"] % 2:
        return {}
    job, gpu = settings.job, settings.gpu_nodes.instance
    change: dict[str, Any] = dict(micro_batch=options["micro_batch"] * 2, accum=options["accum"] // 2)
    twice = job.model_copy(update={"micro_batch_size": change["micro_batch"]})
    nodes = settings.num_workers // gpu.gpus
    need = job_memory(twice, gpu, nodes)
    if need.fits(capacity_bytes(gpu)):
        free = 1 - need.device_bytes / capacity_bytes(gpu)
        name = f"micro-batch {change['micro_batch']} x {change['accum']} (fits, {free:.0%} of the GPU free)"
        return {name: change}
    if job.activation_checkpointing:
        return {}
    checkpointed = twice.model_copy(update={"activation_checkpointing": True})
    if not job_memory(checkpointed, gpu, nodes).fits(capacity_bytes(gpu)):
        return {}
    name = (
        f"micro-batch {change['micro_batch']} x {change['accum']} with activation checkpointing "
        "(it does not fit without; recompute from FLOPs, not measured)"
    )
    return {name: {**change, "activation_checkpointing": True}}


def speed_table(result: dict[str, Any]) -> Table:
    p = result["predicted"]
    cost = (
        "cost not priced (below)"
        if result["running_per_hour_usd"] is None
        else f"${result['job_cost_usd']:.2f} at ${result['running_per_hour_usd']:.2f}/h; "
        f"${result['usd_per_billion_tokens']:,.0f} per billion tokens"
    )
    table = Table(
        title=(
            f"predicted step: {p['step_s']:.3f} s, {p['tokens_per_s']:,.0f} tokens/s, MFU {p['mfu']:.1%}; "
            f"bottleneck: {p['bottleneck']}\njob: {result['job_hours']:.2f} h, {cost}"
        ),
        caption="\n".join(
            [
                result["checked"],
                *([result["steps_note"]] if result.get("steps_note") else []),
                *(f"cost: {n}" for n in result.get("cost_notes", [])),
            ]
        ),
    )
    table.add_column("term")
    table.add_column("s", justify="right")
    for name, value in p["compute_s"].items():
        table.add_row(f"GPU: {name}", f"{value:.3f}")
    table.add_row("host (launches, hooks)", f"{p['host_s']:.3f}")
    for name, value in p["comm_s"].items():
        table.add_row(f"traffic: {name}", f"{value:.3f}")
    table.add_row("exposed communication", f"{p['exposed_comm_s']:.3f}")
    for move in result["moves"]:
        table.add_row(f"[dim]if {move['change']}[/]", f"[dim]{move['vs_now']:.2f}x tokens/s[/]")
    return table


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    # Piped or redirected, rich would cut every table to 80 columns: keep them whole (COLUMNS wins).
    wide = sys.stdout.isatty() or "COLUMNS" in os.environ
    console = console or Console(width=None if wide else 250)
    if getattr(args, "compare", None):
        return compare(args, console)
    return _plan(args, console)


def _plan(args: argparse.Namespace, console: Console) -> int:
    try:
        # Without the memory check: a job that does not fit is what this command explains.
        settings = load_settings(args.env, args.config_dir, check_memory=False)
    except SettingsError as exc:
        console.print(f"[bold red]settings:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return EXIT_UNUSABLE
    gpu = settings.gpu_nodes.instance
    if not gpu.gpus:
        console.print(f"[bold red]{gpu.name} has no GPUs[/]")
        return EXIT_UNUSABLE
    need = job_memory(settings.job, gpu, settings.num_workers // gpu.gpus)
    have = capacity_bytes(gpu)
    prices, spot, problem = optional_prices(
        settings, live=getattr(args, "live", False), profile=getattr(args, "profile", None)
    )
    # A GPU the step-time model has no constants for (B200) still gets its memory plan: the fit is
    # the catalogue's and the memory plan's, the speed the model's.
    result: dict[str, Any] = {}
    speed_problem = None
    try:
        result = speed(settings, prices, spot, problem)
    except (ValueError, LookupError) as exc:
        speed_problem = f"not predicted: {exc}"
        result = {"predicted": None, "speed_problem": speed_problem}
    if getattr(args, "json", False):
        import json

        micro = settings.job.micro_batch(gpu)
        memory = {"device_gib": need.device_bytes / GIB, "allocated_gib": need.allocated_bytes / GIB,
                  "capacity_gib": gpu.gpu_memory_cuda_gib, "spare_gib": (have - need.device_bytes) / GIB,
                  "fits": need.fits(have), "peak_moment": need.peak_moment,
                  "terms": [{"name": t.name, "gib": t.gib, "how": t.formula}
                            for t in [*need.peak_terms, *need.overhead]],
                  "micro_batch": micro,
                  "accum": accumulation(settings.job.global_batch_size, micro, settings.num_workers),
                  "micro_batch_setting": settings.job.micro_batch_size,
                  "micro_batch_reason": auto_reason(settings)}  # fmt: skip
        print(json.dumps({"env": settings.name, "memory": memory, **result}, indent=2))
        return EXIT_FITS if need.fits(have) else EXIT_DOES_NOT_FIT
    for table in (breakdown(settings), micro_batches(settings)):
        console.print(table)
    if speed_problem:
        console.print(f"speed: {escape(speed_problem)}", highlight=False, soft_wrap=True)
    else:
        console.print(speed_table(result))
    # Which team's Kueue queue the job lands in (docs/teams.md); its own nodes against that queue
    # are `raytrain job submit`'s to refuse.
    console.print(
        queue_summary(settings.deploy_team, settings.gpu_nodes.max_size, len(settings.team_list)),
        highlight=False,
        soft_wrap=True,
    )
    spot = settings.gpu_nodes.capacity_type is CapacityType.SPOT
    for line in interruption_lines(result["interruptions"], spot):
        style = "bold yellow" if line.startswith("[warning]") else "dim"
        console.print(f"[{style}]{escape(line)}[/]", highlight=False, soft_wrap=True)
    headroom = (have - need.device_bytes) / GIB
    nodes = settings.num_workers // gpu.gpus
    if need.fits(have):
        console.print(
            f"[green]fits[/]: {need.device_bytes / GIB:.1f} GiB of {gpu.gpu_memory_cuda_gib} GiB per "
            f"{gpu.gpu_model}, {headroom:.1f} GiB ({headroom / gpu.gpu_memory_cuda_gib:.0%}) to spare",
            highlight=False,
        )
        return EXIT_FITS
    fixes = escape(fit_problem(settings.job, gpu, nodes) or "")
    console.print(
        f"[bold red]does not fit[/]: {need.device_bytes / GIB:.1f} GiB of {gpu.gpu_memory_cuda_gib} GiB "
        f"per {gpu.gpu_model}, {-headroom:.1f} GiB short. {fixes}",
        highlight=False,
        soft_wrap=True,
    )
    return EXIT_DOES_NOT_FIT


def auto_reason(settings: Settings) -> str | None:
    """Why `micro_batch_size: auto` took the micro-batch it did (None when it is set)."""
    job, gpu = settings.job, settings.gpu_nodes.instance
    if job.micro_batch_size != "auto":
        return None
    need = job_memory(job, gpu, settings.num_workers // gpu.gpus).device_bytes
    if need <= capacity_bytes(gpu) * (1 - AUTO_HEADROOM):
        return f"auto: the largest that leaves at least {AUTO_HEADROOM:.0%} of the GPU free"
    if need <= capacity_bytes(gpu):
        return f"auto: none leaves {AUTO_HEADROOM:.0%} of the GPU free; the largest that fits"
    return "auto: none fits"


def breakdown(settings: Settings) -> Table:
    """The peak moment's terms, what lies outside the allocator, and the total against the GPU."""
    job, gpu = settings.job, settings.gpu_nodes.instance
    nodes = settings.num_workers // gpu.gpus
    need = job_memory(job, gpu, nodes)
    micro = job.micro_batch(gpu)
    accum = accumulation(job.global_batch_size, micro, settings.num_workers)
    why = auto_reason(settings)
    chosen = f" ({why})" if why else ""
    opts = need.inputs
    features = [
        name
        for name, on in (
            ("compiled layers", job.compile),
            ("activation checkpointing", job.activation_checkpointing),
            ("Liger loss", job.liger),
            ("float8 linears", job.float8_on(gpu)),
            # The workers' --reshard-after-forward default (training/sizing/memory_plan.py).
            (
                f"parameters kept gathered ({AUTO_HEADROOM:.0%} of the GPU still free)",
                not opts["reshard_after_forward"],
            ),
        )
        if on
    ]
    table = Table(
        title=(
            f"raytrain plan: {settings.name}, one rank of {settings.num_workers} ({nodes} x {gpu.name}, "
            f"{gpu.gpus} x {gpu.gpu_model} {gpu.gpu_memory_cuda_gib} GiB usable)\n"
            f"{job.model} ({job.model_plan.source}, {job.model_plan.dims.params / 1e9:.2f} B parameters), "
            f"{'LoRA r=' + str(job.lora.rank) if job.lora else 'full fine-tune'}, "
            f"seq_len {job.seq_len}, micro-batch {micro}{chosen} x {accum} "
            f"per step, sharded over {opts['shard']} GPUs ({job.sharding}), "
            f"{', '.join(features) or 'eager, Hugging Face loss'}"
        ),
        caption=", ".join(f"{moment} {need.moment_bytes(moment) / GIB:.2f} GiB" for moment in need.moments),
    )
    table.add_column(f"peak: {need.peak_moment}")
    table.add_column("GiB", justify="right")
    table.add_column("how")
    for term in need.peak_terms:
        table.add_row(term.name, f"{term.gib:.2f}", term.formula)
    table.add_row(
        "[bold]allocated (torch max_memory_allocated)[/]", f"[bold]{need.allocated_bytes / GIB:.2f}[/]", ""
    )
    for term in need.overhead:
        table.add_row(term.name, f"{term.gib:.2f}", term.formula)
    style = "green" if need.fits(capacity_bytes(gpu)) else "bold red"
    table.add_row(
        f"[{style}]needed of the GPU[/]",
        f"[{style}]{need.device_bytes / GIB:.2f}[/]",
        f"of {gpu.gpu_memory_cuda_gib} GiB ({gpu.gpu_model}, config/catalogue.py)",
    )
    return table


def micro_batches(settings: Settings) -> Table:
    """The largest micro-batch per sequence length on this GPU, other settings as the job's."""
    job, gpu = settings.job, settings.gpu_nodes.instance
    nodes = settings.num_workers // gpu.gpus
    max_seq = job.model_plan.dims.max_seq
    table = Table(
        title=f"largest micro-batch per sequence length on one {gpu.gpu_model} ({gpu.name})",
        caption="what fits at all (micro_batch_size: auto also keeps "
        f"{AUTO_HEADROOM:.0%} of the GPU free). 0: not even one sequence fits. Accumulating: more than "
        "one micro-batch per optimizer step (FSDP keeps unsharded fp32 gradients between them)",
    )
    table.add_column("seq_len", justify="right")
    table.add_column("accumulating", justify="right")
    table.add_column("one micro-batch per step", justify="right")
    other = "off" if job.activation_checkpointing else "on"
    table.add_column(f"activation checkpointing {other}, accumulating", justify="right")
    for seq in (s for s in SEQ_LENS if s <= max_seq):
        table.add_row(
            str(seq),
            str(largest_micro_batch_for(job, gpu, nodes, seq_len=seq, accumulate=True)),
            str(largest_micro_batch_for(job, gpu, nodes, seq_len=seq, accumulate=False)),
            str(
                largest_micro_batch_for(
                    job,
                    gpu,
                    nodes,
                    seq_len=seq,
                    accumulate=True,
                    activation_checkpointing=not job.activation_checkpointing,
                )
            ),
        )
    return table

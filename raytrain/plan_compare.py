"""`raytrain plan --env NAME --compare MODEL ...`: the environment's job with other models, each as
a full fine-tune and with LoRA, sharded HSDP and full: whether it fits the GPUs, the micro-batch
`auto` takes, the predicted tokens/s and dollars per billion tokens (training/sizing/step_time.py; LoRA's
terms are predictions until measured). Offline, like `raytrain plan`: a MODEL is a catalogue name,
a Hugging Face id the catalogue knows, or a local config.json (or a folder holding one), which is
how a model in S3 or one the catalogue lacks is compared (`job.config_json`, config/models.py).
Exits as `raytrain plan` does: 0 when a row fits, 1 when none does, 2 when every row is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from config.loader import SettingsError, load_settings
from config.memory import accumulation, capacity_bytes, job_memory
from config.models import ModelError, resolve
from config.prices import PriceError, RegionPrices
from training.model.shapes import CATALOGUE
from training.sizing.memory_plan import GIB

SHARDINGS = ("hsdp", "full")
# raytrain plan's exit codes (raytrain/plan.py imports this module, not the other way round)
EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_UNUSABLE = 0, 1, 2


def model_overrides(name: str) -> tuple[str, list[str]]:
    """The model's name for the table and the settings overrides that make the environment's job
    train it; ValueError (what to compare instead) if `name` cannot be sized offline."""
    path = Path(name).expanduser()
    if path.is_dir() or name.endswith(".json"):
        config = path / "config.json" if path.is_dir() else path
        if not config.is_file():
            raise ValueError(
                f"no such {'config.json in that folder' if path.is_dir() else 'file'} (a local "
                "config.json, or a folder holding one)"
            )
        _size(name, config=str(config.resolve()))
        # The config sizes the job (job.config_json); job.model names the folder it came from, as a
        # model read from a path would be (never a catalogue id, whose own config would be checked
        # against this one).
        folder = config.resolve().parent
        return name, [f"job.model={folder}", f"job.config_json={config.resolve()}", "job.shape=null"]
    if name.lower().startswith("s3://"):
        raise ValueError(
            "--compare reads no bucket: compare a local copy of its config.json (`aws s3 cp "
            f"{name.rstrip('/')}/config.json config/models/NAME.json`, then --compare "
            "config/models/NAME.json)"
        )
    if name.startswith(("/", "./", "../", "~")):
        raise ValueError(
            "no such local file or folder; a model read inside the job's container is compared by a "
            "local copy of its config.json (--compare FILE)"
        )
    model = model_id(name)
    _size(model)
    return model, [f"job.model={model}", "job.shape=null", "job.config_json=null"]


def _size(model: str, config: str | None = None) -> None:
    """ValueError with what to compare instead when the catalogue or the config cannot size it."""
    try:
        resolve(model, "pretrained", None, config)
    except ModelError as exc:
        if not exc.unknown:
            raise ValueError(exc.message) from None
        # The catalogue's advice (job.config_json, job.shape) is the settings', not --compare's.
        mean = f"; did you mean {' or '.join(map(repr, exc.close))}?" if exc.close else ""
        lead = f"{model!r} is not in the model catalogue (training/model/configs/), so its size is unknown"
        raise ValueError(
            f"{lead}{mean}{' Otherwise' if mean else ';'} compare a local copy of its config.json "
            "(--compare FILE, or a folder holding one)"
        ) from None


def model_id(name: str) -> str:
    """A Hugging Face id, from itself or from a catalogue name; ValueError otherwise."""
    if "/" in name:
        return name
    entry = CATALOGUE.get(name)
    known = ", ".join(n for n, e in CATALOGUE.items() if e["hf_ids"])
    if entry is not None and not entry["hf_ids"]:
        # Gemma 3's 4B and larger ship as multimodal checkpoints: their text decoder is in the
        # catalogue for --init random sizing only (training/model/configs/*.json, "note").
        raise ValueError(
            "a catalogue shape with no release the loop can fine-tune (the text decoder of a "
            f"multimodal checkpoint); compare one of {known}"
        )
    if entry is None:
        raise ValueError(f"neither a Hugging Face id nor a catalogue name ({known})")
    return str(entry["hf_ids"][0])


def rows(
    env: str,
    config_dir: Path,
    models: list[str],
    prices: RegionPrices | None = None,
    spot: float | None = None,
) -> list[dict[str, Any]]:
    """One row per model, method and sharding; `usd_per_billion_tokens` is None where no price is
    known (`cost_problem` says why), the fit and the speed are there all the same."""
    from config.step_prediction import predict
    from raytrain.cost import estimate

    # LoRA as the environment sets it, else LoRA's defaults (rank 16 on every linear layer).
    base = load_settings(env, config_dir, check_memory=False).job.lora
    methods = (("full", ["job.lora=null", "job.export_merged=false"]),
               (f"LoRA r={base.rank if base else 16}", [] if base else ["job.lora={}"]))  # fmt: skip
    out: list[dict[str, Any]] = []
    for name in models:
        try:
            model, chosen = model_overrides(name)
        except ValueError as exc:
            # One row for the model, not one per method and sharding: none of them can be sized.
            out.append({"model": name, "method": "", "sharding": "", "refused": str(exc)})
            continue
        for method, lora in methods:
            for sharding in SHARDINGS:
                row: dict[str, Any] = {"model": model, "method": method, "sharding": sharding}
                overrides = [*chosen, *lora, f"job.sharding={sharding}"]
                try:
                    settings = load_settings(env, config_dir, check_memory=False, overrides=overrides)
                except SettingsError as exc:
                    out.append({**row, "refused": str(exc).split(": ", 1)[-1]})
                    continue
                job, gpu = settings.job, settings.gpu_nodes.instance
                nodes = settings.num_workers // gpu.gpus
                need = job_memory(job, gpu, nodes)
                micro = job.micro_batch(gpu)
                speed_problem = None
                try:
                    step = predict(settings)
                    tokens_per_s: float | None = step.tokens_per_s
                    mfu, bottleneck = step.mfu, step.bottleneck
                except (ValueError, LookupError) as exc:  # a GPU the step-time model lacks (B200)
                    tokens_per_s, mfu, bottleneck, speed_problem = None, None, "", str(exc)
                try:
                    per_hour: float | None = estimate(settings, prices, spot_per_hour=spot).running_with(
                        job.nodes
                    )
                    problem = None
                except PriceError as exc:
                    per_hour, problem = None, str(exc)
                out.append({
                    **row,
                    "params_b": job.model_plan.dims.params / 1e9,
                    "gib_per_gpu": need.device_bytes / GIB,
                    "fits": need.fits(capacity_bytes(gpu)),
                    "micro_batch": micro,
                    "accum": accumulation(job.global_batch_size, micro, settings.num_workers),
                    "tokens_per_s": tokens_per_s,
                    "mfu": mfu,
                    "bottleneck": bottleneck,
                    "usd_per_billion_tokens": (
                        None if per_hour is None or tokens_per_s is None
                        else per_hour / (tokens_per_s * 3600) * 1e9
                    ),
                    **({"cost_problem": problem} if problem else {}),
                    **({"speed_problem": speed_problem} if speed_problem else {}),
                })  # fmt: skip
    return out


def table(env: str, settings_line: str, result: list[dict[str, Any]]) -> Table:
    t = Table(
        title=f"raytrain plan --compare: env {env} ({settings_line})",
        caption="GiB: one GPU's need (memory plan) against its usable memory; tokens/s and $ per billion "
        "tokens: the step-time model (LoRA's terms: measured on one H200 at 7B, not on an L4); the job's "
        "other "
        "settings (seq_len, global batch, checkpointing, LoRA's if it has them) as the environment's",
    )
    for col in ("model", "params", "method", "sharding", "micro x accum", "GiB/GPU", "fits",
                "tokens/s", "MFU", "$/B tokens", "bottleneck"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("model", "method", "sharding", "bottleneck") else "right")
    for r in result:
        if "refused" in r:
            # The reason goes under the table (refusals()): a sentence would fill the column.
            t.add_row(
                escape(r["model"]), "", r["method"], r["sharding"], "", "", "[red]refused[/]", "", "", "", ""
            )
            continue
        fits = "[green]yes[/]" if r["fits"] else "[red]no[/]"
        t.add_row(
            escape(r["model"]),
            f"{r['params_b']:.2f} B",
            r["method"],
            r["sharding"],
            f"{r['micro_batch']} x {r['accum']}",
            f"{r['gib_per_gpu']:.1f}",
            fits,
            f"{r['tokens_per_s']:,.0f}" if r["fits"] and r["tokens_per_s"] is not None else "-",
            f"{r['mfu']:.1%}" if r["fits"] and r["mfu"] is not None else "-",
            f"{r['usd_per_billion_tokens']:,.0f}"
            if r["fits"] and r["usd_per_billion_tokens"] is not None
            else "-",
            r["bottleneck"] if r["fits"] else "",
        )
    return t


def refusals(result: list[dict[str, Any]]) -> list[str]:
    """One line per refused model (or model, method and sharding), each reason once."""
    lines: dict[str, None] = {}
    for r in result:
        if "refused" in r:
            where = ", ".join(x for x in (r["model"], r["method"], r["sharding"]) if x)
            lines[f"{where}: {r['refused']}"] = None
    return list(lines)


def run(args: Any, console: Console) -> int:
    import json

    from raytrain.cost import optional_prices

    try:
        base = load_settings(args.env, args.config_dir, check_memory=False)
        prices, spot, live_problem = optional_prices(
            base, live=getattr(args, "live", False), profile=getattr(args, "profile", None)
        )
        result = rows(args.env, args.config_dir, args.compare, prices, spot)
    except (SettingsError, ValueError) as exc:
        console.print(f"[bold red]settings:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    planned = [r for r in result if "refused" not in r]
    code = EXIT_FITS if any(r["fits"] for r in planned) else EXIT_DOES_NOT_FIT if planned else EXIT_UNUSABLE
    if args.json:
        print(json.dumps({"env": args.env, "compare": result}, indent=2))
        return code
    gpu = base.gpu_nodes.instance
    job = base.job
    line = (
        f"{job.nodes} x {gpu.name}, {base.num_workers} x {gpu.gpu_model} {gpu.gpu_memory_cuda_gib} GiB; "
        f"seq_len {job.seq_len}, global batch {job.global_batch_size}"
        f"{', activation checkpointing' if job.activation_checkpointing else ''}"
    )
    console.print(table(args.env, line, result))
    for refused in refusals(result):
        console.print(f"[red]refused[/] {escape(refused)}", highlight=False, soft_wrap=True)
    if live_problem:
        console.print(f"cost: {escape(live_problem)}", highlight=False, soft_wrap=True)
    for note in dict.fromkeys(r["speed_problem"] for r in result if r.get("speed_problem")):
        console.print(f"speed: not predicted: {escape(note)}", highlight=False, soft_wrap=True)
    for note in dict.fromkeys(r["cost_problem"] for r in result if r.get("cost_problem")):
        console.print(f"cost: not priced: {escape(note)}", highlight=False, soft_wrap=True)
    return code

"""Synthesize every environment offline: `python -m stacks.synth_all [ENV ...] [--out cdk.out]`.

Each environment gets its own cloud assembly under `<out>/<env>/` (CloudFormation templates, assets,
the cdk-nag validation report) and the rendered Kubernetes manifests under
`<out>/<env>/manifests/`. Settings of all requested environments are validated first, and
each assembly is written to a temporary folder and moved into place only when complete, so a
failure never leaves a half-written environment behind.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from config.costs import estimate, job_nodes
from config.loader import (
    SettingsError,
    config_dir_argument,
    environment_file,
    environment_names,
    load_settings,
)
from config.memory import job_memory
from config.placeholders import placeholders
from config.prices import PriceError
from config.settings import Settings
from k8s.chart import render_manifests
from stacks.app_builder import build_app, new_app, pipeline_environments
from stacks.environment import EnvironmentStacks


def synthesize(settings: Settings, out_dir: Path, directory: Path | None = None) -> EnvironmentStacks:
    """Synthesize one environment into out_dir/<env> (atomically replaced); a pipeline's other
    environments are read from `directory`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / settings.name
    staging = Path(tempfile.mkdtemp(prefix=f".{settings.name}-", dir=out_dir))
    try:
        app = new_app(settings, outdir=str(staging))
        stacks = build_app(app, settings, directory)
        app.synth()
        review = stacks.workload.review
        render_manifests(
            settings,
            staging / "manifests",
            code_uri=review.code_uri,
            code_hash=review.code_hash,
            checkpoint_uri=review.checkpoint_uri,
        )
        old = None
        if target.exists():
            old = target.with_name(f".{settings.name}-old")
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
        staging.rename(target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return stacks
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@dataclass(frozen=True)
class AssemblyReport:
    """What the written cloud assembly says: CDK's warnings, the checks' verdicts, the RayJob."""

    warnings: list[str]
    acknowledged: int  # cdk-nag findings acknowledged with a reason (in *.metadata.json)
    cfn_validate: str  # the CloudFormation Validate plugin's conclusion (validation-report.json)
    rayjob: str | None

    @classmethod
    def read(cls, assembly: Path) -> AssemblyReport:
        warnings: dict[str, None] = {}  # CDK's annotations (what `cdk synth` prints), once each
        acknowledged = 0
        # Stacks' metadata files, nested (pipeline stage) assemblies' too.
        for path in sorted(assembly.rglob("*.metadata.json")):
            for path_entries in json.loads(path.read_text(encoding="utf-8")).values():
                for entry in path_entries:
                    if entry.get("type") == "aws:cdk:warning":
                        warnings[str(entry.get("data"))] = None
                    elif entry.get("type") == "aws:cdk:acknowledged-rules":
                        acknowledged += sum(1 for rule in entry.get("data") or {} if "AwsSolutions-" in rule)
        report = assembly / "validation-report.json"
        conclusions = []
        if report.is_file():
            for plugin in json.loads(report.read_text(encoding="utf-8")).get("pluginReports", []):
                suppressed = len(plugin.get("suppressedViolations") or [])
                conclusions.append(f"{plugin.get('pluginName')}: {plugin.get('conclusion')}"
                                   f" ({suppressed} acknowledged)")  # fmt: skip
        jobs = sorted((assembly / "manifests").glob("RayJob.*.k8s.yaml"))
        rayjob = jobs[0].name.removeprefix("RayJob.").removesuffix(".k8s.yaml") if jobs else None
        return cls(list(warnings), acknowledged, "; ".join(conclusions) or "no report", rayjob)


def environment_panel(
    settings: Settings, stacks: EnvironmentStacks, out_dir: Path, directory: Path | None = None
) -> Panel:
    """One environment's block: fits 80 columns (rich wraps the values, never cuts them)."""
    assembly = out_dir / settings.name
    report = AssemblyReport.read(assembly)
    gpu, instance = settings.gpu_nodes, settings.gpu_nodes.instance
    efa = f", {instance.efa_interfaces} EFA" if gpu.efa else ", no EFA"
    addons = settings.addons
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("account", f"{settings.account}  {settings.region}")
    grid.add_row("stacks", ", ".join(stack.stack_name for stack in stacks.all()))
    grid.add_row(
        "cluster",
        f"{settings.cluster.name}, Kubernetes {settings.cluster.kubernetes_version}; "
        f"system {settings.system_nodes.instance_type} × {settings.system_nodes.desired_size}",
    )
    grid.add_row(
        "GPU nodes",
        f"{' | '.join(gpu.types)} × {gpu.min_size}–{gpu.max_size} in {gpu.availability_zone}, autoscaled "
        f"({instance.gpus}× {instance.gpu_model}{efa}); a job uses {job_nodes(settings)}",
    )
    grid.add_row(
        "add-ons",
        f"nvidia-device-plugin {addons.nvidia_device_plugin}, efa-device-plugin "
        f"{addons.efa_device_plugin}, kuberay-operator {addons.kuberay_operator}, "
        f"cluster-autoscaler {addons.cluster_autoscaler}",
    )
    grid.add_row("RayJob", f"{report.rayjob or 'none'}  ({assembly}/manifests/)")
    grid.add_row("training", training_cell(settings))
    grid.add_row(
        "checks",
        f"cdk-nag AwsSolutions: passed, {report.acknowledged} findings acknowledged with reasons "
        f"(*.metadata.json); {report.cfn_validate}",
    )
    grid.add_row("cost", cost_cell(settings))
    if report.warnings:
        grid.add_row("[yellow]CDK warnings[/]", "\n".join(f"[yellow]![/] {w}" for w in report.warnings))
    found = placeholders(settings)
    if found:
        grid.add_row(
            "[bold red]PLACEHOLDERS[/]",
            "[bold red]documentation values: replace them in "
            f"{_shown(environment_file(settings.name, directory))} before a deploy[/]\n" + "\n".join(found),
        )
    border = "red" if found else "yellow" if report.warnings else "green"
    return Panel(
        grid, title=f"[bold]{settings.name}[/] → {assembly}/", title_align="left", border_style=border
    )


def _shown(path: Path) -> str:
    """A path as a user typed it: relative to the working folder where it lies under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def training_cell(settings: Settings) -> str:
    """The job's model as planned (config/models.py) and its memory per GPU (config/memory.py)."""
    job, gpu = settings.job, settings.gpu_nodes.instance
    if not gpu.gpus:
        return f"{job.model}: no GPUs"
    plan = job.model_plan
    need = job_memory(job, gpu, settings.num_workers // gpu.gpus)
    method = f"LoRA r={job.lora.rank}" if job.lora else "full fine-tune"
    return (
        f"{job.model} ({plan.source}, {plan.dims.params / 1e9:.2f} B parameters), {method}; "
        f"micro-batch {job.micro_batch(gpu)}, {need.device_bytes / 2**30:.1f} of "
        f"{gpu.gpu_memory_cuda_gib} GiB per {gpu.gpu_model} (raytrain plan --env {settings.name})"
    )


def cost_cell(settings: Settings) -> str:
    """Idle and running $/h (raytrain cost --env NAME has the breakdown and its notes)."""
    try:
        est = estimate(settings)
    except PriceError as exc:
        return f"not priced: {exc}"
    return (
        f"${est.idle_per_hour:.2f}/h idle, ${est.running_per_hour:.2f}/h with a job's "
        f"{est.job_nodes} GPU nodes ({est.gpu_pricing}, prices of {est.prices_as_of}; raytrain cost)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stacks.synth_all", description=__doc__)
    parser.add_argument("envs", nargs="*", help="environments (default: every file in the config directory)")
    config_dir_argument(parser)
    parser.add_argument("--out", default="cdk.out", type=Path, help="output folder (default: cdk.out)")
    args = parser.parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=100)  # logs and CI: no terminal width to fit

    names = args.envs or environment_names(args.config_dir)
    settings_list: list[Settings] = []
    errors: list[str] = []
    for name in names:
        try:
            settings = load_settings(name, args.config_dir)
            if settings.pipeline is not None and settings.pipeline.enabled:
                pipeline_environments(settings, args.config_dir)  # the files it depends on, first
            settings_list.append(settings)
        except SettingsError as exc:
            errors.append(str(exc))
    if errors:
        for message in errors:
            print(f"error: {message}", file=sys.stderr)
        return 1

    results = []
    for settings in settings_list:
        try:
            results.append((settings, synthesize(settings, args.out, args.config_dir)))
        except SettingsError as exc:  # a file this one depends on (the pipeline's environments)
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except RuntimeError as exc:  # jsii surfaces validation (cdk-nag) failures this way
            print(f"error: synthesis of env={settings.name} failed: {exc}", file=sys.stderr)
            return 1
    for settings, stacks in results:
        console.print(environment_panel(settings, stacks, args.out, args.config_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())

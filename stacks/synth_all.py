"""Synthesize every environment offline: `python -m stacks.synth_all [ENV ...] [--out cdk.out]`.

Each environment gets its own cloud assembly under `<out>/<env>/` (CloudFormation templates, assets,
the cdk-nag validation report) and the rendered Kubernetes manifests under
`<out>/<env>/manifests/`. Settings of all requested environments are validated first, and
each assembly is written to a temporary folder and moved into place only when complete, so a
failure never leaves a half-written environment behind.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from config.costs import estimate, job_nodes
from config.loader import SettingsError, environment_names, load_settings
from config.prices import PriceError
from config.settings import Settings
from k8s.chart import render_manifests
from stacks.app_builder import build_app, new_app
from stacks.environment import EnvironmentStacks


def synthesize(settings: Settings, out_dir: Path) -> EnvironmentStacks:
    """Synthesize one environment into out_dir/<env> (atomically replaced)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / settings.name
    staging = Path(tempfile.mkdtemp(prefix=f".{settings.name}-", dir=out_dir))
    try:
        app = new_app(settings, outdir=str(staging))
        stacks = build_app(app, settings)
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


def summary_table(results: list[tuple[Settings, EnvironmentStacks]], out_dir: Path) -> Table:
    table = Table(title=f"Synthesized environments ({out_dir}/<env>)")
    for column in (
        "env",
        "account / region",
        "stacks",
        "node groups",
        "GPU AZ",
        "Kubernetes",
        "add-ons",
        "$/h",
    ):
        table.add_column(column)
    for settings, stacks in results:
        gpu = settings.gpu_nodes
        instance = gpu.instance
        efa = f", {instance.efa_interfaces} EFA" if gpu.efa else ", no EFA"
        table.add_row(
            settings.name,
            f"{settings.account}\n{settings.region}",
            "\n".join(stack.stack_name for stack in stacks.all()),
            f"system: {settings.system_nodes.instance_type} × {settings.system_nodes.desired_size}\n"
            f"gpu: {gpu.instance_type} × {gpu.min_size}–{gpu.max_size}, autoscaled; "
            f"a job uses {job_nodes(settings)} ({instance.gpus}× {instance.gpu_model}{efa})",
            gpu.availability_zone,
            settings.cluster.kubernetes_version,
            f"nvidia-device-plugin {settings.addons.nvidia_device_plugin}\n"
            f"efa-device-plugin {settings.addons.efa_device_plugin}\n"
            f"kuberay-operator {settings.addons.kuberay_operator}\n"
            f"cluster-autoscaler {settings.addons.cluster_autoscaler}",
            cost_cell(settings),
        )
    return table


def cost_cell(settings: Settings) -> str:
    """Idle and running On-Demand $/h (raytrain cost --env NAME has the breakdown)."""
    try:
        est = estimate(settings)
    except PriceError as exc:
        return f"not priced: {exc}"
    return (
        f"idle {est.idle_per_hour:.2f}\n"
        f"running {est.running_per_hour:.2f}\n"
        f"({est.job_nodes} GPU nodes; prices {est.prices_as_of})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stacks.synth_all", description=__doc__)
    parser.add_argument("envs", nargs="*", help="environments (default: every file in config/environments)")
    parser.add_argument("--out", default="cdk.out", type=Path, help="output folder (default: cdk.out)")
    args = parser.parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # logs and CI: no terminal width to fit

    names = args.envs or environment_names()
    settings_list: list[Settings] = []
    errors: list[str] = []
    for name in names:
        try:
            settings_list.append(load_settings(name))
        except SettingsError as exc:
            errors.append(str(exc))
    if errors:
        for message in errors:
            print(f"error: {message}", file=sys.stderr)
        return 1

    results = []
    for settings in settings_list:
        try:
            results.append((settings, synthesize(settings, args.out)))
        except RuntimeError as exc:  # jsii surfaces validation (cdk-nag) failures this way
            print(f"error: synthesis of env={settings.name} failed: {exc}", file=sys.stderr)
            return 1
    console.print(summary_table(results, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

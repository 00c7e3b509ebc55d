#!/usr/bin/env python3
"""CDK app entry point: `npx cdk synth|diff|deploy -c env=NAME -o cdk.out/NAME` (default env and
its output folder, cdk.out/dev, from cdk.json: a bare `npx cdk ls` is dev's).

Each environment's cloud assembly lives in cdk.out/<env>/, whether `make synth` or the CDK CLI writes
it: one layout, and no templates of one environment left beside another's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# jsii (aws-cdk-lib's runtime) prints an 11-line end-of-life banner on Node 20 on every run; its
# kernel starts when aws_cdk is imported and inherits this environment. Only Node 20 is silenced
# (the variable lists major versions), so another unsupported Node still shows its warning.
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk

from config.loader import SettingsError, environment_names, load_settings
from stacks.app_builder import build_app, new_app

CDK_OUT = Path(__file__).resolve().parent / "cdk.out"


def outdir_problem(env_name: str, outdir: str | None) -> str | None:
    """The CLI's output folder (CDK_OUTDIR: `-o`, else cdk.json's "output", cdk.out/<default env>)
    must be cdk.out/<env>, not cdk.out itself or another environment's folder; folders elsewhere
    (a scratch or CI directory) are the caller's choice. So a bare `npx cdk ls|synth|deploy`
    works for the default environment, and another environment needs its own `-o`."""
    if not outdir:
        return None  # `python app.py`: CDK writes to a temporary folder
    out = Path(outdir).resolve()
    fix = f"npx cdk … -c env={env_name} -o cdk.out/{env_name}"
    if out == CDK_OUT:
        return f"env={env_name}'s cloud assembly goes to cdk.out/{env_name}/, as with make synth: {fix}"
    if out.parent == CDK_OUT and out.name != env_name and out.name in environment_names():
        return (
            f"output folder {outdir} (-o, or cdk.json's default) is env={out.name}'s; "
            f"env={env_name} goes to cdk.out/{env_name}: {fix}"
        )
    return None


def main() -> int:
    # The CLI passes `-c env=…` and cdk.json's context through the environment; read it first.
    env_name = cdk.App().node.try_get_context("env") or "dev"
    problem = outdir_problem(env_name, os.environ.get("CDK_OUTDIR"))
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    try:
        settings = load_settings(env_name)
        app = new_app(settings)
        build_app(app, settings)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())

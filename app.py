#!/usr/bin/env python3
"""CDK app entry point: `npx cdk synth|diff|deploy -c env=NAME` (default from cdk.json)."""

from __future__ import annotations

import sys

import aws_cdk as cdk

from config.loader import SettingsError, load_settings
from stacks.app_builder import build_app, new_app


def main() -> int:
    # The CLI passes `-c env=…` and cdk.json's context through the environment; read it first.
    env_name = cdk.App().node.try_get_context("env") or "dev"
    try:
        settings = load_settings(env_name)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    app = new_app(settings)
    build_app(app, settings)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())

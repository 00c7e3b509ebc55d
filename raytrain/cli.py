"""Entry point of the `raytrain` console script.

Each subcommand lives in its own module exposing `register(subparsers)`, which adds its parser and
sets `func` (taking the parsed arguments, returning the exit code) as a default.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Subcommands import aws-cdk-lib, whose jsii runtime prints a Node 20 end-of-life banner on every
# start; the Makefile and app.py silence it the same way (README: Node.js 20+).
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

# (module) — each registers one or more subcommands.
COMMAND_MODULES: list[str] = [
    "raytrain.capacity",
    "raytrain.preflight",
    "raytrain.verify",
    "raytrain.review",
    "raytrain.job",
    "raytrain.cost",
    "raytrain.plan",
    "raytrain.data",
    "raytrain.pipeline_verify",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raytrain", description="Operate the Ray Train on EKS environments."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ModuleNotFoundError as exc:
        # Every command runs on the CDK side that `make synth` installs; should one ever reach for a
        # package of the train/dev groups (pyproject.toml), say what to install instead of a traceback.
        missing = (exc.name or str(exc)).split(".")[0]
        print(
            f"raytrain {args.command}: error: Python package {missing!r} is not installed; "
            "`make setup` installs the training and test packages",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`raytrain plan --json | head`): stop quietly, as a Unix filter
        # does. stdout is pointed at devnull so the interpreter's final flush cannot raise again
        # (docs.python.org/3/library/signal.html, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())

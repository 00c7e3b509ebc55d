"""app.py, as the CDK CLI runs it: one output layout (cdk.out/<env>) and no jsii banner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import app

ROOT = Path(__file__).resolve().parents[1]


def test_the_bare_cdk_out_is_refused_naming_the_per_environment_folder():
    problem = app.outdir_problem("prod", str(ROOT / "cdk.out"))
    assert problem == (
        "env=prod's cloud assembly goes to cdk.out/prod/, as with make synth: "
        "npx cdk … -c env=prod -o cdk.out/prod"
    )


def test_another_environments_folder_is_refused():
    problem = app.outdir_problem("prod", str(ROOT / "cdk.out" / "dev"))
    assert problem is not None and problem.startswith(f"output folder {ROOT / 'cdk.out' / 'dev'} ")
    assert "is env=dev's; env=prod goes to cdk.out/prod" in problem


def test_cdk_jsons_output_is_the_default_environments_folder():
    """A bare `npx cdk ls|synth|bootstrap` runs the default environment into its own folder."""
    cdk_json = json.loads((ROOT / "cdk.json").read_text())
    assert cdk_json["output"] == f"cdk.out/{cdk_json['context']['env']}"
    assert app.outdir_problem(cdk_json["context"]["env"], str(ROOT / cdk_json["output"])) is None


def test_the_environments_own_folder_and_folders_elsewhere_are_fine(tmp_path):
    assert app.outdir_problem("prod", str(ROOT / "cdk.out" / "prod")) is None
    assert app.outdir_problem("prod", str(tmp_path)) is None
    assert app.outdir_problem("prod", None) is None


def test_as_the_cli_runs_it_one_line_and_no_banner():
    # The CLI passes the context as CDK_CONTEXT_JSON and the output folder as CDK_OUTDIR.
    env = {k: v for k, v in os.environ.items() if not k.startswith("JSII_SILENCE")}
    env |= {"CDK_CONTEXT_JSON": json.dumps({"env": "prod"}), "CDK_OUTDIR": str(ROOT / "cdk.out")}
    result = subprocess.run(
        [sys.executable, "app.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: env=prod's cloud assembly goes to cdk.out/prod/, as with make synth: "
        "npx cdk … -c env=prod -o cdk.out/prod"
    ]

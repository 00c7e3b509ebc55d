"""Entry points: `make synth` needs only the CDK side, and synthesis really imports nothing more."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INPUTS = ("Makefile", "pyproject.toml", "requirements.lock", "package.json", "package-lock.json")
# The train and dev dependency groups (pyproject.toml), by import name.
NOT_CDK = ("torch", "ray", "transformers", "pyarrow", "matplotlib", "pytest", "hypothesis", "moto",
           "cfnlint", "kubernetes_validate", "jsonschema", "yaml")  # fmt: skip


def dry_run(tmp_path: Path, target: str, *variables: str, make_flags: list[str] | None = None) -> str:
    """What `make -n TARGET` would run in a copy of the repository's make inputs."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("GNU make is not installed")
    # Under `make test` this runs inside make: the inherited MAKELEVEL/MAKEFLAGS would make the
    # inner make print "Entering directory" lines (and pass on the outer flags).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    result = subprocess.run(
        [
            make,
            "--no-print-directory",
            *(make_flags if make_flags is not None else ["-n"]),
            target,
            *variables,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return result.stdout


@pytest.fixture
def make_dir(tmp_path: Path) -> Path:
    for name in INPUTS:
        shutil.copy2(ROOT / name, tmp_path / name)
    (tmp_path / ".venv").mkdir()
    return tmp_path


def test_synth_after_setup_cdk_installs_nothing_more(make_dir: Path) -> None:
    (make_dir / ".venv" / ".installed-cdk").touch()
    assert dry_run(make_dir, "synth").splitlines() == [".venv/bin/python -m stacks.synth_all --out cdk.out"]


def test_synth_env_synthesizes_only_that_environment(make_dir: Path) -> None:
    (make_dir / ".venv" / ".installed-cdk").touch()
    commands = dry_run(make_dir, "synth", "ENV=prod")
    assert commands.splitlines() == [".venv/bin/python -m stacks.synth_all prod --out cdk.out"]


def test_synth_of_an_unknown_environment_fails_naming_the_known_ones(capsys) -> None:
    from config.loader import environment_names
    from stacks.synth_all import main

    assert main(["nope", "--out", "/nonexistent/never-written"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    known = ", ".join(environment_names())  # dev, prod and the checkout's own
    assert f"no such environment file for env='nope'; known environments: {known}" in err


def test_review_needs_the_cdk_side_only(make_dir: Path) -> None:
    (make_dir / ".venv" / ".installed-cdk").touch()
    assert "--group" not in dry_run(make_dir, "review")


def test_help_columns_fit_every_target(make_dir: Path) -> None:
    lines = dry_run(make_dir, "help", make_flags=["-s"]).splitlines()
    names = [line.split()[0] for line in lines]
    assert "train-local-data" in names
    # Every description starts in one column, after the longest name and a space.
    starts = {
        len(line) - len(line[2:].lstrip()[len(name) :].lstrip())
        for line, name in zip(lines, names, strict=True)
    }
    assert len(starts) == 1 and starts.pop() > 2 + max(map(len, names)), lines


def test_a_fresh_synth_installs_the_cdk_side_only(make_dir: Path) -> None:
    commands = dry_run(make_dir, "synth")
    assert "pip install --quiet -c requirements.lock -e ." in commands
    assert "--group" not in commands


def test_test_after_setup_cdk_adds_the_groups(make_dir: Path) -> None:
    (make_dir / ".venv" / ".installed-cdk").touch()
    commands = dry_run(make_dir, "setup")
    assert "--group dev --group train" in commands
    assert "npm ci" not in commands  # node_modules came with setup-cdk


def test_synthesis_imports_nothing_from_the_train_or_dev_groups(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {NOT_CDK!r}:
                    raise ImportError("synthesis imported " + name)
        sys.meta_path.insert(0, Block())
        from config.loader import load_settings
        from stacks.synth_all import synthesize
        synthesize(load_settings("dev"), __import__("pathlib").Path({str(tmp_path)!r}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], check=False, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "dev" / "manifests").is_dir()

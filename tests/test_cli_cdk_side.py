"""Every `raytrain` command runs on the CDK side alone (what `make synth` installs), or says in one line
what to install: the packages only the train and dev dependency groups bring are made unimportable."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

from raytrain import cli

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _closure(names: list[str]) -> set[str]:
    """Distributions these need, transitively (installed metadata; extras' requirements left out)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [_name(r) for r in requires if "extra ==" not in r]
    return seen


def group_only_imports() -> set[str]:
    """Top-level import names of the distributions that only the train/dev groups install."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    cdk_side = _closure([_name(r) for r in project["project"]["dependencies"]])
    groups = [_name(r) for g in ("train", "dev") for r in project["dependency-groups"][g]]
    extra = _closure(groups) - cdk_side
    modules = set()
    for module, dists in metadata.packages_distributions().items():
        if any(d.lower().replace("_", "-") in extra for d in dists) and not module.startswith("_"):
            modules.add(module)
    return modules


def run_cdk_side(args: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    blocked = sorted(group_only_imports())
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {blocked!r}:
                    raise ModuleNotFoundError("No module named " + repr(name), name=name)
        sys.meta_path.insert(0, Block())
        from raytrain.cli import build_parser, main
        if {args!r} == ["--help-all"]:
            parser = build_parser()
            for name in parser._subparsers._group_actions[0].choices:
                try:
                    parser.parse_args([name, "--help"])
                except SystemExit as exc:
                    assert exc.code == 0, name
            sys.exit(0)
        sys.exit(main({args!r}))
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def test_the_groups_bring_torch_and_the_test_tools_but_not_cfn_lint():
    blocked = group_only_imports()
    assert {"torch", "ray", "transformers", "pytest", "moto"} <= blocked
    assert "cfnlint" not in blocked  # raytrain review needs it: it is on the CDK side


def test_every_command_and_its_help_load_on_the_cdk_side():
    # Imports every command module, builds the parser, prints every subcommand's --help.
    result = run_cdk_side(["--help-all"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr == ""
    names = set(cli.build_parser()._subparsers._group_actions[0].choices)
    assert {"review", "verify", "cost", "capacity", "pipeline-verify", "plan"} <= names
    for name in names:
        assert f"usage: raytrain {name}" in result.stdout


def _assembly(directory: Path, template: dict) -> Path:
    directory.mkdir(parents=True)
    (directory / "S.template.json").write_text(json.dumps(template))
    artifact = {"type": "aws:cloudformation:stack", "properties": {"templateFile": "S.template.json"}}
    (directory / "manifest.json").write_text(json.dumps({"artifacts": {"S": artifact}}))
    return directory


def test_review_runs_on_the_cdk_side(tmp_path):
    def template(ami: str) -> dict:
        props = {"ClusterName": "c", "NodeRole": "r", "Subnets": ["s"], "AmiType": ami}
        return {"Resources": {"Group": {"Type": "AWS::EKS::Nodegroup", "Properties": props}}}

    base = _assembly(tmp_path / "base", template("AL2023_X86_64_STANDARD"))
    current = _assembly(tmp_path / "current", template("AL2023_ARM_64_STANDARD"))
    result = run_cdk_side(
        ["review", "--env", "dev", "--base", str(base), "--current", str(current), "--json"]
    )
    assert result.returncode == 1, result.stderr[-2000:]  # the schema (cfn-lint's) says: replaced
    (stack,) = json.loads(result.stdout)
    assert stack["changes"][0]["action"] == "replaced"


def test_a_missing_package_gets_one_line_naming_it_and_make_setup(monkeypatch, capsys):
    def needs_torch(args):
        import torch_not_installed  # noqa: F401  # type: ignore[import-not-found]

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["cost"].set_defaults(func=needs_torch)
    assert cli.main(["cost", "--env", "dev"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "'torch_not_installed' is not installed" in err and "make setup" in err

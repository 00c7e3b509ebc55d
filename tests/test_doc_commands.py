"""Every command README.md, docs/*.md and config/environments/example.yaml show runs as written.

Extracted: each line of a ```bash / ```sh block (backslash continuations joined, trailing comments
dropped), each inline `code span` that starts with a program we document (`raytrain`, `npx cdk`,
`make`, `python -m`, `aws`, `kubectl`), and example.yaml's comment lines running `npx cdk`.
Placeholders (ACCOUNT, REGION, <env>, NAME, ...) become the documented example values and optional
parts in [brackets] are left out. Then, per program:

- raytrain: parsed by raytrain's own argparse; the offline ones run for real (`cost`, `plan`,
  `job submit --dry-run`, `--help`): exit 0.
- npx cdk: the subcommand and every option checked against the pinned CLI's own option table
  (node_modules/aws-cdk/lib/cli/cli-type-registry.json), the environment and output folder against
  the app's rule (app.outdir_problem; without -o, cdk.json's "output"); a bare `npx cdk ls` runs.
- make: `make -n TARGET VAR=...` (the target exists; nothing runs).
- aws: the service and operation exist in botocore's model and each --option names an input member
  (the AWS CLI's own customizations, which have no model, by name).
- kubectl: the cluster's kubectl layer's kubectl parses it (no "unknown flag/command") against an
  address where nothing listens.
- python -m MODULE / python FILE: the module or file exists; `python -m training --help` runs.
Everything else shown (`source`, `vllm`, `export`) is not this project's to check.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import botocore.session
import pytest

import app
from config.loader import environment_names
from raytrain import cli
from tests.helm_charts import layer_kubectl

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("raytrain", "npx", "make", "python", "aws", "kubectl")
NOT_OURS = ("source", "vllm", "export", "uvx", "git", "pip", "#")

# Placeholders -> the documented example values (longest first).
PLACEHOLDERS = {
    "aws://<dev account>/<region>": "aws://111122223333/us-west-2",
    "<prod account>": "444455556666",
    "<policy ARN>": "arn:aws:iam::aws:policy/AdministratorAccess",
    "aws://ACCOUNT/REGION": "aws://111122223333/us-west-2",
    "<namespace>": "ray",
    "<name>": "prod",  # not the default environment: its -o is checked
    "<env>": "prod",
    "--env NAME": "--env prod",
    "env=NAME": "env=prod",
    "cdk.out/NAME": "cdk.out/prod",
    "--id ...": "--id RayTrain-dev-verify:0",
}


@dataclass(frozen=True)
class Command:
    where: str
    text: str
    inline: bool  # a `code span` in prose (may name only a command, as a reference)

    @property
    def argv(self) -> list[str]:
        text = self.text
        for old, new in PLACEHOLDERS.items():
            text = text.replace(old, new)
        # Optional parts of a usage line: [--name N], [-f], [--head | --worker N] ...
        while re.search(r"\[[^\[\]]*\]", text):
            text = re.sub(r"\s*\[[^\[\]]*\]", "", text)
        argv = shlex.split(text)
        if ">" in argv:  # a redirection: the command is what comes before it
            argv = argv[: argv.index(">")]
        return argv


def _fenced(path: Path) -> list[Command]:
    out, lang, pending = [], None, ""
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            lang = None if lang is not None else (stripped[3:].strip() or "text")
            continue
        if lang not in ("bash", "sh", "shell"):
            continue
        pending += stripped
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        text = re.sub(r"\s+#\s.*$", "", pending).strip()
        pending = ""
        if text and not text.startswith("#"):
            out.append(Command(f"{path.name}:{number}", text, inline=False))
    return out


def _inline(path: Path) -> list[Command]:
    out = []
    in_fence = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for span in re.findall(r"`([^`]+)`", line):
            words = span.split()
            if len(words) >= 2 and words[0] in PROGRAMS:
                out.append(Command(f"{path.name}:{number}", span, inline=True))
    return out


def _example_yaml() -> list[Command]:
    path = ROOT / "config" / "environments" / "example.yaml"
    return [
        Command(f"example.yaml:{n}", line.lstrip("# ").strip(), inline=False)
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if line.startswith("#") and line.lstrip("# ").startswith("npx cdk")
    ]


def documented() -> list[Command]:
    found = [c for path in DOCS for c in (*_fenced(path), *_inline(path))] + _example_yaml()
    return [c for c in found if c.text.split()[0] not in NOT_OURS]


ALL = documented()


def _is_reference(command: Command) -> bool:
    """An inline mention of a command, not a command line: a synopsis (a|b, …) or a bare name."""
    return command.inline and ("|" in command.text or "…" in command.text or "..." in command.text)


# --- raytrain ---------------------------------------------------------------------------------------

RUN_OFFLINE = {("cost",), ("plan",), ("job", "submit", "--dry-run"), ("--help",), ("capacity", "--help")}


def _subparsers(parser: Any) -> dict[str, Any]:
    groups = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return dict(groups[0].choices) if groups else {}


def check_raytrain(command: Command) -> None:
    argv = command.argv[1:]
    parser = cli.build_parser()
    joined = " ".join(argv)
    if any(ch in joined for ch in "|/…") or (command.inline and not {"--env", "--help"} & set(argv)):
        # A reference in prose (`raytrain job status|logs|dashboard`, `raytrain job logs --head`):
        # the subcommands it names exist, and so do its options.
        for token in joined.split():
            alternatives = [w for w in re.split(r"[|/]", token) if w and w != "…"]
            for word in alternatives:
                if word.startswith("-"):
                    options = {o for a in parser._actions for o in a.option_strings}
                    assert word in options, f"{command.where}: {parser.prog} has no {word}"
                else:
                    assert word in _subparsers(parser), f"{command.where}: no `{parser.prog} {word}`"
            if alternatives and not alternatives[0].startswith("-"):
                parser = _subparsers(parser)[alternatives[0]]  # siblings: go on from the first
        return
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 0, f"{command.where}: raytrain refuses {argv}"


def run_raytrain(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raytrain", *argv],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "KUBECONFIG": "/nonexistent/kubeconfig", "AWS_CONFIG_FILE": "/dev/null",
             "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"},
    )  # fmt: skip


# --- npx cdk ---------------------------------------------------------------------------------------


@functools.cache
def cdk_registry() -> dict[str, Any]:
    return dict(json.loads((ROOT / "node_modules/aws-cdk/lib/cli/cli-type-registry.json").read_text()))


def check_cdk(command: Command) -> None:
    argv = command.argv
    assert argv[:2] == ["npx", "cdk"], command
    registry = cdk_registry()
    by_name = dict(registry["commands"])
    for spec in registry["commands"].values():
        for alias in spec.get("aliases", []):
            by_name[alias] = spec
    sub, rest = argv[2], argv[3:]
    if sub == "…":  # a synopsis (`npx cdk … -c env=NAME -o cdk.out/NAME`): the global options
        command_options: dict[str, Any] = {}
    else:
        assert sub in by_name, f"{command.where}: the CDK CLI has no command {sub!r}"
        command_options = by_name[sub].get("options", {})
    options = {**registry["globalOptions"], **command_options}
    aliases = {spec["alias"]: name for name, spec in options.items() if isinstance(spec.get("alias"), str)}
    context: dict[str, str] = {}
    output = None
    i = 0
    while i < len(rest):
        word = rest[i]
        if word.startswith("-"):
            name, _, value = word.lstrip("-").partition("=")
            name = aliases.get(name, name)
            if name.startswith("no-") and name[3:] in options:
                name = name[3:]
            assert name in options, f"{command.where}: `cdk {sub}` has no option --{name}"
            spec = options[name]
            if spec.get("type") != "boolean" and not value:
                i += 1
                value = rest[i]
            if "choices" in spec:
                assert value in spec["choices"], f"{command.where}: --{name} {value}: {spec['choices']}"
            if name == "context":
                key, _, val = value.partition("=")
                context[key] = val
            if name == "output":
                output = value
        i += 1
    cdk_json = json.loads((ROOT / "cdk.json").read_text())
    env = context.get("env", cdk_json["context"]["env"])
    assert env in environment_names(), f"{command.where}: no environment {env!r}"
    outdir = str(ROOT / (output or cdk_json["output"]))
    problem = app.outdir_problem(env, outdir)
    assert problem is None, f"{command.where}: the app refuses it: {problem}"


# --- make, aws, kubectl, python ------------------------------------------------------------------


def check_make(command: Command) -> None:
    argv = command.argv
    out = subprocess.run(
        ["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, f"{command.where}: {command.text}: {out.stderr.strip()}"


# The AWS CLI's own commands (awscli/customizations), which botocore's models do not describe.
AWS_CUSTOMIZATIONS = {("eks", "update-kubeconfig"), ("s3", "sync"), ("s3", "cp"), ("sso", "login")}


def check_aws(command: Command) -> None:
    argv = [a for a in command.argv if a not in ("…", "...")]
    service, operation = argv[1], argv[2] if len(argv) > 2 else None
    session = botocore.session.get_session()
    if operation is None:
        assert service in session.get_available_services(), command
        return
    if (service, operation) in AWS_CUSTOMIZATIONS:
        return
    model = session.get_service_model(service)
    names = {re.sub(r"(?<!^)(?=[A-Z])", "-", op).lower(): op for op in model.operation_names}
    assert operation in names, f"{command.where}: aws {service} has no {operation}"
    members = model.operation_model(names[operation]).input_shape.members
    kebab = {re.sub(r"(?<!^)(?=[A-Z])", "-", m).lower() for m in members}
    for word in argv[3:]:
        if word.startswith("--"):
            name = word[2:].removeprefix("no-")
            assert name in kebab, f"{command.where}: aws {service} {operation} has no --{name}"


def check_kubectl(command: Command, kubectl: Path) -> None:
    argv = command.argv[1:]
    if command.inline and len(argv) <= 2 and all(not a.startswith("-") or a == "-f" for a in argv):
        argv = [argv[0], "--help"]  # a reference (`kubectl delete -f`): the command exists
    out = subprocess.run(
        [str(kubectl), *argv, "--kubeconfig", "/dev/null", "--server", "http://127.0.0.1:9",
         "--request-timeout", "1s"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "unknown" not in out.stderr.lower(), f"{command.where}: {out.stderr.strip()}"


def check_python(command: Command) -> None:
    argv = [a for a in command.argv[1:] if a not in ("…", "...")]
    if argv[0] == "-m":
        assert find_spec(argv[1]) is not None, f"{command.where}: no module {argv[1]}"
    else:
        assert (ROOT / argv[0]).is_file(), f"{command.where}: no file {argv[0]}"


# --- the tests ---------------------------------------------------------------------------------------


def test_the_docs_show_commands_of_every_kind():
    """The extraction finds what the README's walkthrough shows (a test that finds nothing checks nothing)."""
    texts = {c.text for c in ALL}
    assert "npx cdk bootstrap aws://ACCOUNT/REGION" in texts
    assert "npx cdk deploy -c env=<name> -o cdk.out/<name> --all" in texts
    assert any(
        t.startswith("raytrain job submit --env dev --team research --set job.steps=20") for t in texts
    )
    assert "make review ENV=dev" in texts
    assert {c.text.split()[0] for c in ALL} >= {"raytrain", "npx", "make", "aws", "kubectl", "python"}


@pytest.mark.parametrize("command", ALL, ids=lambda c: f"{c.where} {c.text[:60]}")
def test_documented_command_is_accepted(command: Command, request: pytest.FixtureRequest) -> None:
    program = command.text.split()[0]
    if program == "raytrain":
        check_raytrain(command)
    elif program == "npx":
        check_cdk(command)
    elif program == "make":
        check_make(command)
    elif program == "aws":
        check_aws(command)
    elif program == "kubectl":
        check_kubectl(command, request.getfixturevalue("kubectl"))
    elif program == "python":
        check_python(command)
    else:
        pytest.fail(f"{command.where}: no check for {program!r}")


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from config.loader import load_settings

    return layer_kubectl(load_settings("dev").cluster.kubernetes_version, tmp_path_factory.mktemp("layer"))


def test_the_offline_raytrain_commands_run_as_written() -> None:
    """cost, plan, job submit --dry-run (no cluster here) and --help, each exactly as shown."""
    ran = set()
    for command in ALL:
        argv = command.argv[1:]
        if command.text.split()[0] != "raytrain" or _is_reference(command):
            continue
        if "--env" not in argv and "--help" not in argv:
            continue  # a reference in prose, e.g. `raytrain cost`
        if not any(all(w in argv for w in words) for words in RUN_OFFLINE) or tuple(argv) in ran:
            continue
        result = run_raytrain(argv)
        assert result.returncode == 0, f"{command.where}: {command.text}\n{result.stderr[-2000:]}"
        if "--dry-run" in argv:
            assert json.loads(result.stdout)["kind"] == "RayJob"
        ran.add(tuple(argv))
    assert len(ran) >= 4, ran


def test_a_bare_cdk_ls_lists_the_default_environment() -> None:
    """`npx cdk ls` without -c/-o: cdk.json's default environment into its own folder."""
    out = subprocess.run(
        ["npx", "cdk", "ls"], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["RayTrain-dev-Network", "RayTrain-dev-Cluster", "RayTrain-dev-Workload"]

"""make synth's summary: one block per environment that fits 80 columns, with the checks' result,
the RayJob's name, CDK's own warnings, and a loud line for documentation placeholders."""

from __future__ import annotations

import json
import types
from pathlib import Path

from rich.console import Console

from config.loader import load_settings
from config.placeholders import placeholders
from stacks.synth_all import AssemblyReport, environment_panel


def _real(settings):
    """dev with its placeholders replaced by values a user would write."""
    cluster = settings.cluster.model_copy(
        update={
            "public_access_cidrs": ["100.64.10.0/24"],
            "admin_principal_arns": ["arn:aws:iam::210987654320:role/Admin"],
        }
    )
    teams = {
        name: team.model_copy(update={"submitters": [f"arn:aws:iam::210987654320:role/{name}"]})
        for name, team in settings.teams.items()
    }
    return settings.model_copy(update={"account": "210987654320", "cluster": cluster, "teams": teams})


def test_the_shipped_placeholders_are_found():
    assert placeholders(load_settings("dev")) == [
        "account: 111122223333 (an AWS documentation example account)",
        "cluster.public_access_cidrs[0]: 203.0.113.0/24 (a documentation-only address range, RFC 5737/3849)",
        "cluster.admin_principal_arns[0]: arn:aws:iam::111122223333:role/Admin"
        " (an AWS documentation example account)",
        "teams.research.submitters[0]: arn:aws:iam::111122223333:role/MLEngineer"
        " (an AWS documentation example account)",
        "teams.applied.submitters[0]: arn:aws:iam::111122223333:role/AppliedML"
        " (an AWS documentation example account)",
    ]
    assert any(p.startswith("pipeline.connection_arn: ") for p in placeholders(load_settings("prod")))


def test_real_values_are_not_placeholders():
    assert placeholders(_real(load_settings("dev"))) == []


def _assembly(root: Path) -> Path:
    assembly = root / "dev"
    (assembly / "manifests").mkdir(parents=True)
    (assembly / "manifests" / "RayJob.rj-dev-smoke-0123456789.k8s.yaml").write_text("kind: RayJob\n")
    warning = {"type": "aws:cdk:warning", "data": "V1 pipeline type is implicitly selected"}
    acks = {
        "type": "aws:cdk:acknowledged-rules",
        "data": {"Annotation::AwsSolutions-IAM4[x]": "why", "Other": "y"},
    }
    (assembly / "S.metadata.json").write_text(json.dumps({"/S/A": [warning, acks], "/S/B": [warning]}))
    nested = assembly / "assembly-S-Stage"
    nested.mkdir()
    (nested / "T.metadata.json").write_text(
        json.dumps({"/T": [{"type": "aws:cdk:warning", "data": "second"}]})
    )
    report = {"pluginReports": [{"pluginName": "CloudFormation Validate", "conclusion": "success",
                                 "violations": [], "suppressedViolations": [{}, {}]}]}  # fmt: skip
    (assembly / "validation-report.json").write_text(json.dumps(report))
    return assembly


def test_assembly_report_reads_warnings_acknowledgements_and_the_rayjob(tmp_path):
    report = AssemblyReport.read(_assembly(tmp_path))
    assert report.warnings == ["V1 pipeline type is implicitly selected", "second"]  # once each, nested too
    assert report.acknowledged == 1
    assert report.cfn_validate == "CloudFormation Validate: success (2 acknowledged)"
    assert report.rayjob == "rj-dev-smoke-0123456789"


def _render(settings, out: Path, width: int) -> str:
    stacks = types.SimpleNamespace(all=lambda: [types.SimpleNamespace(stack_name=f"RayTrain-dev-{n}")
                                                for n in ("Network", "Cluster", "Workload")])  # fmt: skip
    console = Console(width=width, record=True, color_system=None)
    console.print(environment_panel(settings, stacks, out))
    return console.export_text()


def test_the_block_fits_80_columns_without_cutting_values(tmp_path):
    _assembly(tmp_path)
    text = _render(load_settings("dev"), tmp_path, 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text
    flat = " ".join(" ".join(line.strip("│ ").split()) for line in text.splitlines())
    for expected in ("111122223333", "g6.12xlarge", "RayTrain-dev-Workload", "rj-dev-smoke-0123456789",
                     "cdk-nag AwsSolutions: passed", "V1 pipeline type is implicitly selected",
                     "PLACEHOLDERS", "203.0.113.0/24"):  # fmt: skip
        assert expected in flat, expected


def test_the_block_sizes_the_job_s_own_model(tmp_path):
    from config.loader import parse_settings

    _assembly(tmp_path)
    text = (Path("config/environments/dev.yaml")).read_text()
    dev = parse_settings(
        text, name="dev", source="dev.yaml", check_memory=False, overrides=["job.model=Qwen/Qwen2.5-3B"]
    )
    flat = " ".join(" ".join(line.strip("│ ").split()) for line in _render(dev, tmp_path, 100).splitlines())
    assert "Qwen/Qwen2.5-3B (catalogue qwen2.5-3b, 3.09 B parameters), full fine-tune" in flat


def test_no_placeholder_line_once_they_are_replaced(tmp_path):
    _assembly(tmp_path)
    assert "PLACEHOLDERS" not in _render(_real(load_settings("dev")), tmp_path, 100)

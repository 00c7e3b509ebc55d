"""A gated model's token: only the secret's ARN is in the settings, the template and the RayJob (head
and workers); the Ray pods' role may read that ARN only; each process reads the token itself and
sets HF_TOKEN in-process (training/common/hub_token.py, against moto's Secrets Manager and SSM)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from config.loader import ENVIRONMENTS_DIR, SettingsError, parse_settings
from tests.chart_render import render, variant
from training.common.hub_token import HF_TOKEN_SECRET_ENV, TokenError, ensure_hf_token, read_token

REGION = "us-west-2"
ARN = "arn:aws:secretsmanager:us-west-2:111122223333:secret:hf-token-AbCdEf"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield


@pytest.mark.usefixtures("aws")
@pytest.mark.parametrize(("value", "token"), [("hf_abc", "hf_abc"), ('{"HF_TOKEN": "hf_json"}', "hf_json")])
def test_the_token_is_read_from_secrets_manager_or_ssm(value: str, token: str) -> None:
    arn = boto3.client("secretsmanager", region_name=REGION).create_secret(Name="t", SecretString=value)[
        "ARN"
    ]
    assert read_token(arn) == token
    ssm = boto3.client("ssm", region_name=REGION)
    ssm.put_parameter(Name="/hf/token", Value=value, Type="SecureString")
    assert read_token(ssm.get_parameter(Name="/hf/token")["Parameter"]["ARN"]) == token


@pytest.mark.usefixtures("aws")
def test_each_process_sets_hf_token_from_the_named_secret_once() -> None:
    arn = boto3.client("secretsmanager", region_name=REGION).create_secret(Name="t", SecretString="hf_x")[
        "ARN"
    ]
    env: dict[str, str] = {HF_TOKEN_SECRET_ENV: arn}
    assert ensure_hf_token(env) and env["HF_TOKEN"] == "hf_x"
    assert not ensure_hf_token(env)  # already set: not read again
    assert not ensure_hf_token({})  # no secret named: nothing to do
    mine = {HF_TOKEN_SECRET_ENV: arn, "HF_TOKEN": "hf_local"}
    assert not ensure_hf_token(mine) and mine["HF_TOKEN"] == "hf_local"


@pytest.mark.usefixtures("aws")
def test_an_unreadable_or_empty_secret_is_one_line_naming_it() -> None:
    with pytest.raises(
        TokenError, match=rf"^job.hf_token_secret: cannot read {ARN}: ResourceNotFoundException"
    ):
        read_token(ARN)
    arn = boto3.client("secretsmanager", region_name=REGION).create_secret(Name="e", SecretString='{"x": 1}')[
        "ARN"
    ]
    with pytest.raises(TokenError, match=r"holds no token: store the token itself"):
        read_token(arn)


def test_the_model_loader_reads_the_token_before_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    from training.model import build

    calls: list[str] = []
    monkeypatch.setattr(build, "ensure_hf_token", lambda: calls.append("token"))
    assert build.local_model_dir("meta-llama/Llama-3.1-8B", weights=False) == "meta-llama/Llama-3.1-8B"
    assert calls == ["token"]
    build.local_model_dir(str(Path(__file__).parent), weights=False)  # a local folder: no hub
    assert calls == ["token"]


def _with_token(arn: str = ARN) -> Any:
    return variant("dev", job={"hf_token_secret": arn})


def test_only_the_arn_reaches_head_and_workers() -> None:
    docs = render(_with_token())
    (job,) = [d for d in docs if d["kind"] == "RayJob"]
    spec = job["spec"]["rayClusterSpec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    for group in groups:
        (container,) = [c for c in group["template"]["spec"]["containers"] if c["name"].startswith("ray")]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env[HF_TOKEN_SECRET_ENV] == ARN and "HF_TOKEN" not in env
    plain = render(variant("dev"))
    assert HF_TOKEN_SECRET_ENV not in json.dumps(plain)


def test_the_pods_role_may_read_that_secret_only(tmp_path: Path) -> None:
    from stacks.synth_all import synthesize

    settings = _with_token()
    synthesize(settings, tmp_path)
    template = json.loads((tmp_path / "dev" / f"{settings.stack_prefix}-Workload.template.json").read_text())
    statements = [
        st
        for r in template["Resources"].values()
        if r["Type"] == "AWS::IAM::Policy"
        for st in r["Properties"]["PolicyDocument"]["Statement"]
    ]
    granted = [
        st
        for st in statements
        if "secretsmanager" in json.dumps(st["Action"]) or "ssm:" in json.dumps(st["Action"])
    ]
    # One grant per team's Ray pods' role (each team's jobs may use the model), on that ARN only.
    expected = {"Action": "secretsmanager:GetSecretValue", "Effect": "Allow", "Resource": ARN}
    assert granted == [expected] * len(settings.team_list)
    assert "hf_" not in json.dumps(template).replace("hf_token", "")


@pytest.mark.parametrize(
    ("job", "expected"),
    [
        ("  hf_token_secret: hf_abc123\n", "job.hf_token_secret: 'hf_abc123' is not a secret's ARN"),
        ("  hf_token_secret: arn:aws:secretsmanager:us-west-2:111122223333:secret:x-AbCdEf\n"
         "  model: s3://models-111122223333/qwen\n  config_json: tests/fixtures/qwen2.5-1.5b-config.json\n",
         "job.hf_token_secret: is set but job.model (s3://models-111122223333/qwen) is not a Hugging Face"),
    ],
)  # fmt: skip
def test_bad_token_settings_are_one_line(job: str, expected: str) -> None:
    text = (
        (ENVIRONMENTS_DIR / "dev.yaml")
        .read_text()
        .replace("  run_name: dev-smoke\n", f"  run_name: dev-smoke\n{job}")
    )
    with pytest.raises(SettingsError) as info:
        parse_settings(text, name="dev", source="dev.yaml")
    (line,) = str(info.value).splitlines()
    assert line.removeprefix("dev.yaml: ").startswith(expected), line


def test_a_token_in_worker_env_is_refused() -> None:
    text = (
        ENVIRONMENTS_DIR / "dev.yaml"
    ).read_text() + "\nworkload:\n  worker_env:\n    HF_TOKEN: hf_plain\n"
    with pytest.raises(SettingsError) as info:
        parse_settings(text, name="dev", source="dev.yaml")
    assert "HF_TOKEN is set by the chart (from job.hf_token_secret" in str(info.value)

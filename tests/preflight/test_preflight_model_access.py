"""`raytrain preflight` asks the hub whether the job's model is readable with the job's token, read
from Secrets Manager or SSM (moto) with the operator's credentials; the token is never printed."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest

from raytrain.preflight import command
from tests.preflight_account import REGION, Account, Registry, check_line, env_dir

MODEL = "Qwen/Qwen2.5-1.5B"  # dev's model, gated on the stub hub here
TOKEN = "hf_granted0123456789"


def _ready(account: Account) -> None:
    account.bootstrap()
    account.version()
    account.addons(["v1.8.0-eksbuild.1", "v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    account.ecr_clean()


def _env(tmp_path: Path, arn: str | None) -> Path:
    line = f"  hf_token_secret: {arn}\n" if arn else ""
    return env_dir(tmp_path, {"  run_name: dev-smoke\n": f"  run_name: dev-smoke\n{line}"})


@pytest.mark.parametrize("store", ["secretsmanager", "ssm", "secretsmanager-json"])
def test_a_gated_model_readable_with_the_secrets_token(
    account: Account, registry: Registry, tmp_path: Path, store: str
) -> None:
    assert account.hub is not None
    account.hub.gated[MODEL] = {TOKEN}
    if store == "ssm":
        ssm = boto3.client("ssm", region_name=REGION)
        ssm.put_parameter(Name="/raytrain/hf-token", Value=TOKEN, Type="SecureString")
        arn = ssm.get_parameter(Name="/raytrain/hf-token")["Parameter"]["ARN"]
    else:
        value = f'{{"HF_TOKEN": "{TOKEN}"}}' if store.endswith("json") else TOKEN
        arn = boto3.client("secretsmanager", region_name=REGION).create_secret(Name="hf", SecretString=value)[
            "ARN"
        ]
    _ready(account)
    code, lines = account.run(_env(tmp_path, arn), registry)
    assert code == command.EXIT_OK, lines
    assert check_line(lines, "model access").startswith(
        f"ok      model access: {MODEL} is readable with the token"
    )
    assert TOKEN not in "\n".join(lines)
    assert account.hub.tokens_seen[-1] == TOKEN


def test_a_gated_model_without_access_is_a_problem_naming_the_fix(
    account: Account, registry: Registry, tmp_path: Path
) -> None:
    assert account.hub is not None
    account.hub.gated[MODEL] = {"hf_someone_else"}
    arn = boto3.client("secretsmanager", region_name=REGION).create_secret(Name="hf", SecretString=TOKEN)[
        "ARN"
    ]
    _ready(account)
    code, lines = account.run(_env(tmp_path, arn), registry)
    assert code == command.EXIT_PROBLEM
    line = check_line(lines, "model access")
    assert f"{MODEL} is gated: not readable with the token of job.hf_token_secret" in line
    assert "accept the model's licence" in line and TOKEN not in line
    # Without a secret: the fix says how to give the job one.
    _ready(account)
    code, lines = account.run(_env(tmp_path, None), registry)
    assert "create a read token" in check_line(lines, "model access") and code == command.EXIT_PROBLEM
    assert account.hub.tokens_seen[-1] is None  # asked anonymously, as the pods would


def test_an_unreadable_secret_is_a_problem_naming_it(
    account: Account, registry: Registry, tmp_path: Path
) -> None:
    arn = f"arn:aws:secretsmanager:{REGION}:123456789012:secret:missing-AbCdEf"
    _ready(account)
    code, lines = account.run(_env(tmp_path, arn), registry)
    assert code == command.EXIT_PROBLEM
    assert f"cannot read {arn}: ResourceNotFoundException" in check_line(lines, "model access")

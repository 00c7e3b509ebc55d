"""`raytrain preflight`'s IAM permissions: the documented list covers every call it makes, and
suffices when moto's server enforces IAM; credentials and roles it refuses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from raytrain.aws import CapacityApi
from raytrain.preflight import IAM_ACTIONS, command
from raytrain.preflight.permissions import NO_PERMISSION_NEEDED
from tests.preflight_account import (
    DIGEST_A,
    DIGEST_B,
    RAY_REPO,
    RAY_TAG,
    REGION,
    Account,
    Registry,
    check_line,
    env_dir,
)

# --- permissions -------------------------------------------------------------------------------


def test_the_permission_list_covers_every_call(account: Account, registry: Registry, tmp_path: Path) -> None:
    """Every call a run makes is in IAM_ACTIONS (or needs none), and each listed action is made by
    some run here (ec2:DescribeCapacityReservations in the capacity-reservation test): the list is
    neither short nor padded."""
    registry.add(RAY_REPO, RAY_TAG, DIGEST_B)
    # A running G instance: the quota's usage is counted in vCPUs (ec2:DescribeInstanceTypes).
    setup = boto3.client("ec2", region_name=REGION)  # not watched: setup, not the command's calls
    ami = setup.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    setup.run_instances(ImageId=ami, InstanceType="g6.12xlarge", MinCount=1, MaxCount=1)
    account.bootstrap()
    account.version()
    account.addons(["v1.7.0-eksbuild.1"])
    # A quota never changed: Service Quotas answers with AWS's default.
    account.quota_stub.add_client_error("get_service_quota", "NoSuchResourceException")
    account.quota_stub.add_response(
        "get_aws_default_service_quota",
        {"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA", "Value": 64}},
    )
    account.ecr_clean(rules=["dev/ecr-public"])
    account.no_stack("RayTrain-dev-Cluster")
    account.ecr_stub.add_client_error("describe_images", "RepositoryNotFoundException")
    # A user among the principals too (iam:GetUser).
    account.principals("arn:aws:iam::111122223333:user/alice")
    submitters = "submitters: [arn:aws:iam::111122223333:role/MLEngineer"
    env = env_dir(tmp_path, {submitters: f"{submitters}, arn:aws:iam::111122223333:user/alice"},
                  append=f'\nworkload:\n  image_digest: "{DIGEST_A}"\n')  # fmt: skip
    _, lines = account.run(env, registry)
    assert "is 64 vCPUs; max_size 2 x g6.12xlarge needs 96" in check_line(lines, "gpu vcpu quota")
    calls = account.recorder.calls
    assert calls - NO_PERMISSION_NEEDED <= set(IAM_ACTIONS), calls - set(IAM_ACTIONS)
    # Made in the capacity-reservation test and, with job.hf_token_secret, the model-access tests.
    assert set(IAM_ACTIONS) - calls == {
        "ec2:DescribeCapacityReservations",
        "secretsmanager:GetSecretValue",
        "ssm:GetParameter",
    }


def test_docs_list_the_permissions() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    missing = [action for action in IAM_ACTIONS if f"`{action}`" not in text]
    assert not missing, f"docs/operations.md does not list {missing}"


def test_cli_registers_preflight() -> None:
    from raytrain.cli import build_parser

    args = build_parser().parse_args(["preflight", "--env", "dev"])
    assert args.func is command.run


# --- IAM enforced: moto's server evaluates the policy on every EC2 request ----------------------


@pytest.fixture
def moto_ec2_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from tests.moto_server import running_moto_server

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "admin")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "admin")
    with running_moto_server() as endpoint:
        yield endpoint


def _user_with(endpoint: str, actions: list[str]) -> dict[str, str]:
    iam = boto3.client("iam", region_name=REGION, endpoint_url=endpoint)
    name = f"preflight-{len(actions)}"
    iam.create_user(UserName=name)
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
    iam.put_user_policy(UserName=name, PolicyName="preflight", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}


def _enforce(monkeypatch: pytest.MonkeyPatch) -> None:
    import moto.settings
    from moto.core.authorization import ActionAuthenticatorMixin

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    monkeypatch.setattr(ActionAuthenticatorMixin, "request_count", 0)


@pytest.mark.parametrize("denied", [None, "ec2:DescribeInstanceTypeOfferings"])
def test_the_documented_ec2_permissions_suffice_under_iam(
    moto_ec2_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, denied: str | None
) -> None:
    """With exactly the listed EC2 actions the capacity checks pass; without one, that check is a
    problem line naming the denied call (not a traceback, not a skipped check)."""
    from config.loader import load_settings
    from raytrain.preflight import capacity
    from raytrain.preflight.report import guarded

    actions = [a for a in IAM_ACTIONS if a.startswith("ec2:") and a != denied]
    creds = _user_with(moto_ec2_server, actions)
    _enforce(monkeypatch)
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_ec2_server, **creds)
    quotas = boto3.client("service-quotas", region_name=REGION, **creds)
    settings = load_settings("dev", env_dir(tmp_path))
    with Stubber(quotas) as stub:
        if denied is None:
            stub.add_response(
                "get_service_quota",
                {"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA", "Value": 192}},
            )
        checks = guarded(
            "gpu capacity", lambda: capacity.capacity_checks(settings, CapacityApi(REGION, ec2, quotas))
        )
    if denied is None:
        assert [c.status.value for c in checks] == ["ok", "ok"], checks
    else:
        (check,) = checks
        assert check.status.value == "problem"
        assert "could not check: DescribeInstanceTypeOfferings was denied" in check.detail


def test_no_credentials_exit_3_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any
) -> None:
    from raytrain.cli import main

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    assert main(["preflight", "--env", "dev"]) == command.EXIT_AWS
    err = capsys.readouterr().err
    assert "no AWS credentials found" in err and "Traceback" not in err


def test_a_role_of_another_account_is_refused(aws_credentials: None, capsys: Any) -> None:
    from raytrain.cli import main

    with mock_aws():
        code = main(["preflight", "--env", "dev", "--role-arn", "arn:aws:iam::999999999999:role/cdk-lookup"])
    assert code == command.EXIT_AWS
    err = capsys.readouterr().err
    assert "the credentials are for account 999999999999, but env 'dev' is for account 111122223333" in err

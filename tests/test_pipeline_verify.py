"""`raytrain pipeline-verify` against moto in server mode, with IAM access control on.

The pipeline step's role assumes the environment's starter role, whose policy is the one the
PipelineAccess stack synthesizes (loaded into moto); the driver then uploads the checkout, starts
the in-VPC build on that object version, prints its log and fails unless it succeeded.

Where moto 5.2 falls short, and how it is handled here:
- CodeBuild and CloudWatch Logs requests are authorised against the resource "*" (their responses
  define no resource): StartBuild, StopBuild and BatchGetBuilds are authorised here on the
  project's ARN, GetLogEvents on the log stream's ARN, as the CodeBuild and CloudWatch Logs
  permissions references say.
- A build's state: moto's BatchGetBuilds reports SUCCEEDED at once and its builds name no log
  stream. A scripted build stands in for the in-VPC build (its states, its phases, the log lines
  it writes to the project's log group through moto's Logs API).
- Trust policies: moto matches the caller's session ARN (assumed-role/NAME/SESSION) literally
  against the principal, where AWS matches a role's sessions to the role's ARN; the starter role's
  trust lists both.
- S3 stores SSE-KMS objects without calling KMS, so kms:GenerateDataKey (which PutObject needs on
  the bucket's key, S3 API reference in botocore's model) is evaluated with moto's policy
  evaluator against the key's ARN.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")  # skips the module without moto

from config.names import VerifyBuild  # noqa: E402
from tests.cfn_intrinsics import resolve  # noqa: E402
from tests.moto_server import running_moto_server  # noqa: E402

HOST = "prod"
ENV = "dev"
ACCOUNT = "123456789012"  # moto's account: the environment's account in this test
SYNTH_ACCOUNT = "111122223333"
REGION = "us-west-2"
ADMIN = {"aws_access_key_id": "AKIAADMIN0000000000", "aws_secret_access_key": "x", "region_name": REGION}


def _access_template(synthesized: Any) -> dict[str, Any]:
    (assembly,) = synthesized[HOST].directory.glob(f"assembly-*-Deploy-{ENV}")
    (path,) = assembly.glob("*PipelineAccess*.template.json")
    return dict(json.loads(path.read_text()))


def _logical(template: dict[str, Any], kind: str, prefix: str) -> str:
    (found,) = [k for k, r in template["Resources"].items() if r["Type"] == kind and k.startswith(prefix)]
    return found


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with running_moto_server() as endpoint:
        yield endpoint


class Env:
    """The environment's account in moto: the PipelineAccess stack's bucket, key, project, log
    group and starter role (with the synthesized policy), and the pipeline step's role."""

    def __init__(self, endpoint: str, template: dict[str, Any], settings: Any) -> None:
        self.endpoint = endpoint
        self.settings = settings
        self.names: VerifyBuild = settings.verify_build
        admin = {**ADMIN, "endpoint_url": endpoint}
        s3 = boto3.client("s3", **admin)
        s3.create_bucket(Bucket=self.names.bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
        s3.put_bucket_versioning(Bucket=self.names.bucket, VersioningConfiguration={"Status": "Enabled"})
        self.key_arn = boto3.client("kms", **admin).create_key(Description="source")["KeyMetadata"]["Arn"]
        s3.put_bucket_encryption(
            Bucket=self.names.bucket,
            ServerSideEncryptionConfiguration={
                "Rules": [
                    {
                        "ApplyServerSideEncryptionByDefault": {
                            "SSEAlgorithm": "aws:kms",
                            "KMSMasterKeyID": self.key_arn,
                        }
                    }
                ]
            },
        )
        iam = boto3.client("iam", **admin)
        build_role = iam.create_role(
            RoleName="verify-build",
            AssumeRolePolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "codebuild.amazonaws.com"},
                            "Action": "sts:AssumeRole",
                        }
                    ],
                }
            ),
        )["Role"]["Arn"]
        self.codebuild = boto3.client("codebuild", **admin)
        self.codebuild.create_project(
            name=self.names.project,
            source={"type": "S3", "location": f"{self.names.bucket}/{self.names.SOURCE_KEY}"},
            artifacts={"type": "NO_ARTIFACTS"},
            environment={
                "type": "LINUX_CONTAINER",
                "image": "aws/codebuild/standard:7.0",
                "computeType": "BUILD_GENERAL1_SMALL",
            },
            serviceRole=build_role,
        )
        self.logs = boto3.client("logs", **admin)
        self.logs.create_log_group(logGroupName=self.names.log_group)

        # The starter role, with the synthesized trust principal's name and policy.
        resources = template["Resources"]
        starter_id = _logical(template, "AWS::IAM::Role", "StarterRole")
        (policy,) = [
            r["Properties"]["PolicyDocument"]
            for r in resources.values()
            if r["Type"] == "AWS::IAM::Policy" and {"Ref": starter_id} in r["Properties"]["Roles"]
        ]
        refs = {
            _logical(template, "AWS::S3::Bucket", "Source7"): f"arn:aws:s3:::{self.names.bucket}",
            _logical(template, "AWS::KMS::Key", "SourceKey"): self.key_arn,
            _logical(template, "AWS::CodeBuild::Project", "VerifyProject"): self.names.project_arn,
        }
        self.policy = resolve(
            policy,
            refs,
            pseudo={"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT},
            replace=(SYNTH_ACCOUNT, ACCOUNT),
        )
        principal = resources[starter_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"][0][
            "Principal"
        ]
        steps_role_name = principal["AWS"].rsplit("/", 1)[1]
        steps_role = iam.create_role(
            RoleName=steps_role_name,
            AssumeRolePolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
                            "Action": "sts:AssumeRole",
                        }
                    ],
                }
            ),
        )["Role"]
        iam.put_role_policy(
            RoleName=steps_role_name,
            PolicyName="assume-starter",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Action": "sts:AssumeRole",
                            "Resource": self.names.starter_role_arn,
                        }
                    ],
                }
            ),
        )
        iam.create_role(
            RoleName=self.names.starter_role,
            AssumeRolePolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {
                                "AWS": [
                                    steps_role["Arn"],  # what the stack writes
                                    # moto compares the caller's session ARN with the principal literally; AWS
                                    # matches a role's sessions to the role's ARN.
                                    f"arn:aws:sts::{ACCOUNT}:assumed-role/{steps_role_name}/codebuild",
                                ]
                            },
                            "Action": "sts:AssumeRole",
                        }
                    ],
                }
            ),
        )
        iam.put_role_policy(
            RoleName=self.names.starter_role, PolicyName="synthesized", PolicyDocument=json.dumps(self.policy)
        )
        creds = boto3.client("sts", **admin).assume_role(
            RoleArn=steps_role["Arn"], RoleSessionName="codebuild"
        )["Credentials"]
        # The pipeline step's CodeBuild credentials.
        self.step_session = boto3.Session(
            aws_access_key_id=creds["AccessKeyId"],
            aws_secret_access_key=creds["SecretAccessKey"],
            aws_session_token=creds["SessionToken"],
            region_name=REGION,
        )


@pytest.fixture(scope="module")
def env(synthesized: Any, moto_endpoint: str) -> Env:
    settings = synthesized[ENV].settings.model_copy(update={"account": ACCOUNT})
    return Env(moto_endpoint, _access_template(synthesized), settings)


class ScriptedBuild:
    """Stands in for the in-VPC build: moto's BatchGetBuilds reports SUCCEEDED at once."""

    def __init__(self, env: Env, statuses: list[str], lines: list[str]) -> None:
        self.env, self.statuses, self.lines = env, list(statuses), list(lines)
        self.stream: str | None = None
        self.written = 0

    def batch_get_builds(self, backend: Any, ids: list[str]) -> list[dict[str, Any]]:
        (build_id,) = ids
        project = build_id.split(":", 1)[0]
        (build,) = [b for b in backend.build_metadata_history[project] if b["id"] == build_id]
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        # As CodeBuild does, in the environment's account (moto's backend: no request to sign).
        from moto.logs.models import logs_backends

        group = logs_backends[ACCOUNT][REGION].groups[self.env.names.log_group]
        if self.stream is None:
            self.stream = build_id.split(":", 1)[1]
            group.create_log_stream(self.stream)
        if self.lines:  # one log line per poll, as a build writes while it runs
            self.written += 1
            group.put_log_events(
                self.stream, [{"timestamp": 1_700_000_000_000 + self.written, "message": self.lines.pop(0)}]
            )
        build["logs"] = {"groupName": self.env.names.log_group, "streamName": self.stream}
        build["buildStatus"] = status
        build["phases"] = (
            [
                {
                    "phaseType": "BUILD",
                    "phaseStatus": "FAILED",
                    "contexts": [{"statusCode": "COMMAND_EXECUTION_ERROR", "message": "exit status 1"}],
                }
            ]
            if status == "FAILED"
            else [{"phaseType": "BUILD", "phaseStatus": "SUCCEEDED" if status == "SUCCEEDED" else None}]
        )
        return [build]


@pytest.fixture
def enforced(env: Env, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """IAM access control on, with CodeBuild and Logs requests authorised on their resources."""
    import moto.settings
    from moto.codebuild.responses import CodeBuildResponse
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.logs.responses import LogsResponse

    names = env.names

    def codebuild_resource(self: Any) -> str:
        body = json.loads(self.body or "{}")
        project = (
            body.get("projectName") or (body.get("id") or (body.get("ids") or ["*:"])[0]).split(":", 1)[0]
        )
        return f"arn:aws:codebuild:{REGION}:{ACCOUNT}:project/{project}"

    def logs_resource(self: Any) -> str:
        body = json.loads(self.body or "{}")
        group, stream = body.get("logGroupName", "*"), body.get("logStreamName", "*")
        return f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}:log-stream:{stream}"

    monkeypatch.setattr(CodeBuildResponse, "_determine_resource", codebuild_resource, raising=False)
    monkeypatch.setattr(LogsResponse, "_determine_resource", logs_resource, raising=False)
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    monkeypatch.setattr(ActionAuthenticatorMixin, "request_count", 0)
    monkeypatch.setenv("AWS_ENDPOINT_URL", env.endpoint)
    assert names.project_arn == f"arn:aws:codebuild:{REGION}:{ACCOUNT}:project/{names.project}"
    yield


def _script(
    monkeypatch: pytest.MonkeyPatch, env: Env, statuses: list[str], lines: list[str]
) -> ScriptedBuild:
    from moto.codebuild.models import CodeBuildBackend

    scripted = ScriptedBuild(env, statuses, lines)
    monkeypatch.setattr(
        CodeBuildBackend,
        "batch_get_builds",
        lambda backend, ids: scripted.batch_get_builds(backend, ids),  # noqa: PLW0108
    )
    return scripted


def _checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "config").mkdir(parents=True)
    (root / "Makefile").write_text("setup-cdk:\n\ttrue\n")
    (root / "config" / "dev.yaml").write_text("name: dev\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "python").write_text("not source")
    (root / "node_modules").mkdir()
    (root / "node_modules" / "x.js").write_text("not source")
    return root


def _run(env: Env, source: Path) -> tuple[int, list[str]]:
    from raytrain.pipeline_verify import run_verification

    out: list[str] = []
    code = run_verification(
        env.settings, source, base_session=env.step_session, out=out.append, poll_seconds=0
    )
    return code, out


def test_step_uploads_the_checkout_and_builds_exactly_that_version(
    env: Env, enforced: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _script(monkeypatch, env, ["IN_PROGRESS", "IN_PROGRESS", "SUCCEEDED"],
            ["[Container] Running command make setup-cdk", "raytrain verify: all checks passed"])  # fmt: skip
    code, out = _run(env, _checkout(tmp_path))
    assert code == 0, out
    # The build's log, in order, then the verdict.
    assert out[-3:] == [
        "[Container] Running command make setup-cdk",
        "raytrain verify: all checks passed",
        out[-1],
    ]
    assert out[-1].endswith(": SUCCEEDED")
    # The build ran on the uploaded object's version, which holds the checkout without .venv etc.
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 10**9)  # as the admin again
    admin = boto3.client("s3", **ADMIN, endpoint_url=env.endpoint)
    versions = admin.list_object_versions(Bucket=env.names.bucket, Prefix=env.names.SOURCE_KEY)["Versions"]
    latest = next(v for v in versions if v["IsLatest"])
    builds = env.codebuild.batch_get_builds(
        ids=env.codebuild.list_builds_for_project(projectName=env.names.project)["ids"][-1:]
    )["builds"]
    assert builds[0]["sourceVersion"] == latest["VersionId"]
    body = admin.get_object(Bucket=env.names.bucket, Key=env.names.SOURCE_KEY, VersionId=latest["VersionId"])
    names = zipfile.ZipFile(io.BytesIO(body["Body"].read())).namelist()
    assert sorted(names) == ["Makefile", "config/dev.yaml"]


def test_a_failed_build_fails_the_step_with_its_phase(
    env: Env, enforced: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _script(monkeypatch, env, ["IN_PROGRESS", "FAILED"], ["verify: GPU node ip-10-0-1-2 not Ready"])
    code, out = _run(env, _checkout(tmp_path))
    assert code == 1
    assert "verify: GPU node ip-10-0-1-2 not Ready" in out
    assert re.search(r": FAILED: BUILD FAILED \(exit status 1\)$", out[-1]), out[-1]


@pytest.mark.parametrize("status", ["TIMED_OUT", "FAULT", "STOPPED"])
def test_a_build_that_did_not_succeed_fails_the_step(
    env: Env, enforced: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, status: str
) -> None:
    _script(monkeypatch, env, [status], [])
    code, out = _run(env, _checkout(tmp_path))
    assert code == 1 and status in out[-1]


def test_starter_role_may_do_nothing_else(env: Env, enforced: None) -> None:
    """The same evaluator refuses what the starter role must not do: the allows are not vacuous."""
    from raytrain.pipeline_verify import starter_session

    session = starter_session(env.settings, env.step_session)
    s3 = session.client("s3")
    with pytest.raises(s3.exceptions.ClientError, match="AccessDenied"):
        s3.put_object(Bucket=env.names.bucket, Key="source/other.zip", Body=b"x")
    with pytest.raises(s3.exceptions.ClientError, match="AccessDenied"):
        s3.get_object(Bucket=env.names.bucket, Key=env.names.SOURCE_KEY)
    codebuild = session.client("codebuild")
    with pytest.raises(codebuild.exceptions.ClientError, match="AccessDenied"):
        codebuild.start_build(projectName="another-project")
    with pytest.raises(codebuild.exceptions.ClientError, match="AccessDenied"):
        codebuild.list_projects()
    logs = session.client("logs")
    with pytest.raises(logs.exceptions.ClientError, match="AccessDenied"):
        logs.get_log_events(logGroupName="/aws/codebuild/another", logStreamName="x")


def test_put_object_kms_need_is_granted_on_the_bucket_key(env: Env) -> None:
    import botocore.session
    import moto.iam.access_control as ac

    model = botocore.session.get_session().get_service_model("s3")
    text = re.sub(r"<[^>]+>", "", model.operation_model("PutObject").documentation)
    assert "kms:GenerateDataKey" in text
    policy = ac.IAMPolicy(json.dumps(env.policy))
    assert policy.is_action_permitted("kms:GenerateDataKey", env.key_arn) is ac.PermissionResult.PERMITTED
    assert policy.is_action_permitted("kms:Decrypt", env.key_arn) is not ac.PermissionResult.PERMITTED


def test_step_without_the_starter_role_says_what_is_missing(env: Env, enforced: None, tmp_path: Path) -> None:
    from raytrain.pipeline_verify import VerifyError, run_verification

    other = env.settings.model_copy(update={"name": "qa"})  # no such role in this account
    with pytest.raises(
        VerifyError, match=r"cannot assume .*RayTrain-qa-pipeline-verify-starter .*PipelineAccess"
    ):
        run_verification(other, _checkout(tmp_path), base_session=env.step_session, poll_seconds=0)


def test_source_must_be_the_checkout(tmp_path: Path) -> None:
    from raytrain.pipeline_verify import VerifyError, checkout_zip

    with pytest.raises(VerifyError, match="no Makefile"):
        checkout_zip(tmp_path)


def test_starter_credentials_are_assumed_again_before_they_expire(env: Env, enforced: None) -> None:
    """Role chaining caps the session at one hour; a smoke build runs longer."""
    import datetime

    from raytrain.pipeline_verify import ROLE_CHAINING_SECONDS, starter_session

    assert ROLE_CHAINING_SECONDS == 3600
    session = starter_session(env.settings, env.step_session)
    credentials = session._session.get_credentials()
    first = credentials.get_frozen_credentials().access_key
    # As if the hour had nearly passed: botocore refreshes inside its mandatory window.
    credentials._expiry_time = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=1)
    second = credentials.get_frozen_credentials().access_key
    assert second != first
    session.client("codebuild").batch_get_builds(ids=[f"{env.names.project}:none"])  # still allowed


def test_no_credentials_hint_names_only_what_exists(monkeypatch):
    """Without credentials the hint names environment variables and the aws CLI, no flag
    pipeline-verify lacks."""
    import boto3

    from config.loader import load_settings
    from raytrain import cli, pipeline_verify

    for var in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(pipeline_verify.VerifyError) as info:
        pipeline_verify.starter_session(load_settings("dev"), boto3.Session())
    message = str(info.value)
    parser = cli.build_parser()._subparsers._group_actions[0].choices["pipeline-verify"]
    flags = {option for action in parser._actions for option in action.option_strings}
    named = set(re.findall(r"(?<![\w-])--[a-z-]+", message.replace("aws sso login --profile", "")))
    assert named <= flags, named
    assert "no AWS credentials" in message and "AWS_PROFILE" in message

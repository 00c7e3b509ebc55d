"""`raytrain pipeline-verify`: the pipeline's post-deploy step, run from the pipeline's account.

The checks (`raytrain verify`, and the smoke job's wait) need the cluster's API server, which is
reachable from the environment's VPC; the pipeline's step runs outside it, in another account. So
this command, as the environment's starter role (created by its PipelineAccess stack,
stacks/pipeline/access.py; names in config/names.py `VerifyBuild`):

1. zips the checkout (without what `make setup-cdk` and local runs put there) and uploads it to the
   one key of the versioned source bucket (S3 PutObject, SSE-KMS by the bucket's default key);
2. starts a build of the in-VPC project on exactly that object version (StartBuild `sourceVersion`:
   "For Amazon S3: the version ID of the object that represents the build input ZIP file");
3. follows it (BatchGetBuilds), printing the build's CloudWatch log as it grows (GetLogEvents);
4. exits 0 if the build SUCCEEDED, 1 if it FAILED, FAULT, TIMED_OUT or STOPPED, 2 when it cannot
   run the build (credentials, role, bucket or project missing). Interrupted, it stops the build.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from config.loader import env_argument

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2
# What the step's own `make setup-cdk` (and local work) leaves in the checkout: not source.
EXCLUDED_DIRS = frozenset(
    {
        ".git",
        ".venv",
        ".venv-image",
        "node_modules",
        "cdk.out",
        "runs",
        "__pycache__",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        ".lock-venv",
    }
)
DONE = {"SUCCEEDED", "FAILED", "FAULT", "TIMED_OUT", "STOPPED"}
# The longest session a chained AssumeRole may ask for.
ROLE_CHAINING_SECONDS = 3600


class VerifyError(Exception):
    """The build could not be run: one line saying what and why."""


def checkout_zip(source: Path) -> bytes:
    """The checkout as CodeBuild unpacks an S3 source: the files at the zip's root, modes kept
    (the Makefile and scripts run as they are in the repository)."""
    if not (source / "Makefile").is_file():
        raise VerifyError(f"--source {source}: no Makefile there; pass the repository's checkout")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(_files(source)):
            archive.write(path, path.relative_to(source).as_posix())
    return buffer.getvalue()


def _files(root: Path) -> Iterator[Path]:
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS]
        for name in files:
            path = Path(directory) / name
            if path.is_file() and not path.is_symlink():
                yield path


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", type(exc).__name__))


def starter_session(settings: Any, base: Any) -> Any:
    """A boto3 session as the environment's starter role, from the step's own credentials.

    The step's credentials are themselves a role session (CodeBuild's), so this is role chaining,
    which IAM limits to one hour per session (IAM user guide, "Role chaining"), while a smoke build
    runs for hours: the credentials are refreshable, assumed again before they expire."""
    import boto3
    import botocore.exceptions as bce
    import botocore.session
    from botocore.credentials import RefreshableCredentials

    names = settings.verify_build
    sts = base.client("sts", region_name=settings.region)

    def assume() -> dict[str, str]:
        try:
            creds = sts.assume_role(
                RoleArn=names.starter_role_arn,
                RoleSessionName=f"pipeline-verify-{settings.name}",
                DurationSeconds=ROLE_CHAINING_SECONDS,
            )["Credentials"]
        except bce.NoCredentialsError:
            raise VerifyError(
                "no AWS credentials: it runs in the pipeline's verify step; to run it by hand, "
                "export AWS_PROFILE=NAME (after `aws sso login --profile NAME`) or AWS_ACCESS_KEY_ID "
                "and AWS_SECRET_ACCESS_KEY"
            ) from None
        except bce.ClientError as exc:
            raise VerifyError(
                f"cannot assume {names.starter_role_arn} ({_code(exc)}): is the stage's "
                f"{settings.stack_prefix}-PipelineAccess stack deployed, trusting this step's role?"
            ) from None
        return {
            "access_key": creds["AccessKeyId"],
            "secret_key": creds["SecretAccessKey"],
            "token": creds["SessionToken"],
            "expiry_time": creds["Expiration"].isoformat(),
        }

    credentials = RefreshableCredentials.create_from_metadata(
        metadata=assume(), refresh_using=assume, method="sts-assume-role"
    )
    core = botocore.session.get_session()
    # botocore has no public setter for a session's credentials; get_credentials() returns this.
    core._credentials = credentials
    core.set_config_variable("region", settings.region)
    return boto3.Session(botocore_session=core)


def upload(session: Any, settings: Any, body: bytes) -> str:
    """Put the checkout on the project's source key; the object's version ID."""
    import botocore.exceptions as bce

    names = settings.verify_build
    try:
        put = session.client("s3").put_object(Bucket=names.bucket, Key=names.SOURCE_KEY, Body=body)
    except bce.ClientError as exc:
        raise VerifyError(
            f"cannot upload the checkout to s3://{names.bucket}/{names.SOURCE_KEY} ({_code(exc)})"
        ) from None
    version = put.get("VersionId")
    if not version or version == "null":
        raise VerifyError(f"s3://{names.bucket} is not versioned: the build could not name this upload")
    return str(version)


def start(session: Any, settings: Any, version: str) -> str:
    import botocore.exceptions as bce

    names = settings.verify_build
    try:
        build = session.client("codebuild").start_build(projectName=names.project, sourceVersion=version)
    except bce.ClientError as exc:
        raise VerifyError(f"cannot start a build of {names.project} ({_code(exc)}: {exc})") from None
    return str(build["build"]["id"])


class LogFollower:
    """Prints a build's CloudWatch log events once, in order, as they arrive."""

    def __init__(self, logs: Any, out: Callable[[str], None]) -> None:
        self.logs, self.out = logs, out
        self.token: str | None = None

    def poll(self, build: dict[str, Any]) -> None:
        info = build.get("logs") or {}
        group, stream = info.get("groupName"), info.get("streamName")
        if not group or not stream:
            return  # the build has not started writing yet
        while True:
            kwargs: dict[str, Any] = {"logGroupName": group, "logStreamName": stream, "startFromHead": True}
            if self.token:
                kwargs["nextToken"] = self.token
            try:
                page = self.logs.get_log_events(**kwargs)
            except self.logs.exceptions.ResourceNotFoundException:
                return  # the stream appears once the build's container starts
            for event in page.get("events", []):
                self.out(str(event["message"]).rstrip("\n"))
            token = page.get("nextForwardToken")
            if not token or token == self.token:
                return
            self.token = token


def follow(
    session: Any,
    build_id: str,
    *,
    out: Callable[[str], None] = print,
    poll_seconds: float = 10.0,
) -> dict[str, Any]:
    """Follow the build until it is done; the last BatchGetBuilds answer."""
    codebuild = session.client("codebuild")
    follower = LogFollower(session.client("logs"), out)
    while True:
        (build,) = codebuild.batch_get_builds(ids=[build_id])["builds"]
        follower.poll(build)
        if build.get("buildStatus") in DONE:
            follower.poll(build)  # what was written after the last poll
            return dict(build)
        time.sleep(poll_seconds)


def verdict(build: dict[str, Any]) -> tuple[int, str]:
    status = build.get("buildStatus")
    if status == "SUCCEEDED":
        return EXIT_OK, f"build {build['id']}: SUCCEEDED"
    failed = [
        f"{p['phaseType']} {p.get('phaseStatus')}"
        + "".join(f" ({c.get('message')})" for c in p.get("contexts") or [] if c.get("message"))
        for p in build.get("phases") or []
        if p.get("phaseStatus") not in (None, "SUCCEEDED")
    ]
    detail = "; ".join(failed) or "no failed phase reported"
    return EXIT_FAILED, f"build {build['id']}: {status}: {detail}"


def run_verification(
    settings: Any,
    source: Path,
    *,
    base_session: Any = None,
    out: Callable[[str], None] = print,
    poll_seconds: float = 10.0,
) -> int:
    import boto3

    session = starter_session(settings, base_session or boto3.Session())
    body = checkout_zip(source)
    names = settings.verify_build
    version = upload(session, settings, body)
    size = len(body) / 2**20
    where = f"s3://{names.bucket}/{names.SOURCE_KEY}"
    out(f"uploaded the checkout ({size:.1f} MiB) to {where} (version {version})")
    build_id = start(session, settings, version)
    out(f"started {build_id} in the VPC of {settings.cluster.name}")

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        build = follow(session, build_id, out=out, poll_seconds=poll_seconds)
    except KeyboardInterrupt:
        session.client("codebuild").stop_build(id=build_id)
        out(f"stopped {build_id}")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    code, message = verdict(build)
    out(message)
    return code


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "pipeline-verify",
        help="the pipeline's post-deploy step: run the environment's verification inside its VPC",
        description=(__doc__ or "").split("\n\n", 1)[0],
    )
    env_argument(parser)
    parser.add_argument(
        "--source", type=Path, default=Path("."), help="the repository's checkout (default .)"
    )
    parser.add_argument("--poll-seconds", type=float, default=10.0, help=argparse.SUPPRESS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from config.loader import SettingsError, load_settings

    try:
        settings = load_settings(args.env)
        return run_verification(settings, args.source.resolve(), poll_seconds=args.poll_seconds)
    except (SettingsError, VerifyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE

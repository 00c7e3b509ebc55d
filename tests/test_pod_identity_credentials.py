"""pyarrow's S3 client (AWS SDK for C++) takes EKS Pod Identity credentials by itself.

EKS Pod Identity injects AWS_CONTAINER_CREDENTIALS_FULL_URI (http://169.254.170.23/v1/credentials)
and AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE into the pod; an SDK's default chain must call that URI
with the file's token as Authorization header (EKS user guide, "How EKS Pod Identity works"; the
minimum AWS SDK for C++ is 1.11.263, "Use pod identity with the AWS SDK"). apache/arrow#45603 and
ray-project/ray#50823 report that pyarrow 19 could not: it bundled AWS SDK for C++ 1.10.55, from
before the SDK's GeneralHTTPCredentialsProvider (aws/aws-sdk-cpp#2778) read the token file. Arrow
21 moved to SDK 1.11.587 (apache/arrow#45306).

This test establishes it for the pyarrow at hand rather than from release notes: a stand-in for the
Pod Identity agent on the loopback address (which the SDK allows over plain HTTP, like
169.254.170.23) hands out temporary credentials of a role in moto; a fresh process with only the two
Pod Identity variables set creates `pyarrow.fs.S3FileSystem()` with no credentials and reads and
writes through moto with IAM enforcement on. The agent checks the token, and when it rotates the
credentials (they expire) the same filesystem object keeps working: Ray Train keeps one for the run.

The image's pyarrow (24 in the DLC) may differ from this environment's: run the same test with it
by pointing RAYTRAIN_PYARROW_PYTHON at an interpreter that has that pyarrow (only pyarrow needed).
Both pass: pyarrow 26.0.1 (this lock) and 24.0.0 (the image's), so Ray Train's default storage
filesystem needs no credentials of ours.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

REGION = "us-west-2"
TOKEN = "eks-pod-identity-token-for-test"
LIFETIME_S = 8

CLIENT = r"""
import json, sys, time
import pyarrow, pyarrow.fs as pafs
endpoint, bucket, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", region="us-west-2")
for i in range(rounds):
    fs.create_dir(f"{bucket}/checkpoints/run", recursive=True)
    with fs.open_output_stream(f"{bucket}/checkpoints/run/file{i}") as out:
        out.write(b"x" * 10)
    assert fs.open_input_file(f"{bucket}/checkpoints/run/file{i}").read() == b"x" * 10
    if i + 1 < rounds:
        time.sleep(float(sys.argv[4]))
print(json.dumps({"pyarrow": pyarrow.__version__, "rounds": rounds}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Agent:
    """Stand-in for the EKS Pod Identity agent: role credentials for a request with the token."""

    def __init__(self, endpoint: str, lifetime_s: int, name: str) -> None:
        # moto keeps its state per process, across servers: names unique to this test.
        self.endpoint, self.lifetime_s, self.bucket = endpoint, lifetime_s, f"ray-train-{name}"
        self.served: list[str] = []
        self.refused = 0
        self.lock = threading.Lock()
        admin = {
            "region_name": REGION,
            "endpoint_url": endpoint,
            "aws_access_key_id": "AKIAADMIN0000000000",
            "aws_secret_access_key": "x",
        }
        s3 = boto3.client("s3", **admin)
        s3.create_bucket(Bucket=self.bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
        iam = boto3.client("iam", **admin)
        account = boto3.client("sts", **admin).get_caller_identity()["Account"]
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"AWS": f"arn:aws:iam::{account}:root"},
                    "Action": "sts:AssumeRole",
                }
            ],
        }
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{self.bucket}"},
                {
                    "Effect": "Allow",
                    "Action": ["s3:GetObject", "s3:PutObject"],
                    "Resource": f"arn:aws:s3:::{self.bucket}/checkpoints/*",
                },
            ],
        }
        self.role_arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"][
            "Arn"
        ]
        iam.put_role_policy(RoleName=name, PolicyName="p", PolicyDocument=json.dumps(policy))
        # Issued now, while moto accepts unsigned set-up calls; handed out one per agent request.
        sts = boto3.client("sts", **admin)
        self.pool = [
            sts.assume_role(RoleArn=self.role_arn, RoleSessionName=f"pod{i}")["Credentials"] for i in range(8)
        ]

    def credentials(self) -> dict[str, str]:
        with self.lock:
            c = self.pool[len(self.served) % len(self.pool)]
        expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=self.lifetime_s)
        with self.lock:
            self.served.append(c["AccessKeyId"])
        # The agent's response, as the container credentials provider reads it.
        return {
            "AccessKeyId": c["AccessKeyId"],
            "SecretAccessKey": c["SecretAccessKey"],
            "Token": c["SessionToken"],
            "Expiration": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }


@pytest.fixture
def agent_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Agent, dict[str, str]]]:
    import moto.settings
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.s3 import responses as s3_responses

    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    # Short-lived credentials, so a refresh shows within the test (the SDK fetches again when they
    # are about to expire).
    agent = Agent(endpoint, lifetime_s=LIFETIME_S, name=f"podid-{uuid.uuid4().hex[:8]}")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/v1/credentials" or self.headers.get("Authorization") != TOKEN:
                agent.refused += 1
                self.send_response(403)
                self.end_headers()
                return
            body = json.dumps(agent.credentials()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    token_file = tmp_path / "eks-pod-identity-token"
    token_file.write_text(TOKEN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONTAINER_CREDENTIALS_FULL_URI=f"http://127.0.0.1:{http.server_address[1]}/v1/credentials",
        AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=str(token_file),
        # Nothing else in the chain may answer: no profile files, no instance metadata.
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        HOME=str(tmp_path),
    )
    env["ENDPOINT"], env["BUCKET"] = endpoint, agent.bucket
    # IAM enforcement from here on, with HeadBucket authorised by s3:ListBucket as on AWS.
    head = dict(s3_responses.ACTION_MAP["BUCKET"]["HEAD"], DEFAULT="ListBucket")
    monkeypatch.setitem(s3_responses.ACTION_MAP["BUCKET"], "HEAD", head)
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    monkeypatch.setattr(ActionAuthenticatorMixin, "request_count", 0)
    try:
        yield agent, env
    finally:
        http.shutdown()
        server.stop()


def _run_client(env: dict[str, str], rounds: int, pause_s: float) -> dict[str, Any]:
    python = os.environ.get("RAYTRAIN_PYARROW_PYTHON", sys.executable)
    proc = subprocess.run(
        [python, "-c", CLIENT, env["ENDPOINT"], env["BUCKET"], str(rounds), str(pause_s)],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_pyarrow_s3_takes_pod_identity_credentials_and_refreshes_them(agent_env: Any) -> None:
    agent, env = agent_env
    _run_client(env, rounds=1, pause_s=0)
    assert agent.refused == 0 and agent.served, "the filesystem never asked the Pod Identity agent"
    once = len(agent.served)
    # A second process uses one filesystem object across the credentials' expiry: it asks again.
    result = _run_client(env, rounds=2, pause_s=LIFETIME_S - 2)
    assert len(agent.served) - once > once, (result, agent.served)


def test_without_the_token_the_agent_refuses_and_pyarrow_is_denied(agent_env: Any, tmp_path: Path) -> None:
    """The check above is not vacuous: a wrong token gets no credentials, and S3 access fails."""
    agent, env = agent_env
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token")
    env = dict(env, AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=str(wrong))
    python = os.environ.get("RAYTRAIN_PYARROW_PYTHON", sys.executable)
    proc = subprocess.run(
        [python, "-c", CLIENT, env["ENDPOINT"], env["BUCKET"], "1", "0"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert agent.refused >= 1 and not agent.served

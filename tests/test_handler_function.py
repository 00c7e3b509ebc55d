"""The shared pieces of our custom resources' Lambda functions: the CloudFormation response
(cdk_constructs/cfn_response.py, sent over real TLS to a local server) and each function's code
asset (cdk_constructs/handler_function.py: its handler and the shared module, nothing else, and a
hash that follows the shared module)."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import aws_cdk as cdk
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cdk_constructs import cfn_response, handler_function, image_cache_warmer, job_drain, vpc_cleanup

EVENT = {
    "RequestType": "Delete",
    "StackId": "arn:aws:cloudformation:us-west-2:111122223333:stack/RayTrain-dev-Network/1",
    "RequestId": "r-1",
    "LogicalResourceId": "EksLeftoverCleanup",
    "ResourceType": "Custom::EksVpcCleanup",
    "ResourceProperties": {},
}

# --- the response, PUT to a local HTTPS server as to S3's presigned URL -----------------------


class _Recorder(BaseHTTPRequestHandler):
    requests: ClassVar[list[dict[str, Any]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).requests.append(
            {"method": "PUT", "path": self.path, "headers": dict(self.headers.items()), "body": body}
        )
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


LOCALHOST = ipaddress.ip_address("127.0.0.1")


def _certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, which the test makes the only trusted one."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@pytest.fixture
def response_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    cert, key = _certificate(tmp_path)
    # urllib's default context loads the trusted certificates from SSL_CERT_FILE (OpenSSL's default
    # verify paths), so send_response runs unchanged and verifies this server's certificate.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    _Recorder.requests = []
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}/response?X-Amz-Signature=abc"
    server.shutdown()
    server.server_close()


def test_the_response_is_put_as_cloudformation_expects(response_url: str) -> None:
    cfn_response.send_response({**EVENT, "ResponseURL": response_url}, "FAILED", "why", "eks-vpc-cleanup-x")
    (request,) = _Recorder.requests
    assert request["path"] == "/response?X-Amz-Signature=abc"
    # Empty, as the presigned URL was signed without one (urllib would otherwise send its form type).
    assert request["headers"]["Content-Type"] == ""
    assert json.loads(request["body"]) == {
        "Status": "FAILED",
        "Reason": "why",
        "PhysicalResourceId": "eks-vpc-cleanup-x",
        "StackId": EVENT["StackId"],
        "RequestId": "r-1",
        "LogicalResourceId": "EksLeftoverCleanup",
    }


def test_a_response_url_that_is_not_https_is_refused() -> None:
    with pytest.raises(ValueError, match="must be https"):
        cfn_response.send_response({**EVENT, "ResponseURL": "http://example.com/r"}, "SUCCESS", "", "p")


def test_answer_reports_an_exception_as_failed_within_the_reason_limit() -> None:
    sent: list[tuple[str, str, str]] = []

    def act() -> tuple[str, str]:
        raise RuntimeError("x" * 5000)

    cfn_response.answer(
        {**EVENT, "PhysicalResourceId": "kept"},
        "default",
        act,
        what="test",
        send=lambda e, status, reason, pid: sent.append((status, reason, pid)),
    )
    ((status, reason, physical_id),) = sent
    assert (status, physical_id) == ("FAILED", "kept")
    assert reason.startswith("RuntimeError: xxx") and len(reason) == cfn_response.REASON_LIMIT

    sent.clear()
    cfn_response.answer(
        EVENT, "default", lambda: ("SUCCESS", "done"), what="test", send=lambda *a: sent.append(a[1:])
    )
    assert sent == [("SUCCESS", "done", "default")]  # a create's physical ID is the default one


# --- the functions' assets, as synthesized ----------------------------------------------------

# Each custom resource, the environment/stack that has it, and its handler's folder.
CUSTOM_RESOURCES = [
    (vpc_cleanup.RESOURCE_TYPE, "dev", "Network", vpc_cleanup.HANDLER_DIR),
    (job_drain.RESOURCE_TYPE, "dev", "Workload", job_drain.HANDLER_DIR),
    (image_cache_warmer.RESOURCE_TYPE, "p5", "Cluster", image_cache_warmer.HANDLER_DIR),
]
SHARED = Path(cfn_response.__file__)


def _asset_of(synthesized: Any, resource_type: str, env: str, stack: str) -> Path:
    """The asset folder of the function behind the stack's custom resource of this type."""
    result = synthesized[env]
    template = result.template(stack)
    # dev's Workload stack drains each team's namespace: one resource per team, one function.
    resource = next(r for r in template["Resources"].values() if r["Type"] == resource_type)
    function_id = resource["Properties"]["ServiceToken"]["Fn::GetAtt"][0]
    key = template["Resources"][function_id]["Properties"]["Code"]["S3Key"]
    name = f"{result.settings.stack_prefix}-{stack}.assets.json"
    files = json.loads((result.directory / name).read_text())["files"]
    return result.directory / files[key.removesuffix(".zip")]["source"]["path"]


def _files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("resource_type", "env", "stack", "handler_dir"), CUSTOM_RESOURCES)
def test_each_asset_holds_its_handler_and_the_shared_module_only(
    synthesized: Any, resource_type: str, env: str, stack: str, handler_dir: Path
) -> None:
    asset = _asset_of(synthesized, resource_type, env, stack)
    assert _files(asset) == {
        "__init__.py": (handler_dir / "__init__.py").read_bytes(),
        "handler.py": (handler_dir / "handler.py").read_bytes(),
        "cdk_constructs/cfn_response.py": SHARED.read_bytes(),
    }
    # As Lambda imports it: the asset alone on the path (no repository), `handler.on_event`.
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); import handler; "
        "from cdk_constructs import cfn_response; "
        "print(handler.on_event.__module__, handler.cfn_response is cfn_response, cfn_response.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", probe, str(asset)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["handler", "True", str(asset / "cdk_constructs" / "cfn_response.py")]


def test_the_asset_hash_follows_the_shared_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "cfn_response.py"
    module = SimpleNamespace(__name__="cdk_constructs.cfn_response", __file__=str(shared))
    monkeypatch.setattr(handler_function, "SHARED_MODULES", (module,))

    apps: list[cdk.App] = []

    def asset_hash(shared_text: str) -> str:
        shared.write_text(shared_text)
        # CDK caches bundling per source folder and options within a process.
        cdk.AssetStaging.clear_asset_hash_cache()
        app = cdk.App(outdir=str(tmp_path / f"out-{len(apps)}"))
        apps.append(app)
        stack = cdk.Stack(app, "S")
        handler_function.handler_function(
            stack,
            job_drain.HANDLER_DIR,
            role=handler_function.handler_role(stack, "test"),
            function_name="f",
            description="test",
            timeout=cdk.Duration.minutes(1),
            memory_size=128,
            checkov_reasons={},
        )
        template = app.synth().get_stack_by_name("S").template
        (function,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
        return str(function["Properties"]["Code"]["S3Key"])

    first = asset_hash("A = 1\n")
    assert asset_hash("A = 2\n") != first  # same handler folder, another shared module
    assert asset_hash("A = 1\n") == first  # and reproducible


def test_destroy_docs_name_every_named_functions_log_group(synthesized) -> None:
    """Lambda makes /aws/lambda/<name> on a function's first run and CloudFormation never deletes
    it: docs/deploy.md's list of what remains after destroy names each of our functions' groups."""
    import re

    from tests.conftest import ROOT

    docs = (ROOT / "docs" / "deploy.md").read_text()
    names = set()
    for env in ("dev", "p5"):
        cluster = synthesized[env].settings.cluster.name
        for template in synthesized[env].templates().values():
            for resource in template["Resources"].values():
                name = resource.get("Properties", {}).get("FunctionName")
                if resource["Type"] == "AWS::Lambda::Function" and isinstance(name, str):
                    names.add(name.replace(cluster, "<cluster>"))
    assert {"<cluster>-vpc-cleanup", "<cluster>-job-drain", "<cluster>-image-cache-warm"} <= names
    listed = set(re.findall(r"`/aws/lambda/([^`]+)`", docs))
    assert names <= listed, names - listed

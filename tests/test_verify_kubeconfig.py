"""`raytrain verify` with an EKS-style kubeconfig (exec credential plugin) and no usable credentials,
or a closed endpoint: one clear line, none of the client's own log output (ERROR:root, urllib3)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once closed


def kubeconfig(tmp_path: Path, script: str) -> Path:
    """A kubeconfig shaped like `aws eks update-kubeconfig`'s, its exec plugin replaced by `script`."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "c",
                "cluster": {"server": f"https://127.0.0.1:{closed_port()}", "insecure-skip-tls-verify": True},
            }
        ],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
        "users": [
            {
                "name": "u",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": "sh",
                        "args": ["-c", script],
                    }
                },
            }
        ],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    return path


def verify(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raytrain", "verify", "--env", "dev", "--kubeconfig", str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_failed_credential_command_is_one_line_naming_it(tmp_path):
    # What `aws eks get-token` prints and returns without credentials.
    script = "echo 'Unable to locate credentials. You can configure credentials.' >&2; exit 255"
    result = verify(kubeconfig(tmp_path, script))
    assert result.returncode == 2
    output = (result.stdout + result.stderr).strip()
    assert output.count("\n") == 0, output
    assert (
        "its credential command failed (exec: process returned 255. Unable to locate credentials." in output
    )
    assert "account 111122223333" in output and "AWS_PROFILE" in output
    assert "ERROR:root" not in output


def test_closed_endpoint_is_one_line_without_urllib3_retry_warnings(tmp_path):
    token = {"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
             "status": {"token": "t"}}  # fmt: skip
    result = verify(kubeconfig(tmp_path, f"echo '{json.dumps(token)}'"))
    assert result.returncode == 2
    output = (result.stdout + result.stderr).strip()
    assert output.count("\n") == 0, output
    assert "cannot reach the Kubernetes API at https://127.0.0.1:" in output
    assert "urllib3" not in output.split("(")[0] and "WARNING" not in output

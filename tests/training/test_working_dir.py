"""Ray's own download of the training-code asset from S3, as a pod does it before the job starts.

The RayJob's runtime_env is `working_dir: s3://<asset bucket>/<hash>.zip`. Ray fetches it in its
runtime-env agent with boto3 and smart_open (ray/_private/runtime_env/protocol.py,
`_handle_s3_protocol`), unzips it and strips the single top-level folder
(packaging.py, `download_and_unpack_package`). Here that same function runs against moto's S3
server, on the code asset staged as synthesis stages it (stacks/code_asset.py) and zipped the way
CDK zips a folder asset (its contents, relative paths). In the image stage (`make test-image`) this
is the image's Ray, boto3 and smart_open (config/image.toml).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-west-2"
BUCKET = f"cdk-hnb659fds-assets-{uuid.uuid4().hex[:8]}"  # moto keeps buckets per process


def _zip_folder(folder: Path, target: Path) -> None:
    """A zip of the folder's contents, entries relative to it (as CDK's directory assets)."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            archive.write(path, path.relative_to(folder).as_posix())


def test_ray_downloads_and_unpacks_the_code_asset_from_s3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray")
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("smart_open")
    pytest.importorskip("moto")
    from ray._private.runtime_env.packaging import download_and_unpack_package

    from stacks.code_asset import stage
    from tests.moto_server import running_moto_server

    staged = tmp_path / "stage"
    stage(staged / "job")
    archive = tmp_path / "asset.zip"
    _zip_folder(staged, archive)
    key = hashlib.sha256(archive.read_bytes()).hexdigest() + ".zip"

    with running_moto_server() as endpoint:
        # What the pod has: Pod Identity credentials (any, for moto) and the region; the endpoint
        # variable only points boto3 at moto (botocore's service-specific endpoint setting).
        for name, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL_S3": endpoint,
        }.items():
            monkeypatch.setenv(name, value)
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        s3.upload_file(str(archive), BUCKET, key)
        local = Path(
            asyncio.run(download_and_unpack_package(f"s3://{BUCKET}/{key}", str(tmp_path / "ray-runtime")))
        )

    assert (local / "training" / "__init__.py").is_file(), sorted(p.name for p in local.iterdir())
    assert (local / "training" / "__main__.py").is_file()
    assert {p.name for p in local.iterdir()} == {"training", "_vendor"}
    # A worker process in that working_dir imports the job's packages from the asset itself.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import training, liger_kernel, torchao; "
            "print(training.__file__); print(liger_kernel.__file__); print(torchao.__file__)",
        ],
        cwd=local,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    files = [Path(line) for line in probe.stdout.split()]
    assert files[0].is_relative_to(local / "training")
    assert all(f.is_relative_to(local / "_vendor") for f in files[1:]), files

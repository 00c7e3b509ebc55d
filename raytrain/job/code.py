"""The training code of a submitted job: the code asset zip, built as synthesis builds it, uploaded
once per content to the checkpoint bucket under code/<sha256>.zip.

Why there and not CDK's asset bucket: the Ray pods' role already uses that bucket and its key, and
a fixed prefix lets the stack grant read on submitted code and nothing else (the asset bucket is
the account's bootstrap bucket: granting `*.zip` there would let the pods read every stack's
assets, and submitters would need the deploy role's write on it). Content-addressed: the same code
gives the same key, so a rerun uploads nothing and an object, once written, never changes.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from config.locations import code_key
from raytrain.job.common import JobError
from stacks import code_asset

# Fixed metadata, so equal content gives equal bytes (and so an equal key).
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
# Inside the zip, as in the synthesized asset (stacks/workload_stack.py stage_training_code): one
# top-level folder, which Ray strips when it unpacks a remote working_dir.
TOP_DIR = "job"


@dataclass(frozen=True)
class CodeZip:
    path: Path
    sha256: str
    size: int

    @property
    def key(self) -> str:
        return code_key(self.sha256)


def build(out_dir: Path) -> CodeZip:
    """Stage `training/` and the job's wheels with the synthesis' own function, and zip them."""
    stage = Path(tempfile.mkdtemp(prefix="raytrain-submit-"))
    try:
        try:
            code_asset.stage(stage / TOP_DIR)
        except code_asset.CodeAssetError as exc:
            raise JobError(f"training code: {exc}") from None
        out = out_dir / "code.zip"
        write_zip(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    data = out.read_bytes()
    return CodeZip(out, hashlib.sha256(data).hexdigest(), len(data))


def write_zip(root: Path, out: Path) -> None:
    """Every file under `root`, by sorted relative path, with fixed times and the file's mode."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in files:
            info = zipfile.ZipInfo(path.relative_to(root).as_posix(), date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.external_attr = (0o100000 | mode) << 16
            archive.writestr(info, path.read_bytes())


def upload(code: CodeZip, *, bucket: str, region: str, policy_name: str) -> bool:
    """Put the zip at its key unless it is there; True when this call wrote it.

    HeadObject first (authorised by s3:GetObject; a missing key answers 404, or 403 to a caller
    without s3:ListBucket: S3 API reference, HeadObject). Then a conditional PutObject
    (If-None-Match: *, S3 conditional writes): a zip another submit wrote meanwhile is kept, never
    overwritten (412 Precondition Failed). ChecksumSHA256 makes S3 verify the bytes it stores
    against the digest the key names (S3 User Guide, checking object integrity)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = boto3.client("s3", region_name=region)
    where = f"s3://{bucket}/{code.key}"
    hint = (
        f"your AWS principal needs the {policy_name} policy (s3:PutObject and s3:GetObject on "
        f"s3://{bucket}/code/*, and the bucket's KMS key); docs/jobs.md"
    )
    try:
        s3.head_object(Bucket=bucket, Key=code.key)
        return False
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status not in (403, 404):
            raise JobError(f"checking {where}: {exc}") from None
    except BotoCoreError as exc:
        raise JobError(f"checking {where}: {exc}; are AWS credentials set for {region}?") from None
    digest = base64.b64encode(bytes.fromhex(code.sha256)).decode()
    try:
        with code.path.open("rb") as body:
            s3.put_object(
                Bucket=bucket,
                Key=code.key,
                Body=body,
                ContentType="application/zip",
                ChecksumSHA256=digest,
                IfNoneMatch="*",
            )
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if error.get("Code") in ("PreconditionFailed", "412"):
            return False
        if error.get("Code") in ("AccessDenied", "403", "Forbidden"):
            raise JobError(f"uploading the training code to {where} was refused: {hint}") from None
        if error.get("Code") == "NoSuchBucket":
            raise JobError(f"{where}: no such bucket: is the Workload stack deployed?") from None
        raise JobError(f"uploading the training code to {where}: {exc}") from None
    except BotoCoreError as exc:
        raise JobError(f"uploading the training code to {where}: {exc}") from None
    return True

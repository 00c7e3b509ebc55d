"""Where the workload's S3 objects live: names the Workload stack creates and grants, the RayJob
reads, and `raytrain job submit` writes to, written once.

The checkpoint bucket is named (not generated) so that every side knows it from the settings
alone, before and after a deploy.
"""

from __future__ import annotations

from dataclasses import dataclass

from config.settings import Settings

# Read/write for the Ray pods: Ray Train's storage path, prepared data, summaries.
CHECKPOINT_PREFIX = "checkpoints"
# Training code that `raytrain job submit` uploads, one zip per content: code/<sha256>.zip. The
# Ray pods may only read it; submitters may add to it (the stack's JobSubmitter policy).
CODE_PREFIX = "code"


def checkpoint_bucket_name(settings: Settings) -> str:
    return f"{settings.cluster.name}-ckpt-{settings.account}-{settings.region}".lower()


def checkpoint_prefix(settings: Settings) -> str:
    """The checkpoint prefix of the settings' team (Settings.active_team): `checkpoints` for the
    implicit team, as before teams; `checkpoints-<team>` for a named one, which only that team's
    Ray pods may read and write (stacks/workload_stack.py). One level, not checkpoints/<team>:
    pyarrow's create_dir (Ray Train's storage path) writes a directory marker for every missing
    parent, and a marker `checkpoints/` would be outside a grant on `checkpoints/<team>/*`
    (tests/test_workload_iam.py, through moto's IAM evaluator)."""
    team = settings.active_team
    return CHECKPOINT_PREFIX if team.implicit else f"{CHECKPOINT_PREFIX}-{team.name}"


def checkpoint_uri(settings: Settings) -> str:
    return f"s3://{checkpoint_bucket_name(settings)}/{checkpoint_prefix(settings)}"


def code_key(sha256: str) -> str:
    """The object key of a submitted code zip, addressed by the sha256 of its bytes."""
    return f"{CODE_PREFIX}/{sha256}.zip"


@dataclass(frozen=True)
class S3Input:
    """An s3:// location the job only reads: `job.data` or `job.model` outside the checkpoint prefix."""

    setting: str
    bucket: str
    prefix: str  # without a trailing "/"; "" for the whole bucket

    def object_arns(self, partition: str) -> list[str]:
        base = f"arn:{partition}:s3:::{self.bucket}"
        if not self.prefix:
            return [f"{base}/*"]
        # The key itself too: pyarrow's GetFileInfo on a folder first HEADs the key without "/".
        return [f"{base}/{self.prefix}", f"{base}/{self.prefix}/*"]


def s3_inputs(settings: Settings) -> list[S3Input]:
    """The job's read-only S3 inputs, from settings (the same values the RayJob passes as
    --data, --eval-data and --model)."""
    found = []
    for field in ("data", "eval_data", "model"):
        value = getattr(settings.job, field)
        if value and value.startswith("s3://"):
            bucket, _, prefix = value.removeprefix("s3://").partition("/")
            found.append(S3Input(f"job.{field}", bucket, prefix.strip("/")))
    return found

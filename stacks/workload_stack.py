"""Workload: checkpoint bucket, training code asset, Pod Identity for Ray pods, and the cdk8s chart
(RayCluster/RayJob/NetworkPolicies) applied to the cluster."""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import cdk8s
from aws_cdk import aws_eks as eks_l1
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from cdk_constructs.buckets import kms_bucket_with_access_logs
from config.names import SERVICE_ACCOUNT
from config.settings import Settings
from k8s.chart import build_workload_chart
from stacks import code_asset
from stacks.common import partition, removal_policy

TRAINING_DIR = Path(__file__).resolve().parents[1] / "training"
CHECKPOINT_PREFIX = "checkpoints"


@dataclass(frozen=True)
class ReviewValues:
    """Literal values for rendering the manifests for review (the stack itself uses tokens)."""

    code_uri: str
    code_hash: str
    checkpoint_uri: str


def stage_training_code() -> Path:
    """A folder whose zip unpacks, by Ray's rules, into a working_dir holding `training/`.

    Ray unpacks a remote working_dir zip and strips the top-level folder when it is the only entry.
    CDK zips a folder's contents, so the layout is <stage>/job/training/...: the zip's single
    top-level `job/` is stripped and `python -m training` finds its package. Beside it, `_vendor/`
    holds the job's hash-checked wheels, unpacked (stacks/code_asset.py). The staged copy is
    removed when the process exits (CDK has copied it into the assembly by then).
    """
    stage = Path(tempfile.mkdtemp(prefix="raytrain-code-"))
    atexit.register(shutil.rmtree, stage, True)
    code_asset.stage(stage / "job")
    return stage


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


def s3_via_service(key_arn: str) -> str:
    """The kms:ViaService value of S3 in a KMS key's region: S3's endpoint name there
    (s3.REGION.amazonaws.com; .amazonaws.com.cn in the China partition)."""
    _, arn_partition, _, region, *_ = key_arn.split(":")
    return f"s3.{region}.amazonaws.com" + (".cn" if arn_partition == "aws-cn" else "")


def checkpoint_bucket_name(settings: Settings) -> str:
    # Named, so the job's storage path is known before deploy and shows in the reviewed manifests.
    return f"{settings.cluster.name}-ckpt-{settings.account}-{settings.region}".lower()


class WorkloadStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        cluster: eks.ICluster,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        storage = kms_bucket_with_access_logs(
            self,
            ids=("CheckpointKey", "AccessLogs", "Checkpoints"),
            key_description=f"Checkpoints of {settings.cluster.name}",
            log_prefix="checkpoints/",
            # dev: emptied (all versions) and removed on destroy; prod: retained.
            removal_policy=removal_policy(settings),
            bucket_name=checkpoint_bucket_name(settings),
            versioned=True,
            lifecycle_rules=[
                # Old versions of overwritten checkpoint files are only a safety net.
                s3.LifecycleRule(noncurrent_version_expiration=cdk.Duration.days(30)),
                s3.LifecycleRule(abort_incomplete_multipart_upload_after=cdk.Duration.days(7)),
            ],
        )
        self.key, self.access_logs, self.bucket = storage.key, storage.access_logs, storage.bucket

        # The training package travels as a zip asset and becomes the job's Ray working_dir.
        self.code = s3_assets.Asset(self, "TrainingCode", path=str(stage_training_code()))

        # EKS Pod Identity: the Ray service account gets this role, and nothing else does.
        self.role = iam.Role(
            self,
            "RayPodRole",
            assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com"),
            description=f"Ray pods of {settings.cluster.name}: read code, read/write checkpoints",
        )
        assert self.role.assume_role_policy is not None
        self.role.assume_role_policy.add_statements(
            iam.PolicyStatement(
                actions=["sts:TagSession"],
                principals=[iam.ServicePrincipal("pods.eks.amazonaws.com")],
            )
        )
        # Exact actions rather than grant_read_write's wildcards: this role is reachable from pods.
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[self.code.bucket.arn_for_objects(self.code.s3_object_key)],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                resources=[self.bucket.arn_for_objects(f"{CHECKPOINT_PREFIX}/*")],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(actions=["kms:Decrypt", "kms:GenerateDataKey"], resources=[self.key.key_arn])
        )
        # No s3:prefix condition: pyarrow's S3 filesystem (Ray Train's storage, training/summary.py)
        # sends HeadBucket when it creates a directory, and S3 authorises HeadBucket with
        # s3:ListBucket (S3 API reference, HeadBucket "Permissions"); that request carries no prefix,
        # so a prefix-conditioned grant denies it. The bucket holds only this job's checkpoints.
        self.role.add_to_policy(
            iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn])
        )
        # job.data / job.model in S3: read only. GetObject on the prefix (and the key itself), and
        # s3:ListBucket on the bucket without a prefix condition: pyarrow's GetFileInfo on a folder
        # HEADs the key first and lists only after a 404, and S3 answers a missing key with 404
        # only to callers that have s3:ListBucket on the bucket, 403 otherwise (S3 API reference,
        # HeadObject/GetObject "Permissions"); that request carries no s3:prefix, so a
        # prefix-conditioned grant would not count. The role can list the bucket's key names,
        # read nothing outside the prefix, and write nothing there (tests/test_workload_iam.py).
        # A bucket encrypted with a customer-managed KMS key: job.input_kms_keys (below).
        self.inputs = s3_inputs(settings)
        arn_partition = partition(settings.region)
        for location in self.inputs:
            self.role.add_to_policy(
                iam.PolicyStatement(actions=["s3:GetObject"], resources=location.object_arns(arn_partition))
            )
        for bucket in sorted({location.bucket for location in self.inputs}):
            self.role.add_to_policy(
                iam.PolicyStatement(
                    actions=["s3:ListBucket"],
                    resources=[f"arn:{arn_partition}:s3:::{bucket}"],
                )
            )
        # SSE-KMS inputs: S3 calls kms:Decrypt as this role when it serves an object from a
        # general purpose bucket (S3 User Guide, SSE-KMS). kms:ViaService (AWS KMS condition keys) limits the
        # grant to those calls, from S3 in the key's region; the role cannot decrypt with the key
        # directly. The key policy must let the role use the key too (settings comment).
        for arn in settings.job.input_kms_keys:
            self.role.add_to_policy(
                iam.PolicyStatement(
                    actions=["kms:Decrypt"],
                    resources=[arn],
                    conditions={"StringEquals": {"kms:ViaService": s3_via_service(arn)}},
                )
            )
        namespace = settings.workload.namespace
        self.association = eks_l1.CfnPodIdentityAssociation(
            self,
            "RayPodIdentity",
            cluster_name=cluster.cluster_name,
            namespace=namespace,
            service_account=SERVICE_ACCOUNT,
            role_arn=self.role.role_arn,
        )

        code_uri = f"s3://{self.code.s3_bucket_name}/{self.code.s3_object_key}"
        checkpoint_uri = f"s3://{self.bucket.bucket_name}/{CHECKPOINT_PREFIX}"
        chart = build_workload_chart(
            cdk8s.App(),
            settings,
            code_uri=code_uri,
            code_hash=self.code.asset_hash,
            checkpoint_uri=checkpoint_uri,
            service_account_name=SERVICE_ACCOUNT,
            # The cluster stack creates the namespace before the KubeRay operator (which binds
            # its Role there), so it outlives this stack's objects on destroy.
            include_namespace=False,
        )
        objects = chart.to_json()
        jobs = [o for o in objects if o["kind"] == "RayJob"]
        self.manifest = eks.KubernetesManifest(
            self,
            "RayWorkload",
            cluster=cluster,
            manifest=[o for o in objects if o["kind"] != "RayJob"],
            # Let kubectl apply handle objects that exist (e.g. after a failed rollback).
            overwrite=True,
        )
        # Pods start only once they can get credentials.
        self.manifest.node.add_dependency(self.association)
        # The RayJobs in a resource of their own whose logical ID carries their names (which carry
        # the hash of their spec and code). A change gives a new RayJob name, which the kubectl
        # handler would only `apply` (its --prune does not reach custom resources, and KubeRay
        # ignores spec changes to an existing RayJob); a new logical ID makes CloudFormation
        # create the new resource and, in its cleanup phase, delete the old one, which runs
        # `kubectl delete` on the old RayJob (its cluster goes with it). On destroy this stack goes
        # before the Cluster stack, so the KubeRay operator still runs to clear the RayJob's
        # finalizer and the namespace can terminate.
        digest = hashlib.sha256("\n".join(sorted(o["metadata"]["name"] for o in jobs)).encode()).hexdigest()
        self.job_manifest = eks.KubernetesManifest(
            self,
            f"RayJob{digest[:12]}",
            cluster=cluster,
            manifest=jobs,
            overwrite=True,
        )
        # Its service account and network policies exist first and go last.
        self.job_manifest.node.add_dependency(self.manifest, self.association)

        qualifier = cdk.DefaultStackSynthesizer.DEFAULT_QUALIFIER
        self.review = ReviewValues(
            code_uri=(
                f"s3://cdk-{qualifier}-assets-{settings.account}-{settings.region}/{self.code.asset_hash}.zip"
            ),
            code_hash=self.code.asset_hash,
            checkpoint_uri=f"s3://{checkpoint_bucket_name(settings)}/{CHECKPOINT_PREFIX}",
        )

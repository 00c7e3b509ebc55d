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
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks as eks_l1
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from cdk_constructs.buckets import kms_bucket_with_access_logs
from cdk_constructs.job_drain import SubmittedJobDrain
from config.locations import (
    CHECKPOINT_PREFIX,
    CODE_PREFIX,
    S3Input,
    checkpoint_bucket_name,
    checkpoint_prefix,
    s3_inputs,
)
from config.locations import checkpoint_uri as checkpoint_uri_of
from config.names import (
    JOB_DRAINER_GROUP,
    ORIGIN_LABEL,
    PART_OF,
    PART_OF_LABEL,
    SERVICE_ACCOUNT,
    SUBMITTED,
)
from config.settings import Settings
from config.settings.teams import Team
from k8s.chart import build_workload_chart
from stacks import code_asset
from stacks.cluster_stack import cluster_security_group_export, kubectl_layer
from stacks.common import partition, removal_policy

TRAINING_DIR = Path(__file__).resolve().parents[1] / "training"
__all__ = ["CHECKPOINT_PREFIX", "S3Input", "WorkloadStack", "checkpoint_bucket_name", "s3_inputs"]


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


def s3_via_service(key_arn: str) -> str:
    """The kms:ViaService value of S3 in a KMS key's region: S3's endpoint name there
    (s3.REGION.amazonaws.com; .amazonaws.com.cn in the China partition)."""
    _, arn_partition, _, region, *_ = key_arn.split(":")
    return f"s3.{region}.amazonaws.com" + (".cn" if arn_partition == "aws-cn" else "")


AUTO_DELETE_TYPE = "Custom::S3AutoDeleteObjects"


def auto_delete_of(bucket: s3.Bucket) -> cdk.CfnResource | None:
    """The custom resource that empties a bucket on delete (`auto_delete_objects=True`), if any."""
    for child in bucket.node.find_all():
        if isinstance(child, cdk.CfnResource) and child.cfn_resource_type == AUTO_DELETE_TYPE:
            return child
    return None


def cluster_arn(settings: Settings) -> str:
    """The cluster's ARN from its settings (a literal: no cross-stack reference for a name we own)."""
    return (
        f"arn:{partition(settings.region)}:eks:{settings.region}:{settings.account}"
        f":cluster/{settings.cluster.name}"
    )


def namespaced_access_entry(
    scope: Construct, construct_id: str, cluster: eks.ICluster, principal: str, group: str
) -> eks.AccessEntry:
    """An EKS access entry of type STANDARD with no access policy, mapping `principal` to the
    Kubernetes group `group`: what it may do is only what RBAC binds to that group (the Roles of
    k8s/rbac.py, in the Ray namespace). aws_eks_v2's AccessEntry has no kubernetesGroups property
    (AccessEntryProps in aws-cdk-lib 2.275), so it is set on its AWS::EKS::AccessEntry (EKS API
    reference, CreateAccessEntry kubernetesGroups: STANDARD entries only)."""
    entry = eks.AccessEntry(
        scope,
        construct_id,
        cluster=cluster,
        principal=principal,
        access_entry_type=eks.AccessEntryType.STANDARD,
        access_policies=[],
    )
    cfn = entry.node.default_child
    assert isinstance(cfn, cdk.CfnResource)
    cfn.add_property_override("KubernetesGroups", [group])
    return entry


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


def _entry_id(team: Team, index: int) -> str:
    # The implicit team's entries keep their logical IDs (JobSubmitter0, ...).
    return f"JobSubmitter{index}" if team.implicit else f"JobSubmitter{_camel(team.name)}{index}"


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

        # EKS Pod Identity: each team's Ray service account gets its team's role, nothing else does.
        self.inputs = s3_inputs(settings)
        self.roles = {team.name: self._pod_role(settings.for_team(team.name)) for team in settings.team_list}
        # Each role's checkpoint prefix (stacks/nag.py names it in the acknowledgement).
        self.checkpoint_prefixes = {
            team.name: checkpoint_prefix(settings.for_team(team.name)) for team in settings.team_list
        }
        self.role = self.roles[settings.deploy_team.name]
        self.submitter_policy = self._submitter_policy(settings)
        self.submitter_entries = [
            namespaced_access_entry(self, _entry_id(team, i), cluster, arn, team.submitter_group)
            for team in settings.team_list
            for i, arn in enumerate(team.submitters)
        ]
        self.associations = {
            team.name: eks_l1.CfnPodIdentityAssociation(
                self,
                "RayPodIdentity" if team.implicit else f"RayPodIdentity{_camel(team.name)}",
                cluster_name=cluster.cluster_name,
                namespace=team.namespace,
                service_account=SERVICE_ACCOUNT,
                role_arn=self.roles[team.name].role_arn,
            )
            for team in settings.team_list
        }
        self.association = self.associations[settings.deploy_team.name]
        namespace = settings.deploy_team.namespace

        code_uri = f"s3://{self.code.s3_bucket_name}/{self.code.s3_object_key}"
        # The bucket's literal name (it is named), not its token: shlex quotes a token's text
        # ("${Token[...]}") in the entry point, and the RayJob `raytrain job submit` renders for the
        # same settings must be byte-identical (tests/test_job_submit.py). The manifests depend on
        # the bucket below instead.
        checkpoint_uri = checkpoint_uri_of(settings)
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
            # job.deploy false: the deploy starts no job (`raytrain job submit` does).
            include_jobs=settings.job.deploy,
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
        # Pods start only once they can get credentials, and the bucket they write to exists.
        self.manifest.node.add_dependency(*self.associations.values(), self.bucket)
        # The RayJobs in a resource of their own whose logical ID carries their names (which carry
        # the hash of their spec and code). A change gives a new RayJob name, which the kubectl
        # handler would only `apply` (its --prune does not reach custom resources, and KubeRay
        # ignores spec changes to an existing RayJob); a new logical ID makes CloudFormation
        # create the new resource and, in its cleanup phase, delete the old one, which runs
        # `kubectl delete` on the old RayJob (its cluster goes with it). On destroy this stack goes
        # before the Cluster stack, so the KubeRay operator still runs to clear the RayJob's
        # finalizer and the namespace can terminate.
        self.job_manifest: eks.KubernetesManifest | None = None
        if jobs:
            digest = hashlib.sha256(
                "\n".join(sorted(o["metadata"]["name"] for o in jobs)).encode()
            ).hexdigest()
            self.job_manifest = eks.KubernetesManifest(
                self,
                f"RayJob{digest[:12]}",
                cluster=cluster,
                manifest=jobs,
                overwrite=True,
            )
            # Its service account and network policies exist first and go last.
            self.job_manifest.node.add_dependency(self.manifest, self.association)
        # Destroy while a job writes checkpoints: the RayJob (and its Ray cluster), the standing
        # cluster and the submitted jobs' anchor go before the checkpoint bucket is emptied. Without
        # an edge CloudFormation runs the deletes at once (it deletes a resource before the ones it
        # depends on, and independent ones in parallel), and a checkpoint landing after the
        # auto-delete handler listed the bucket leaves it non-empty: DeleteBucket fails and so does
        # the destroy. CDK's handler also denies s3:PutObject to everyone before it empties the
        # bucket (aws-s3 auto-delete-objects-handler), so the pods' last writes after that are refused.
        # Destroy with submitted jobs present: they are deleted (foreground) and waited for before
        # the manifests (jobs anchor, Roles) go, while the Cluster stack's KubeRay operator still
        # runs to clear their finalizers (cdk_constructs/job_drain_handler/handler.py: why the
        # anchor's own deletion does not wait).
        self.job_drain = SubmittedJobDrain(
            self,
            "SubmittedJobDrain",
            cluster_name=settings.cluster.name,
            cluster_arn=cluster_arn(settings),
            namespace=namespace,
            other_namespaces=[t.namespace for t in settings.team_list if t.namespace != namespace],
            selector=f"{PART_OF_LABEL}={PART_OF},{ORIGIN_LABEL}={SUBMITTED}",
            kubectl_layer=kubectl_layer(self, settings.cluster.kubernetes_version),
            vpc=cluster.vpc,
            # By its named export, not the cluster object's attribute: that would be an automatic
            # export only this construct uses (stacks/cluster_stack.py, cluster_security_group_export).
            security_group=ec2.SecurityGroup.from_security_group_id(
                self,
                "ClusterSecurityGroup",
                cdk.Fn.import_value(cluster_security_group_export(settings)),
                mutable=False,
            ),
        )
        drainer_entry = namespaced_access_entry(
            self, "JobDrainerAccess", cluster, self.job_drain.role.role_arn, JOB_DRAINER_GROUP
        )
        self.job_drain.after(self.manifest, drainer_entry)
        emptying = auto_delete_of(self.bucket)
        if emptying is not None:
            for manifest in (self.manifest, self.job_manifest):
                if manifest is not None:
                    manifest.node.add_dependency(emptying)

        cdk.CfnOutput(
            self,
            "JobSubmitterPolicyArn",
            value=self.submitter_policy.managed_policy_arn,
            description=(
                "Attach to the IAM principals that run `raytrain job` (cluster.job_submitter_principals)"
            ),
        )

        qualifier = cdk.DefaultStackSynthesizer.DEFAULT_QUALIFIER
        self.review = ReviewValues(
            code_uri=(
                f"s3://cdk-{qualifier}-assets-{settings.account}-{settings.region}/{self.code.asset_hash}.zip"
            ),
            code_hash=self.code.asset_hash,
            checkpoint_uri=checkpoint_uri_of(settings),
        )

    def _pod_role(self, settings: Settings) -> iam.Role:
        """The Ray pods' role of the settings' team (Settings.for_team): the code, its own
        checkpoint prefix, the job's inputs."""
        # EKS Pod Identity: the Ray service account gets this role, and nothing else does.
        team = settings.active_team
        suffix = "" if team.implicit else _camel(team.name)
        who = "" if team.implicit else f" (team {team.name})"
        role = iam.Role(
            self,
            f"RayPodRole{suffix}",
            assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com"),
            description=f"Ray pods of {settings.cluster.name}{who}: read code, read/write its checkpoints",
        )
        assert role.assume_role_policy is not None
        role.assume_role_policy.add_statements(
            iam.PolicyStatement(
                actions=["sts:TagSession"],
                principals=[iam.ServicePrincipal("pods.eks.amazonaws.com")],
            )
        )
        # Exact actions rather than grant_read_write's wildcards: this role is reachable from pods.
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[self.code.bucket.arn_for_objects(self.code.s3_object_key)],
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                # Only the team's own prefix (config/locations.py): another team's checkpoints,
                # prepared data and summaries can be neither read nor written.
                resources=[self.bucket.arn_for_objects(f"{checkpoint_prefix(settings)}/*")],
            )
        )
        # Code that `raytrain job submit` uploads (code/<sha256>.zip): read only.
        role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"], resources=[self.bucket.arn_for_objects(f"{CODE_PREFIX}/*")]
            )
        )
        role.add_to_policy(
            iam.PolicyStatement(actions=["kms:Decrypt", "kms:GenerateDataKey"], resources=[self.key.key_arn])
        )
        # No s3:prefix condition: pyarrow's S3 filesystem (Ray Train's storage,
        # training/reporting/summary.py)
        # sends HeadBucket when it creates a directory, and S3 authorises HeadBucket with
        # s3:ListBucket (S3 API reference, HeadBucket "Permissions"); that request carries no prefix,
        # so a prefix-conditioned grant denies it. The bucket holds only this job's checkpoints.
        role.add_to_policy(iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn]))
        # job.data / job.model in S3: read only. GetObject on the prefix (and the key itself), and
        # s3:ListBucket on the bucket without a prefix condition: pyarrow's GetFileInfo on a folder
        # HEADs the key first and lists only after a 404, and S3 answers a missing key with 404
        # only to callers that have s3:ListBucket on the bucket, 403 otherwise (S3 API reference,
        # HeadObject/GetObject "Permissions"); that request carries no s3:prefix, so a
        # prefix-conditioned grant would not count. The role can list the bucket's key names,
        # read nothing outside the prefix, and write nothing there (tests/test_workload_iam.py).
        # A bucket encrypted with a customer-managed KMS key: job.input_kms_keys (below).
        inputs = s3_inputs(settings)
        arn_partition = partition(settings.region)
        for location in inputs:
            role.add_to_policy(
                iam.PolicyStatement(actions=["s3:GetObject"], resources=location.object_arns(arn_partition))
            )
        for bucket in sorted({location.bucket for location in inputs}):
            role.add_to_policy(
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
            role.add_to_policy(
                iam.PolicyStatement(
                    actions=["kms:Decrypt"],
                    resources=[arn],
                    conditions={"StringEquals": {"kms:ViaService": s3_via_service(arn)}},
                )
            )
        # The code asset in a bootstrap bucket encrypted with a customer-managed key (settings
        # bootstrap_kms_key): GetObject makes S3 call kms:Decrypt as this role, as for the inputs.
        # The key policy `cdk bootstrap --bootstrap-customer-key` writes already lets every
        # principal of the account decrypt through S3 (kms:CallerAccount and kms:ViaService in
        # aws-cdk's bootstrap-template.yaml, FileAssetsBucketEncryptionKey); a key of your own
        # (--bootstrap-kms-key-id) that only delegates to IAM needs this grant.
        if settings.bootstrap_kms_key:
            role.add_to_policy(
                iam.PolicyStatement(
                    actions=["kms:Decrypt"],
                    resources=[settings.bootstrap_kms_key],
                    conditions={
                        "StringEquals": {"kms:ViaService": s3_via_service(settings.bootstrap_kms_key)}
                    },
                )
            )
        # A gated model's token (job.hf_token_secret): read on that secret or parameter only. A
        # SecureString or secret under the AWS managed key needs no KMS grant of ours; a
        # customer-managed key's policy must let this role decrypt (docs/models.md).
        token = settings.job.hf_token_secret
        if token:
            action = "secretsmanager:GetSecretValue" if ":secretsmanager:" in token else "ssm:GetParameter"
            role.add_to_policy(iam.PolicyStatement(actions=[action], resources=[token]))
        return role

    def _submitter_policy(self, settings: Settings) -> iam.ManagedPolicy:
        """What `raytrain job` needs in AWS, for the principals that run it (their EKS access
        entry covers the Kubernetes side): eks:DescribeCluster on this cluster, which
        `aws eks update-kubeconfig` calls for the endpoint and CA (aws-cli,
        awscli/customizations/eks/update_kubeconfig.py, EKSClient.cluster_description; the EKS
        User Guide, create-kubeconfig, names the permission); add a code zip under code/ and read it back
        (HeadObject is authorised by s3:GetObject; S3 API reference, HeadObject), with the
        bucket's KMS key (SSE-KMS PutObject needs kms:GenerateDataKey, GetObject kms:Decrypt; S3
        User Guide, SSE-KMS). No delete, no list, nothing outside code/: a submitter cannot touch
        checkpoints or remove code a running job reads. An existing zip is never overwritten
        (conditional write, If-None-Match; raytrain/job/code.py). And ecr:DescribeImages on the Ray
        image's cache repository (`_image_cache_read`)."""
        return iam.ManagedPolicy(
            self,
            "JobSubmitterPolicy",
            managed_policy_name=f"{settings.stack_prefix}-job-submitter",
            description=f"raytrain job submit for {settings.cluster.name}: upload training code",
            statements=[
                iam.PolicyStatement(actions=["eks:DescribeCluster"], resources=[cluster_arn(settings)]),
                iam.PolicyStatement(
                    actions=["s3:PutObject", "s3:GetObject"],
                    resources=[self.bucket.arn_for_objects(f"{CODE_PREFIX}/*")],
                ),
                iam.PolicyStatement(
                    actions=["kms:GenerateDataKey", "kms:Decrypt"], resources=[self.key.key_arn]
                ),
                *self._image_cache_read(settings),
            ],
        )

    @staticmethod
    def _image_cache_read(settings: Settings) -> list[iam.PolicyStatement]:
        """ecr:DescribeImages on the Ray image's cache repository: `raytrain job submit` checks a
        pinned digest is cached before it submits (raytrain/job/submit.py, check_image_cached).
        DescribeImages is authorised on the repository (Service Authorization Reference, Amazon
        ECR: resource type repository)."""
        repository = settings.image_source.cache_repository(settings.workload.image)
        if repository is None:
            return []
        region, account = settings.region, settings.account
        arn = f"arn:{partition(region)}:ecr:{region}:{account}:repository/{repository}"
        return [iam.PolicyStatement(actions=["ecr:DescribeImages"], resources=[arn])]

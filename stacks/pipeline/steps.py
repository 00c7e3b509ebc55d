"""Commands of the pipeline's post-deploy verification: the in-VPC build's (verification and the
smoke job, run by the environment's PipelineAccess stack's CodeBuild project) and the pipeline step's
(which starts that build from the pipeline's account and follows it)."""

from __future__ import annotations

import shlex

import aws_cdk as cdk
from aws_cdk import aws_codebuild as codebuild

from config.names import SERVICE_ACCOUNT
from config.settings import Settings, Transport
from k8s.chart import rayjob_name

SMOKE_POLL_SECONDS = 30
BUILD_IMAGE = codebuild.LinuxBuildImage.STANDARD_7_0
# Runtimes the Makefile needs (pyproject: Python 3.11-3.12; the CDK CLI and jsii: a Node.js LTS that
# jsii supports, 22; Node 20 is end-of-life). CodeBuild's Ubuntu standard images offer nodejs 18, 20,
# 22 and 24 (CodeBuild User Guide, "Runtime versions").
RUNTIME_VERSIONS = {"python": "3.11", "nodejs": "22"}
# The checkout's own setup (the README's), in both builds: the CDK side only, no torch or Ray.
SETUP_COMMANDS = ["make setup-cdk"]


def verify_commands(settings: Settings, *, smoke_code_hash: str | None = None) -> list[str]:
    """Build commands of the in-VPC verification of one environment (its PipelineAccess stack's
    CodeBuild project, source: the pipeline's checkout). The build's own role has the read-only
    EKS access entry, and inside the VPC the endpoint's name resolves to its private addresses.
    With `smoke_code_hash` (the training code's asset hash), also wait for the deployed RayJob."""
    commands = [
        f"aws eks update-kubeconfig --region {settings.region} --name {settings.cluster.name}",
        f".venv/bin/raytrain verify --env {settings.name}",
    ]
    if smoke_code_hash is not None:
        commands += smoke_commands(settings, code_hash=smoke_code_hash)
    return commands


def smoke_commands(settings: Settings, *, code_hash: str) -> list[str]:
    """Wait for the RayJob this deploy applied (its name hashes its spec and code) to succeed."""
    name = rayjob_name(settings, code_hash=code_hash, service_account_name=SERVICE_ACCOUNT)
    ns = settings.workload.namespace
    version = settings.cluster.kubernetes_version
    deadline = settings.job.active_deadline_seconds * (settings.job.backoff_limit + 1)
    get = f"kubectl -n {ns} get rayjob {name}"
    script = (
        f"end=$((SECONDS + {deadline})); "
        # <Ray job status>/<RayJob deployment status>: the job can also fail before Ray runs it
        # (cluster never ready, deadline exceeded), which only the deployment status shows.
        f"while :; do state=$({get} -o jsonpath='{{.status.jobStatus}}/{{.status.jobDeploymentStatus}}')"
        " || exit 1; "
        f'echo "rayjob {name}: $state"; '
        f'case "$state" in SUCCEEDED/*) break;; FAILED/*|STOPPED/*|*/Failed) {get} -o yaml; exit 1;; esac; '
        f'[ "$SECONDS" -lt "$end" ] || {{ echo "rayjob {name}: no result in {deadline}s"; exit 1; }}; '
        f"sleep {SMOKE_POLL_SECONDS}; done"
    )
    return [
        # kubectl matching the cluster's minor version (not in the build image).
        f"curl -fsSLo /usr/local/bin/kubectl https://dl.k8s.io/release/v{version}.0/bin/linux/amd64/kubectl",
        "chmod +x /usr/local/bin/kubectl",
        f"bash -c {shlex.quote(script)}",
    ]


def bootstrap_lookup_role_arn(settings: Settings) -> str:
    """The CDK bootstrap's lookup role of the environment's account and region: ReadOnlyAccess (less
    kms:Decrypt), trusted by the accounts given to `cdk bootstrap --trust` (the pipeline's) and
    `--trust-for-lookup` (aws-cdk lib/api/bootstrap/bootstrap-template.yaml, LookupRole)."""
    qualifier = cdk.DefaultStackSynthesizer.DEFAULT_QUALIFIER
    return (
        f"arn:{settings.verify_build.partition}:iam::{settings.account}:role/"
        f"cdk-{qualifier}-lookup-role-{settings.account}-{settings.region}"
    )


def preflight_commands(settings: Settings) -> list[str]:
    """The stage's first step: `raytrain preflight` against the environment's account, as the
    bootstrap's read-only lookup role (every action it needs is a Describe/Get, which its
    ReadOnlyAccess policy is expected to grant; a denied call is that check's problem line). A
    problem stops the stage before any stack changes."""
    return [
        f".venv/bin/raytrain preflight --env {settings.name} --role-arn {bootstrap_lookup_role_arn(settings)}"
    ]


PREFLIGHT_TIMEOUT = cdk.Duration.minutes(20)


def start_commands(settings: Settings) -> list[str]:
    """The pipeline step's commands (in the pipeline's account, outside any VPC): upload the
    checkout, start the environment's in-VPC build, follow its log, fail unless it succeeded."""
    return [f".venv/bin/raytrain pipeline-verify --env {settings.name} --source ."]


def check_smoke_environment(settings: Settings) -> None:
    """The smoke step waits for the job the deploy applied, and proves EFA only where that job
    expects EFA between nodes."""
    if not settings.job.deploy:
        raise ValueError(
            f"pipeline.smoke_job lists {settings.name!r}, but its job.deploy is false: its deploy "
            "starts no job for the smoke step to wait for; set job.deploy: true there"
        )
    if settings.job.transport(settings.gpu_nodes.efa) is not Transport.EFA:
        raise ValueError(
            f"pipeline.smoke_job lists {settings.name!r}, but its job does not expect EFA transport "
            f"(gpu_nodes.efa={settings.gpu_nodes.efa}, job.expect_transport="
            f"{settings.job.expect_transport.value})"
        )


# The longest build CodeBuild allows (8 hours; the pipeline step is a build too).
MAX_BUILD_MINUTES = 480
# The pipeline step outlives the build it follows: its own setup, the upload, the build's queue.
START_MARGIN_MINUTES = 30
QUEUE_MINUTES = 20


def step_timeout(settings: Settings, *, smoke: bool) -> cdk.Duration:
    """The in-VPC build's time limit; the pipeline step that waits for it gets `start_timeout`."""
    if not smoke:
        return cdk.Duration.minutes(30)
    attempts = settings.job.backoff_limit + 1
    minutes = settings.job.active_deadline_seconds * attempts // 60 + 30
    return cdk.Duration.minutes(min(minutes, MAX_BUILD_MINUTES - START_MARGIN_MINUTES))


def start_timeout(settings: Settings, *, smoke: bool) -> cdk.Duration:
    build = step_timeout(settings, smoke=smoke).to_minutes()
    return cdk.Duration.minutes(build + START_MARGIN_MINUTES)

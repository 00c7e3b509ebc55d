"""Shell commands of the pipeline's CodeBuild steps: post-deploy verification and the smoke job."""

from __future__ import annotations

import shlex

import aws_cdk as cdk

from config.names import SERVICE_ACCOUNT
from config.settings import Settings, Transport
from k8s.chart import rayjob_name
from stacks.pipeline.access import verify_role_arn

SMOKE_POLL_SECONDS = 30


def verify_commands(settings: Settings, *, smoke_code_hash: str | None = None) -> list[str]:
    """Shell commands of the post-deploy step of one environment (CodeBuild, source checkout).
    With `smoke_code_hash` (the training code's asset hash), also wait for the deployed RayJob."""
    role_arn = verify_role_arn(settings)
    commands = [
        # A profile that assumes the environment's verify role from CodeBuild's own credentials;
        # kubectl's exec plugin and the kubernetes client inherit AWS_PROFILE.
        f"aws configure set profile.target.role_arn {role_arn}",
        "aws configure set profile.target.credential_source EcsContainer",
        "export AWS_PROFILE=target",
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


def check_smoke_environment(settings: Settings) -> None:
    """The smoke step proves EFA only where the job expects EFA between nodes."""
    if settings.job.transport(settings.gpu_nodes.efa) is not Transport.EFA:
        raise ValueError(
            f"pipeline.smoke_job lists {settings.name!r}, but its job does not expect EFA transport "
            f"(gpu_nodes.efa={settings.gpu_nodes.efa}, job.expect_transport="
            f"{settings.job.expect_transport.value})"
        )


def step_timeout(settings: Settings, *, smoke: bool) -> cdk.Duration:
    if not smoke:
        return cdk.Duration.minutes(30)
    attempts = settings.job.backoff_limit + 1
    minutes = settings.job.active_deadline_seconds * attempts // 60 + 30
    return cdk.Duration.minutes(min(minutes, 480))  # CodeBuild's limit

"""`raytrain preflight`'s checks, one problem at a time, against the pretend account and registry of
tests/preflight_account.py (moto, botocore's Stubber, a local OCI registry)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from botocore.stub import Stubber

from raytrain.preflight import command
from tests.preflight_account import (
    DIGEST_A,
    DIGEST_B,
    RAY_REPO,
    RAY_TAG,
    Account,
    Registry,
    check_line,
    digest_env,
    env_dir,
)

# --- the checks --------------------------------------------------------------------------------


def test_a_ready_account_passes_every_check(account: Account, registry: Registry, tmp_path: Path) -> None:
    account.bootstrap()
    account.version()
    account.addons(["v1.8.0-eksbuild.1", "v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    account.ecr_clean()
    code, lines = account.run(env_dir(tmp_path), registry)
    assert code == command.EXIT_OK, lines
    assert all(line.startswith("ok ") for line in lines[:-1]), lines
    assert "Kubernetes 1.35 is in standard support until 2027-03-27" in check_line(
        lines, "kubernetes version"
    )
    assert "g6.12xlarge is offered in us-west-2b" in check_line(lines, "gpu offering")
    assert "max_size needs 96" in check_line(lines, "gpu vcpu quota")
    assert lines[-1] == f"dev: {len(lines) - 1} ok, 0 warning(s), 0 problem(s)"
    # The token flow asked for pull scope on each image's repository.
    assert f"repository:{RAY_REPO}:pull" in registry.scopes


def test_each_problem_names_its_fix(account: Account, registry: Registry, tmp_path: Path) -> None:
    # Not bootstrapped; 1.35 in extended support; the pinned add-on missing; quota short; the EFA
    # plugin's tag missing upstream; a rule left behind with dev's prefix.
    registry.manifests["eks/aws-efa-k8s-device-plugin"] = {}
    account.no_stack("CDKToolkit")
    account.version("EXTENDED_SUPPORT", dt.datetime(2026, 12, 2))
    account.addons(["v1.8.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 64)
    account.ecr_clean(rules=["dev/ecr-public"])
    account.no_stack("RayTrain-dev-Cluster")
    code, lines = account.run(env_dir(tmp_path), registry)
    assert code == command.EXIT_PROBLEM
    assert "npx cdk bootstrap aws://111122223333/us-west-2" in check_line(lines, "cdk bootstrap")
    version = check_line(lines, "kubernetes version")
    assert version.startswith("warn ")
    assert "standard support ended 2026-12-02" in version
    assert "$0.60 per cluster-hour instead of $0.10 (+$365 a month per cluster)" in version
    addon = check_line(lines, "add-on eks-node-monitoring-agent")
    assert "v1.7.0-eksbuild.1 is not offered for Kubernetes 1.35" in addon
    assert "fix: set addons.node_monitoring_agent" in addon
    quota = check_line(lines, "gpu vcpu quota")
    assert "is 64 vCPUs; max_size 2 x g6.12xlarge needs 96" in quota
    assert "--quota-code L-DB2E81BA --desired-value 96" in quota
    assert "v0.5.20 does not exist upstream" in check_line(lines, "EFA device plugin image")
    assert "dev/ecr-public already exist" in check_line(lines, "cache rules")


def test_standard_support_ending_soon_is_a_warning(
    account: Account, registry: Registry, tmp_path: Path
) -> None:
    account.bootstrap()
    account.version(end=dt.datetime(2027, 1, 15))
    account.addons(["v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    account.ecr_clean()
    code, lines = account.run(env_dir(tmp_path), registry)
    assert code == command.EXIT_OK
    assert "standard support ends 2027-01-15 (43 days)" in check_line(lines, "kubernetes version")


def test_pinned_digest_is_the_tags_upstream(account: Account, registry: Registry, tmp_path: Path) -> None:
    account.bootstrap()
    account.version()
    account.addons(["v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    account.ecr_clean()
    code, lines = account.run(digest_env(tmp_path, DIGEST_A), registry)
    assert code == command.EXIT_OK, lines
    assert f"is {DIGEST_A} upstream: the deploy warms the cache by tag" in check_line(lines, "Ray image")


def test_pinned_digest_the_tag_moved_away_from(account: Account, registry: Registry, tmp_path: Path) -> None:
    # The tag now names B; A is pinned and not cached: the first job would fail (containers-roadmap#2837).
    registry.add(RAY_REPO, RAY_TAG, DIGEST_B)
    account.bootstrap()
    account.version()
    account.addons(["v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    account.ecr_clean()
    account.ecr_stub.add_client_error(
        "describe_images",
        "RepositoryNotFoundException",
        expected_params={
            "repositoryName": f"dev/ecr-public/{RAY_REPO}",
            "imageIds": [{"imageDigest": DIGEST_A}],
        },
    )
    code, lines = account.run(digest_env(tmp_path, DIGEST_A), registry)
    assert code == command.EXIT_PROBLEM
    ray = check_line(lines, "Ray image")
    assert f"now names {DIGEST_B}, not the pinned {DIGEST_A}" in ray
    assert "aws/containers-roadmap#2837" in ray
    assert f"pin the tag's current digest {DIGEST_B}" in ray


def test_pinned_digest_already_cached(account: Account, registry: Registry, tmp_path: Path) -> None:
    registry.add(RAY_REPO, RAY_TAG, DIGEST_B)
    account.bootstrap()
    account.version()
    account.addons(["v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    account.ecr_clean()
    account.ecr_stub.add_response(
        "describe_images",
        {"imageDetails": [{"imageDigest": DIGEST_A, "imageTags": [RAY_TAG]}]},
    )
    code, lines = account.run(digest_env(tmp_path, DIGEST_A), registry)
    assert code == command.EXIT_OK, lines
    assert f"{DIGEST_A} is in the cache (dev/ecr-public/{RAY_REPO})" in check_line(lines, "Ray image")


def test_creation_template_without_role_blocks_the_cache(
    account: Account, registry: Registry, tmp_path: Path
) -> None:
    account.bootstrap()
    account.version()
    account.addons(["v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    templates: list[dict[str, Any]] = [
        {
            "prefix": "ROOT",
            "appliedFor": ["PULL_THROUGH_CACHE"],
            "encryptionConfiguration": {
                "encryptionType": "KMS",
                "kmsKey": "arn:aws:kms:us-west-2:111122223333:key/k",
            },
        },
        # A more specific template that only covers replication does not apply to the cache.
        {"prefix": "dev", "appliedFor": ["REPLICATION"], "resourceTags": [{"Key": "a", "Value": "b"}]},
    ]
    account.ecr_clean(templates=templates)
    code, lines = account.run(env_dir(tmp_path), registry)
    assert code == command.EXIT_PROBLEM
    problems = [line for line in lines if line.startswith("problem repository creation templates:")]
    assert len(problems) == 3  # one per rule prefix: ecr-public, k8s, quay
    assert (
        "template 'ROOT' applies to dev/ecr-public/ with KMS encryption but no customRoleArn" in problems[0]
    )


def test_registry_policy_denying_the_cache(account: Account, registry: Registry, tmp_path: Path) -> None:
    account.bootstrap()
    account.version()
    account.addons(["v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    account.ecr_stub.add_client_error(
        "describe_pull_through_cache_rules", "PullThroughCacheRuleNotFoundException"
    )
    account.ecr_stub.add_response(
        "describe_repository_creation_templates", {"repositoryCreationTemplates": []}
    )
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "NoImports",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "ecr:BatchImportUpstreamImage",
                "Resource": "*",
            }
        ],
    }
    account.ecr_stub.add_response(
        "get_registry_policy", {"registryId": "111122223333", "policyText": json.dumps(policy)}
    )
    code, lines = account.run(env_dir(tmp_path), registry)
    assert code == command.EXIT_PROBLEM
    assert "NoImports" in check_line(lines, "registry policy")


def test_a_denied_call_is_that_checks_problem(account: Account, registry: Registry, tmp_path: Path) -> None:
    account.bootstrap()
    account.eks_stub.add_client_error(
        "describe_cluster_versions",
        "AccessDeniedException",
        "not authorized to perform eks:DescribeClusterVersions",
    )
    account.addons(["v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    account.ecr_clean()
    code, lines = account.run(env_dir(tmp_path), registry)
    assert code == command.EXIT_PROBLEM
    version = check_line(lines, "kubernetes version")
    assert "could not check: DescribeClusterVersions was denied" in version
    assert "raytrain preflight --help" in version


def test_rejected_credentials_stop_the_run(account: Account, registry: Registry, tmp_path: Path) -> None:
    account.eks_stub.add_client_error("describe_cluster_versions", "ExpiredTokenException", "expired")
    account.bootstrap()
    code, lines = account.run(env_dir(tmp_path), registry)
    assert code == command.EXIT_AWS
    assert lines == []


def test_capacity_block_checks_the_reservation(
    registry: Registry, tmp_path: Path, aws_credentials: None
) -> None:
    # moto 5.2 has no capacity reservations: EC2 stubbed too.
    account = Account()  # no hub: the model-access line warns, which this test does not read
    env = env_dir(
        tmp_path,
        {
            "  capacity_type: ON_DEMAND\n  placement_group: true\n": (
                "  capacity_type: CAPACITY_BLOCK\n  capacity_reservation_id: cr-0123456789abcdef0\n"
                "  placement_group: false\n"
            )
        },
    )
    ec2 = Stubber(account.ec2)
    account.bootstrap()
    account.version()
    account.addons(["v1.7.0-eksbuild.1"])
    ec2.add_response(
        "describe_instance_type_offerings",
        {
            "InstanceTypeOfferings": [
                {"InstanceType": "g6.12xlarge", "LocationType": "availability-zone", "Location": "us-west-2b"}
            ]
        },
    )
    ec2.add_response(
        "describe_capacity_reservations",
        {
            "CapacityReservations": [
                {
                    "CapacityReservationId": "cr-0123456789abcdef0",
                    "InstanceType": "g6.12xlarge",
                    "AvailabilityZone": "us-west-2a",
                    "TotalInstanceCount": 2,
                    "State": "active",
                    "InstanceMatchCriteria": "targeted",
                }
            ]
        },
        {"CapacityReservationIds": ["cr-0123456789abcdef0"]},
    )
    account.ecr_clean()
    with ec2:
        code, lines = account.run(env, registry)
    ec2.assert_no_pending_responses()
    assert code == command.EXIT_PROBLEM
    assert "it is in us-west-2a, not gpu_nodes.availability_zone us-west-2b" in check_line(
        lines, "gpu capacity reservation"
    )
    assert not any("vcpu quota" in line for line in lines)
    assert "ec2:DescribeCapacityReservations" in account.recorder.calls

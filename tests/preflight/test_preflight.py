"""`raytrain preflight`'s checks, one problem at a time, against the pretend account and registry of
tests/preflight_account.py (moto, botocore's Stubber, a local OCI registry)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from config.loader import load_settings
from raytrain.preflight import command
from tests.preflight_account import (
    DIGEST_A,
    DIGEST_B,
    RAY_REPO,
    RAY_TAG,
    REGION,
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


@pytest.mark.parametrize(("version", "status"), [("7", "problem"), ("8", "ok")])
def test_bootstrap_version_boundary_is_the_lookup_roles(version: str, status: str, synthesized) -> None:
    """The lowest version preflight accepts is the highest any synthesized stack requires, its
    lookup role's included (the manifest's `requiresBootstrapStackVersion`): one below is refused."""
    from raytrain.preflight import account as account_checks

    required = set()
    for env in ("dev", "prod"):
        manifest = json.loads((synthesized[env].directory / "manifest.json").read_text())
        for artifact in manifest["artifacts"].values():
            props = artifact.get("properties", {})
            required.add(props.get("requiresBootstrapStackVersion", 0))
            required.add(props.get("lookupRole", {}).get("requiresBootstrapStackVersion", 0))
    assert account_checks.MIN_BOOTSTRAP_VERSION == max(required) == 8
    stack = {"StackName": "CDKToolkit", "CreationTime": dt.datetime(2026, 1, 1),
             "StackStatus": "UPDATE_COMPLETE",
             "Outputs": [{"OutputKey": "BootstrapVersion", "OutputValue": version}]}  # fmt: skip
    cloudformation = boto3.client(
        "cloudformation", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
    )
    with Stubber(cloudformation) as stub:
        stub.add_response("describe_stacks", {"Stacks": [stack]}, {"StackName": "CDKToolkit"})
        (check,) = account_checks.bootstrap(load_settings("dev"), cloudformation)
    assert check.status.value == status, check
    if status == "problem":
        assert "bootstrap version 7, 8+ needed (the lookup role" in check.detail


def test_access_entry_principals_must_exist(account: Account, registry: Registry, tmp_path: Path) -> None:
    """One missing role, one user at another path than configured, one of another account: each
    its own line; the existing ones are ok."""
    account.principals("arn:aws:iam::111122223333:user/team/alice")
    replace = {
        "submitters: [arn:aws:iam::111122223333:role/MLEngineer]": (
            "submitters: [arn:aws:iam::111122223333:role/MLEngineer, arn:aws:iam::111122223333:role/Missing,"
            " arn:aws:iam::111122223333:user/alice, arn:aws:iam::444455556666:role/Partner]"
        )
    }
    from raytrain.preflight import principals

    settings = load_settings("dev", env_dir(tmp_path, replace))
    checks = list(principals.access_principals(settings, account.iam))
    lines = {c.detail.split(" ", 1)[0]: c for c in checks}
    assert lines["arn:aws:iam::111122223333:role/Admin"].status.value == "ok"
    assert lines["arn:aws:iam::111122223333:role/MLEngineer"].status.value == "ok"
    missing = lines["arn:aws:iam::111122223333:role/Missing"]
    assert missing.status.value == "problem" and "does not exist" in missing.detail
    assert "RayTrain-dev-Workload would fail" in missing.detail and "teams.research.submitters" in missing.fix
    path = lines["arn:aws:iam::111122223333:user/alice"]
    assert path.status.value == "problem" and path.fix == (
        "set teams.research.submitters to arn:aws:iam::111122223333:user/team/alice"
    )
    other = lines["arn:aws:iam::444455556666:role/Partner"]
    assert other.status.value == "warn" and "account 444455556666" in other.detail


def test_a_missing_admin_role_fails_preflight_before_the_cluster_does(
    account: Account, registry: Registry, tmp_path: Path
) -> None:
    boto3.client("iam", region_name=REGION).delete_role(RoleName="Admin")
    account.bootstrap()
    account.version()
    account.addons(["v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    account.ecr_clean()
    code, lines = account.run(env_dir(tmp_path), registry)
    assert code == command.EXIT_PROBLEM
    (line,) = [x for x in lines if x.startswith("problem access entry principals:")]
    assert "arn:aws:iam::111122223333:role/Admin (cluster.admin_principal_arns) does not exist" in line
    assert "RayTrain-dev-Cluster would fail after the EKS cluster is created (and roll it back)" in line


def test_cache_rules_are_read_page_by_page_and_only_ours_count() -> None:
    """Other environments' rules do not count; one of ours on a later page does."""
    from raytrain.preflight import account as account_checks

    settings = load_settings("dev")
    ecr = boto3.client("ecr", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    cloudformation = boto3.client(
        "cloudformation", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x"
    )

    def rule(prefix: str) -> dict[str, str]:
        return {"ecrRepositoryPrefix": prefix, "upstreamRegistryUrl": "public.ecr.aws"}

    with Stubber(ecr) as stub, Stubber(cloudformation) as cfn:
        stub.add_response(
            "describe_pull_through_cache_rules",
            {"pullThroughCacheRules": [rule("prod/ecr-public"), rule("dev-old/k8s")], "nextToken": "t"},
            {},
        )
        stub.add_response("describe_pull_through_cache_rules", {"pullThroughCacheRules": [rule("dev/quay")]},
                          {"nextToken": "t"})  # fmt: skip
        cfn.add_client_error("describe_stacks", "ValidationError",
                             "Stack with id RayTrain-dev-Cluster does not exist",
                             expected_params={"StackName": "RayTrain-dev-Cluster"})  # fmt: skip
        (check,) = account_checks.cache_rules(settings, ecr, cloudformation)
        stub.assert_no_pending_responses()
    assert check.status.value == "problem"
    assert "rules with the prefixes dev/quay already exist" in check.detail
    with Stubber(ecr) as stub:
        stub.add_response(
            "describe_pull_through_cache_rules", {"pullThroughCacheRules": [rule("prod/quay")]}, {}
        )
        (check,) = account_checks.cache_rules(settings, ecr, cloudformation)
    assert check.status.value == "ok" and "no rule holds" in check.detail


@pytest.mark.parametrize(
    ("zones", "status"),
    [
        (["us-west-2a"], "problem"),
        (["us-west-2a", "us-west-2c"], "problem"),
        (["us-west-2a", "us-west-2b"], "ok"),
    ],
)
def test_the_gpu_type_must_be_offered_in_the_pinned_zone_not_another(zones: list[str], status: str) -> None:
    """Offered in the region but only in other zones than gpu_nodes.availability_zone: refused.
    EC2 answers per zone (DescribeInstanceTypeOfferings, LocationType availability-zone)."""
    from raytrain.aws import CapacityApi
    from raytrain.preflight import capacity

    settings = load_settings("dev")
    assert settings.gpu_nodes.availability_zone == "us-west-2b"
    keys = {"region_name": REGION, "aws_access_key_id": "x", "aws_secret_access_key": "x"}
    ec2, quotas = boto3.client("ec2", **keys), boto3.client("service-quotas", **keys)
    with Stubber(ec2) as stub, Stubber(quotas) as quota_stub:
        offerings = [
            {"InstanceType": "g6.12xlarge", "LocationType": "availability-zone", "Location": z} for z in zones
        ]
        stub.add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": offerings},
                          {"LocationType": "availability-zone",
                           "Filters": [{"Name": "instance-type", "Values": ["g6.12xlarge"]}]})  # fmt: skip
        stub.add_response("describe_instances", {"Reservations": []})
        quota_stub.add_response("get_service_quota",
                                {"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA",
                                           "Value": 192}})  # fmt: skip
        checks = list(capacity.capacity_checks(settings, CapacityApi(REGION, ec2, quotas)))
    offering = next(c for c in checks if c.name == "gpu offering")
    assert offering.status.value == status, offering
    if status == "problem":
        assert offering.detail == "g6.12xlarge is not offered in us-west-2b"


@pytest.mark.parametrize(
    ("vpcs", "eips", "deployed", "lines"),
    [
        (5, 5, False, {"vpc quota": "ok", "elastic ip quota": "ok"}),
        # moto's account has its default VPC: 1 used + 1 needed against a quota of 1.
        (1, 5, False, {"vpc quota": "problem", "elastic ip quota": "ok"}),
        (2, 0, False, {"vpc quota": "ok", "elastic ip quota": "problem"}),
        (1, 0, True, {"vpc quota": "ok", "elastic ip quota": "ok"}),  # already deployed: counted in
    ],
)
def test_vpc_and_elastic_ip_quotas_at_their_boundary(
    account: Account,
    registry: Registry,
    tmp_path: Path,
    vpcs: int,
    eips: int,
    deployed: bool,
    lines: dict[str, str],
) -> None:
    account.bootstrap()
    account.version()
    account.addons(["v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    account.ecr_clean()
    account.network(vpcs=vpcs, eips=eips, deployed=deployed)
    _, out = account.run(env_dir(tmp_path), registry, network=False)
    for name, status in lines.items():
        line = check_line(out, name)
        assert line.startswith(status), line
    if lines["vpc quota"] == "problem":
        assert "VPCs per Region: 1 of 1 used and RayTrain-dev-Network needs 1 more" in check_line(
            out, "vpc quota"
        )
        assert "--service-code vpc --quota-code L-F678F1CE --desired-value 2" in check_line(out, "vpc quota")
    if lines["elastic ip quota"] == "problem":
        assert "EC2-VPC Elastic IPs: 0 of 0 used and RayTrain-dev-Network needs 1 more" in check_line(
            out, "elastic ip quota"
        )


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


@pytest.mark.parametrize(("mutability", "status"), [("IMMUTABLE", "warn"),
                                                     ("IMMUTABLE_WITH_EXCLUSION", "warn"),
                                                     ("MUTABLE", "ok"), (None, "ok")])  # fmt: skip
def test_an_immutable_tag_template_over_the_cache_is_a_warning(mutability: str | None, status: str) -> None:
    from raytrain.preflight import account as account_checks

    template: dict[str, Any] = {"prefix": "dev", "appliedFor": ["PULL_THROUGH_CACHE"]}
    if mutability:
        template["imageTagMutability"] = mutability
    ecr = boto3.client("ecr", region_name=REGION, aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(ecr) as stub:
        stub.add_response(
            "describe_repository_creation_templates", {"repositoryCreationTemplates": [template]}
        )
        checks = list(account_checks.creation_templates(load_settings("dev"), ecr))
    assert len(checks) == 3 and {c.status.value for c in checks} == {status}, checks
    if status == "warn":
        assert (
            f"template 'dev' makes the tags of the repositories under dev/quay/ {mutability}"
            in checks[2].detail
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
    code, lines = account.run(env_dir(tmp_path), registry, network=False)
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
    ec2.add_response("describe_vpcs", {"Vpcs": [{"VpcId": "vpc-0123456789abcdef0"}]})
    ec2.add_response("describe_addresses", {"Addresses": []})
    with ec2:
        code, lines = account.run(env, registry)
    ec2.assert_no_pending_responses()
    assert code == command.EXIT_PROBLEM
    assert "it is in us-west-2a, not gpu_nodes.availability_zone us-west-2b" in check_line(
        lines, "gpu capacity reservation"
    )
    assert not any("vcpu quota" in line for line in lines)
    assert "ec2:DescribeCapacityReservations" in account.recorder.calls

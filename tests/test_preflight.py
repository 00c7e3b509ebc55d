"""`raytrain preflight`: moto for EC2 (what it implements), botocore's Stubber for what moto lacks
here (eks:DescribeClusterVersions/DescribeAddonVersions, ECR pull-through rules, creation templates,
registry policy and images, EC2 Service Quotas codes; CloudFormation, whose moto backend needs
moto's apigateway extra, not installed), and a local registry
that speaks the OCI distribution API with the token flow for the images.

Stubbed responses are checked against botocore's model by the Stubber itself (shape and expected
parameters), so a call the real API would reject fails here too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from config.loader import ENVIRONMENTS_DIR
from raytrain.aws import CapacityApi
from raytrain.preflight import IAM_ACTIONS, command
from raytrain.preflight.permissions import NO_PERMISSION_NEEDED, CallRecorder
from raytrain.preflight.registry import RegistryClient

REGION = "us-west-2"
RAY_REPO = "deep-learning-containers/ray"
RAY_TAG = "train-ml-cuda-v1.1"
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
TODAY = dt.date(2026, 12, 3)


# --- a public registry ------------------------------------------------------------------------


class Registry(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RegistryHandler)
        # repository -> {reference (tag or digest) -> digest}
        self.manifests: dict[str, dict[str, str]] = {}
        self.scopes: list[str] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add(self, repository: str, tag: str, digest: str) -> None:
        refs = self.manifests.setdefault(repository, {})
        refs[tag] = digest
        refs[digest] = digest


class _RegistryHandler(BaseHTTPRequestHandler):
    server: Registry

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # the token endpoint
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        self.server.scopes += query.get("scope", [])
        body = json.dumps({"token": "anonymous"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        repository, _, reference = self.path.removeprefix("/v2/").rpartition("/manifests/")
        if self.headers.get("Authorization") != "Bearer anonymous":
            self.send_response(401)
            self.send_header(
                "WWW-Authenticate",
                f'Bearer realm="{self.server.base}/token",service="registry",'
                f'scope="repository:{repository}:pull"',
            )
            self.end_headers()
            return
        assert "application/vnd.oci.image.index.v1+json" in self.headers.get("Accept", "")
        digest = self.server.manifests.get(repository, {}).get(reference)
        if digest is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Docker-Content-Digest", digest)
        self.end_headers()


@pytest.fixture
def registry() -> Iterator[Registry]:
    server = Registry()
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    # What dev pulls through the cache, at the tags its pinned charts and settings name.
    server.add(RAY_REPO, RAY_TAG, DIGEST_A)
    server.add("kuberay/operator", "v1.7.0", "sha256:" + "1" * 64)
    server.add("autoscaling/cluster-autoscaler", "v1.35.2", "sha256:" + "2" * 64)
    server.add("eks/aws-efa-k8s-device-plugin", "v0.5.20", "sha256:" + "3" * 64)
    yield server
    server.shutdown()
    server.server_close()


def _registry_client(server: Registry) -> RegistryClient:
    hosts = ("public.ecr.aws", "quay.io", "registry.k8s.io")
    return RegistryClient(base_urls=dict.fromkeys(hosts, server.base))


# --- the environment --------------------------------------------------------------------------


def _env_dir(tmp_path: Path, replace: dict[str, str] | None = None, append: str = "") -> Path:
    text = (ENVIRONMENTS_DIR / "dev.yaml").read_text()
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / "dev.yaml").write_text(text + append)
    return tmp_path


def _args(config_dir: Path) -> argparse.Namespace:
    return argparse.Namespace(env="dev", profile=None, role_arn=None, config_dir=config_dir)


class Account:
    """One account: moto EC2, stubbed CloudFormation, EKS, ECR and Service Quotas."""

    def __init__(self) -> None:
        self.recorder = CallRecorder()
        watch = self.recorder.watch
        self.ec2 = watch(boto3.client("ec2", region_name=REGION))
        self.cloudformation = watch(boto3.client("cloudformation", region_name=REGION))
        self.eks = watch(boto3.client("eks", region_name=REGION))
        self.ecr = watch(boto3.client("ecr", region_name=REGION))
        self.quotas = watch(boto3.client("service-quotas", region_name=REGION))
        self.stubs = [Stubber(c) for c in (self.eks, self.ecr, self.quotas, self.cloudformation)]
        self.eks_stub, self.ecr_stub, self.quota_stub, self.cfn_stub = self.stubs

    def bootstrap(self, version: str = "21") -> None:
        self.cfn_stub.add_response(
            "describe_stacks",
            {
                "Stacks": [
                    {
                        "StackName": "CDKToolkit",
                        "CreationTime": dt.datetime(2026, 1, 1),
                        "StackStatus": "UPDATE_COMPLETE",
                        "Outputs": [{"OutputKey": "BootstrapVersion", "OutputValue": version}],
                    }
                ]
            },
            {"StackName": "CDKToolkit"},
        )

    def no_stack(self, name: str) -> None:
        self.cfn_stub.add_client_error(
            "describe_stacks",
            "ValidationError",
            f"Stack with id {name} does not exist",
            expected_params={"StackName": name},
        )

    def clients(self) -> command.Clients:
        return command.Clients(
            eks=self.eks,
            ecr=self.ecr,
            cloudformation=self.cloudformation,
            capacity=CapacityApi(REGION, self.ec2, self.quotas),
        )

    # Stubbed answers, in the order the checks ask.
    def version(self, status: str = "STANDARD_SUPPORT", end: dt.datetime = dt.datetime(2027, 3, 27)) -> None:
        self.eks_stub.add_response(
            "describe_cluster_versions",
            {
                "clusterVersions": [
                    {
                        "clusterVersion": "1.35",
                        "versionStatus": status,
                        "endOfStandardSupportDate": end,
                        "endOfExtendedSupportDate": end.replace(year=end.year + 1),
                    }
                ]
            },
            {"clusterVersions": ["1.35"], "includeAll": True},
        )

    def addons(self, versions: list[str]) -> None:
        self.eks_stub.add_response(
            "describe_addon_versions",
            {
                "addons": [
                    {
                        "addonName": "eks-node-monitoring-agent",
                        "addonVersions": [{"addonVersion": v} for v in versions],
                    }
                ]
            },
            {"addonName": "eks-node-monitoring-agent", "kubernetesVersion": "1.35"},
        )

    def quota(self, code: str, value: float) -> None:
        self.quota_stub.add_response(
            "get_service_quota",
            {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "Value": value}},
            {"ServiceCode": "ec2", "QuotaCode": code},
        )

    def ecr_clean(
        self, rules: list[str] | None = None, templates: list[dict[str, Any]] | None = None
    ) -> None:
        if rules:
            self.ecr_stub.add_response(
                "describe_pull_through_cache_rules",
                {
                    "pullThroughCacheRules": [
                        {"ecrRepositoryPrefix": p, "upstreamRegistryUrl": "public.ecr.aws"} for p in rules
                    ]
                },
            )
        else:
            self.ecr_stub.add_client_error(
                "describe_pull_through_cache_rules", "PullThroughCacheRuleNotFoundException"
            )
        self.ecr_stub.add_response(
            "describe_repository_creation_templates", {"repositoryCreationTemplates": templates or []}
        )
        self.ecr_stub.add_client_error("get_registry_policy", "RegistryPolicyNotFoundException")

    def run(self, config_dir: Path, server: Registry) -> tuple[int, list[str]]:
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.ExitStack() as stack:
            for stub in self.stubs:
                stack.enter_context(stub)
            stack.enter_context(contextlib.redirect_stdout(out))
            code = command.run(_args(config_dir), self.clients(), _registry_client(server), TODAY)
        for stub in self.stubs:
            stub.assert_no_pending_responses()
        return code, out.getvalue().splitlines()


@pytest.fixture
def account(aws_credentials: None) -> Iterator[Account]:
    with mock_aws():
        yield Account()


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)


def _line(lines: list[str], name: str) -> str:
    found = [line for line in lines if line.split(None, 1)[1].startswith(f"{name}:")]
    assert len(found) == 1, (name, lines)
    return found[0]


# --- the checks --------------------------------------------------------------------------------


def test_a_ready_account_passes_every_check(account: Account, registry: Registry, tmp_path: Path) -> None:
    account.bootstrap()
    account.version()
    account.addons(["v1.8.0-eksbuild.1", "v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    account.ecr_clean()
    code, lines = account.run(_env_dir(tmp_path), registry)
    assert code == command.EXIT_OK, lines
    assert all(line.startswith("ok ") for line in lines[:-1]), lines
    assert "Kubernetes 1.35 is in standard support until 2027-03-27" in _line(lines, "kubernetes version")
    assert "g6.12xlarge is offered in us-west-2b" in _line(lines, "gpu offering")
    assert "max_size needs 96" in _line(lines, "gpu vcpu quota")
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
    code, lines = account.run(_env_dir(tmp_path), registry)
    assert code == command.EXIT_PROBLEM
    assert "npx cdk bootstrap aws://111122223333/us-west-2" in _line(lines, "cdk bootstrap")
    version = _line(lines, "kubernetes version")
    assert version.startswith("warn ")
    assert "standard support ended 2026-12-02" in version
    assert "$0.60 per cluster-hour instead of $0.10 (+$365 a month per cluster)" in version
    addon = _line(lines, "add-on eks-node-monitoring-agent")
    assert "v1.7.0-eksbuild.1 is not offered for Kubernetes 1.35" in addon
    assert "fix: set addons.node_monitoring_agent" in addon
    quota = _line(lines, "gpu vcpu quota")
    assert "is 64 vCPUs; max_size 2 x g6.12xlarge needs 96" in quota
    assert "--quota-code L-DB2E81BA --desired-value 96" in quota
    assert "v0.5.20 does not exist upstream" in _line(lines, "EFA device plugin image")
    assert "dev/ecr-public already exist" in _line(lines, "cache rules")


def test_standard_support_ending_soon_is_a_warning(
    account: Account, registry: Registry, tmp_path: Path
) -> None:
    account.bootstrap()
    account.version(end=dt.datetime(2027, 1, 15))
    account.addons(["v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    account.ecr_clean()
    code, lines = account.run(_env_dir(tmp_path), registry)
    assert code == command.EXIT_OK
    assert "standard support ends 2027-01-15 (43 days)" in _line(lines, "kubernetes version")


def _digest_env(tmp_path: Path, digest: str) -> Path:
    return _env_dir(tmp_path, append=f'\nworkload:\n  image_digest: "{digest}"\n')


def test_pinned_digest_is_the_tags_upstream(account: Account, registry: Registry, tmp_path: Path) -> None:
    account.bootstrap()
    account.version()
    account.addons(["v1.7.0-eksbuild.1"])
    account.quota("L-DB2E81BA", 192)
    account.ecr_clean()
    code, lines = account.run(_digest_env(tmp_path, DIGEST_A), registry)
    assert code == command.EXIT_OK, lines
    assert f"is {DIGEST_A} upstream: the deploy warms the cache by tag" in _line(lines, "Ray image")


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
    code, lines = account.run(_digest_env(tmp_path, DIGEST_A), registry)
    assert code == command.EXIT_PROBLEM
    ray = _line(lines, "Ray image")
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
    code, lines = account.run(_digest_env(tmp_path, DIGEST_A), registry)
    assert code == command.EXIT_OK, lines
    assert f"{DIGEST_A} is in the cache (dev/ecr-public/{RAY_REPO})" in _line(lines, "Ray image")


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
    code, lines = account.run(_env_dir(tmp_path), registry)
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
    code, lines = account.run(_env_dir(tmp_path), registry)
    assert code == command.EXIT_PROBLEM
    assert "NoImports" in _line(lines, "registry policy")


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
    code, lines = account.run(_env_dir(tmp_path), registry)
    assert code == command.EXIT_PROBLEM
    version = _line(lines, "kubernetes version")
    assert "could not check: DescribeClusterVersions was denied" in version
    assert "raytrain preflight --help" in version


def test_rejected_credentials_stop_the_run(account: Account, registry: Registry, tmp_path: Path) -> None:
    account.eks_stub.add_client_error("describe_cluster_versions", "ExpiredTokenException", "expired")
    account.bootstrap()
    code, lines = account.run(_env_dir(tmp_path), registry)
    assert code == command.EXIT_AWS
    assert lines == []


def test_capacity_block_checks_the_reservation(
    registry: Registry, tmp_path: Path, aws_credentials: None
) -> None:
    # moto 5.2 has no capacity reservations: EC2 stubbed too.
    account = Account()
    env = _env_dir(
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
    assert "it is in us-west-2a, not gpu_nodes.availability_zone us-west-2b" in _line(
        lines, "gpu capacity reservation"
    )
    assert not any("vcpu quota" in line for line in lines)
    assert "ec2:DescribeCapacityReservations" in account.recorder.calls


# --- permissions -------------------------------------------------------------------------------


def test_the_permission_list_covers_every_call(account: Account, registry: Registry, tmp_path: Path) -> None:
    """Every call a run makes is in IAM_ACTIONS (or needs none), and each listed action is made by
    some run here (ec2:DescribeCapacityReservations in the capacity-reservation test): the list is
    neither short nor padded."""
    registry.add(RAY_REPO, RAY_TAG, DIGEST_B)
    # A running G instance: the quota's usage is counted in vCPUs (ec2:DescribeInstanceTypes).
    setup = boto3.client("ec2", region_name=REGION)  # not watched: setup, not the command's calls
    ami = setup.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    setup.run_instances(ImageId=ami, InstanceType="g6.12xlarge", MinCount=1, MaxCount=1)
    account.bootstrap()
    account.version()
    account.addons(["v1.7.0-eksbuild.1"])
    # A quota never changed: Service Quotas answers with AWS's default.
    account.quota_stub.add_client_error("get_service_quota", "NoSuchResourceException")
    account.quota_stub.add_response(
        "get_aws_default_service_quota",
        {"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA", "Value": 64}},
    )
    account.ecr_clean(rules=["dev/ecr-public"])
    account.no_stack("RayTrain-dev-Cluster")
    account.ecr_stub.add_client_error("describe_images", "RepositoryNotFoundException")
    _, lines = account.run(_digest_env(tmp_path, DIGEST_A), registry)
    assert "is 64 vCPUs; max_size 2 x g6.12xlarge needs 96" in _line(lines, "gpu vcpu quota")
    calls = account.recorder.calls
    assert calls - NO_PERMISSION_NEEDED <= set(IAM_ACTIONS), calls - set(IAM_ACTIONS)
    assert set(IAM_ACTIONS) - calls == {"ec2:DescribeCapacityReservations"}


def test_docs_list_the_permissions() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    missing = [action for action in IAM_ACTIONS if f"`{action}`" not in text]
    assert not missing, f"docs/operations.md does not list {missing}"


def test_cli_registers_preflight() -> None:
    from raytrain.cli import build_parser

    args = build_parser().parse_args(["preflight", "--env", "dev"])
    assert args.func is command.run


# --- IAM enforced: moto's server evaluates the policy on every EC2 request ----------------------


@pytest.fixture
def moto_ec2_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from tests.moto_server import running_moto_server

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "admin")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "admin")
    with running_moto_server() as endpoint:
        yield endpoint


def _user_with(endpoint: str, actions: list[str]) -> dict[str, str]:
    iam = boto3.client("iam", region_name=REGION, endpoint_url=endpoint)
    name = f"preflight-{len(actions)}"
    iam.create_user(UserName=name)
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
    iam.put_user_policy(UserName=name, PolicyName="preflight", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}


def _enforce(monkeypatch: pytest.MonkeyPatch) -> None:
    import moto.settings
    from moto.core.authorization import ActionAuthenticatorMixin

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    monkeypatch.setattr(ActionAuthenticatorMixin, "request_count", 0)


@pytest.mark.parametrize("denied", [None, "ec2:DescribeInstanceTypeOfferings"])
def test_the_documented_ec2_permissions_suffice_under_iam(
    moto_ec2_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, denied: str | None
) -> None:
    """With exactly the listed EC2 actions the capacity checks pass; without one, that check is a
    problem line naming the denied call (not a traceback, not a skipped check)."""
    from config.loader import load_settings
    from raytrain.preflight import capacity
    from raytrain.preflight.report import guarded

    actions = [a for a in IAM_ACTIONS if a.startswith("ec2:") and a != denied]
    creds = _user_with(moto_ec2_server, actions)
    _enforce(monkeypatch)
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=moto_ec2_server, **creds)
    quotas = boto3.client("service-quotas", region_name=REGION, **creds)
    settings = load_settings("dev", _env_dir(tmp_path))
    with Stubber(quotas) as stub:
        if denied is None:
            stub.add_response(
                "get_service_quota",
                {"Quota": {"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA", "Value": 192}},
            )
        checks = guarded(
            "gpu capacity", lambda: capacity.capacity_checks(settings, CapacityApi(REGION, ec2, quotas))
        )
    if denied is None:
        assert [c.status.value for c in checks] == ["ok", "ok"], checks
    else:
        (check,) = checks
        assert check.status.value == "problem"
        assert "could not check: DescribeInstanceTypeOfferings was denied" in check.detail


def test_no_credentials_exit_3_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: Any
) -> None:
    from raytrain.cli import main

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    assert main(["preflight", "--env", "dev"]) == command.EXIT_AWS
    err = capsys.readouterr().err
    assert "no AWS credentials found" in err and "Traceback" not in err


def test_a_role_of_another_account_is_refused(aws_credentials: None, capsys: Any) -> None:
    from raytrain.cli import main

    with mock_aws():
        code = main(["preflight", "--env", "dev", "--role-arn", "arn:aws:iam::999999999999:role/cdk-lookup"])
    assert code == command.EXIT_AWS
    err = capsys.readouterr().err
    assert "the credentials are for account 999999999999, but env 'dev' is for account 111122223333" in err

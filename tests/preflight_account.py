"""The pretend account and registry of `raytrain preflight`'s tests (tests/preflight/).

moto for EC2 (what it implements), botocore's Stubber for what moto lacks here
(eks:DescribeClusterVersions/DescribeAddonVersions, ECR pull-through rules, creation templates,
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

from config.loader import environments_dir
from raytrain.aws import CapacityApi
from raytrain.preflight import command
from raytrain.preflight.permissions import CallRecorder
from raytrain.preflight.registry import RegistryClient
from tests.hub_stub import Hub
from tests.hub_stub import serve as serve_hub

REGION = "us-west-2"
RAY_REPO = "deep-learning-containers/ray"
RAY_TAG = "train-ml-cuda-v1.1"
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
TODAY = dt.date(2026, 12, 3)
# dev's access-entry principals (config/environments/dev.yaml).
# dev.yaml's admin and its two teams' submitters.
DEV_PRINCIPALS = (
    "arn:aws:iam::111122223333:role/Admin",
    "arn:aws:iam::111122223333:role/MLEngineer",
    "arn:aws:iam::111122223333:role/AppliedML",
)


# --- a public registry ------------------------------------------------------------------------


class Registry(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), RegistryHandler)
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


class RegistryHandler(BaseHTTPRequestHandler):
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


def serve_registry() -> Iterator[Registry]:
    """The `registry` fixture's body: a local OCI registry holding what dev pulls."""
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


def registry_client(server: Registry) -> RegistryClient:
    hosts = ("public.ecr.aws", "quay.io", "registry.k8s.io")
    return RegistryClient(base_urls=dict.fromkeys(hosts, server.base))


# --- the environment --------------------------------------------------------------------------


def env_dir(tmp_path: Path, replace: dict[str, str] | None = None, append: str = "") -> Path:
    text = (environments_dir() / "dev.yaml").read_text()
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / "dev.yaml").write_text(text + append)
    return tmp_path


def preflight_args(config_dir: Path, env: str = "dev") -> argparse.Namespace:
    return argparse.Namespace(env=env, profile=None, role_arn=None, config_dir=config_dir)


class Account:
    """One account: moto EC2, stubbed CloudFormation, EKS, ECR and Service Quotas."""

    def __init__(self, region: str = REGION, hub: Hub | None = None) -> None:
        self.region = region
        # The Hugging Face hub's auth-check (tests/hub_stub.py), every model public; without one
        # the model-access check asks nothing it could reach (offline: a warning).
        self.hub = hub
        if hub is not None:
            hub.open = True
        self.recorder = CallRecorder()
        watch = self.recorder.watch
        self.ec2 = watch(boto3.client("ec2", region_name=region))
        self.cloudformation = watch(boto3.client("cloudformation", region_name=region))
        self.eks = watch(boto3.client("eks", region_name=region))
        self.ecr = watch(boto3.client("ecr", region_name=region))
        self.quotas = watch(boto3.client("service-quotas", region_name=region))
        self.iam = watch(boto3.client("iam", region_name=region))
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
            capacity=CapacityApi(self.region, self.ec2, self.quotas),
            iam=self.iam,
            secrets=lambda service, region: self.recorder.watch(boto3.client(service, region_name=region)),
            hub=self.hub.api() if self.hub is not None else None,
        )

    def principals(self, *arns: str) -> None:
        """The roles and users named, in moto's IAM (not watched: setup)."""
        iam = boto3.client("iam", region_name=REGION)
        trust = json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow",
                            "Action": "sts:AssumeRole",
                            "Principal": {"AWS": "arn:aws:iam::111122223333:root"}}]})  # fmt: skip
        for arn in arns or DEV_PRINCIPALS:
            kind, _, rest = arn.split(":", 5)[5].partition("/")
            path, _, name = rest.rpartition("/")
            path = f"/{path}/" if path else "/"
            if kind == "role":
                iam.create_role(RoleName=name, Path=path, AssumeRolePolicyDocument=trust)
            else:
                iam.create_user(UserName=name, Path=path)

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
        # Every rule of the registry (no prefixes asked), the last page without a nextToken.
        self.ecr_stub.add_response(
            "describe_pull_through_cache_rules",
            {
                "pullThroughCacheRules": [
                    {"ecrRepositoryPrefix": p, "upstreamRegistryUrl": "public.ecr.aws"} for p in rules or []
                ]
            },
            {},
        )
        self.ecr_stub.add_response(
            "describe_repository_creation_templates", {"repositoryCreationTemplates": templates or []}
        )
        self.ecr_stub.add_client_error("get_registry_policy", "RegistryPolicyNotFoundException")

    def network(self, vpcs: float = 5, eips: float = 5, deployed: bool = False, env: str = "dev") -> None:
        """The last group's answers: the Network stack (absent unless `deployed`), the VPC and
        Elastic IP quotas (moto's EC2 answers the usage: its default VPC, no addresses)."""
        stack = f"RayTrain-{env}-Network"
        if deployed:
            self.cfn_stub.add_response(
                "describe_stacks",
                {"Stacks": [{"StackName": stack, "CreationTime": dt.datetime(2026, 1, 1),
                             "StackStatus": "CREATE_COMPLETE"}]},
                {"StackName": stack},
            )  # fmt: skip
        else:
            self.no_stack(stack)
        for service, code, value in (("vpc", "L-F678F1CE", vpcs), ("ec2", "L-0263D0A3", eips)):
            self.quota_stub.add_response(
                "get_service_quota",
                {"Quota": {"ServiceCode": service, "QuotaCode": code, "Value": value}},
                {"ServiceCode": service, "QuotaCode": code},
            )

    def run(
        self, config_dir: Path, server: Registry, env: str = "dev", *, network: bool = True
    ) -> tuple[int, list[str]]:
        import contextlib
        import io

        """The whole command; `network`: add the last group's default answers."""
        if network:
            self.network(env=env)

        out = io.StringIO()
        with contextlib.ExitStack() as stack:
            for stub in self.stubs:
                stack.enter_context(stub)
            stack.enter_context(contextlib.redirect_stdout(out))
            code = command.run(
                preflight_args(config_dir, env), self.clients(), registry_client(server), TODAY
            )
        for stub in self.stubs:
            stub.assert_no_pending_responses()
        return code, out.getvalue().splitlines()


def fake_account() -> Iterator[Account]:
    """The `account` fixture's body (after `aws_credentials`)."""
    with mock_aws(), serve_hub() as hub:
        account = Account(hub=hub)
        account.principals()  # a ready account has dev's principals
        yield account


def set_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)


def check_line(lines: list[str], name: str) -> str:
    found = [line for line in lines if line.split(None, 1)[1].startswith(f"{name}:")]
    assert len(found) == 1, (name, lines)
    return found[0]


def digest_env(tmp_path: Path, digest: str) -> Path:
    """dev's environment with the Ray image pinned to `digest`."""
    return env_dir(tmp_path, append=f'\nworkload:\n  image_digest: "{digest}"\n')

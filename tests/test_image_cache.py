"""ECR pull-through cache: the rules, the images every pod pulls through it, the node roles' grant
(moto's IAM evaluator on the synthesized policy), the endpoints the pulls use, and the job-start
cost before and after."""

from __future__ import annotations

import json
import re

import pytest

from cdk_constructs.addons import chart_image_repository, values_file
from cdk_constructs.image_cache import FILL_ACTIONS
from config.loader import load_settings
from config.registries import CACHE_PREFIX_MAX, CACHE_PREFIX_RE, ECR_PREFIX_MAX, UPSTREAMS, split_image
from raytrain import cost
from tests.chart_render import render, variant
from tests.test_settings import dev_data, error_of

ENVS = ["dev", "prod"]
REGISTRY = "111122223333.dkr.ecr.us-west-2.amazonaws.com"


def _resources(template: dict, type_name: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_name}


# --- settings ---------------------------------------------------------------------------------


def test_prefix_rules_are_ecrs_own() -> None:
    """Our pattern and length are CreatePullThroughCacheRule's (botocore's ECR model), and every
    upstream we use is one of its upstreamRegistry values."""
    import botocore.session

    members = botocore.session.get_session().get_service_model("ecr")
    members = members.operation_model("CreatePullThroughCacheRule").input_shape.members
    meta = members["ecrRepositoryPrefix"].metadata
    assert meta["max"] == ECR_PREFIX_MAX
    ecr_re = re.compile(meta["pattern"])
    for prefix in ("dev", "ray-train.dev", "team_a/dev", "a__b", "x--y"):
        assert CACHE_PREFIX_RE.match(prefix) and ecr_re.match(prefix), prefix
        for upstream in UPSTREAMS.values():
            assert ecr_re.match(f"{prefix}/{upstream}")
    for bad in ("Dev", "-dev", "dev/", "dev//x", "a..b", "dev x"):
        assert not CACHE_PREFIX_RE.match(bad), bad
    assert set(UPSTREAMS.values()) <= set(members["upstreamRegistry"].enum)


@pytest.mark.parametrize(
    ("prefix", "says"),
    [("Dev", "not an ECR repository prefix"), ("x" * (CACHE_PREFIX_MAX + 1), f"at most {CACHE_PREFIX_MAX}")],
)
def test_bad_cache_prefix_is_refused_naming_the_field(prefix: str, says: str) -> None:
    data = dev_data()
    data["registry"] = {"cache_prefix": prefix}
    message = error_of(data)
    assert "registry.cache_prefix:" in message and says in message, message


def test_an_environment_name_that_is_no_prefix_needs_cache_prefix() -> None:
    """With the cache on and no cache_prefix, the environment's name is the prefix: a name ECR
    refuses as one is refused, naming registry.cache_prefix."""
    import json as json_

    from config.loader import SettingsError, parse_settings

    data = dev_data()
    data.pop("registry", None)
    with pytest.raises(SettingsError) as info:
        parse_settings(json_.dumps(data), name="dev-", source="dev-.yaml")
    assert "registry.cache_prefix: unset, so the environment's name would be the prefix" in str(info.value)
    data["registry"] = {"cache_prefix": "dev-team"}
    assert parse_settings(json_.dumps(data), name="dev-", source="x").image_source.prefix == "dev-team"


@pytest.mark.parametrize("region", ["us-west-2", "cn-north-1", "cn-northwest-1", "us-gov-west-1"])
def test_the_registry_host_is_the_partitions(region: str) -> None:
    """The private registry's host ends in the region's partition's DNS suffix (botocore's
    endpoint data: amazonaws.com.cn in China), not a hand-written rule's."""
    import boto3
    import botocore.loaders

    from config.registries import ImageSource

    partition = boto3.session.Session().get_partition_for_region(region)
    partitions = botocore.loaders.create_loader().load_data("endpoints")["partitions"]
    suffix = next(p["dnsSuffix"] for p in partitions if p["partition"] == partition)
    source = ImageSource(account="111122223333", region=region, prefix="dev")
    assert source.registry == f"111122223333.dkr.ecr.{region}.{suffix}"
    assert source.resolve("quay.io/kuberay/operator:v1.7.0") == (
        f"111122223333.dkr.ecr.{region}.{suffix}/dev/quay/kuberay/operator:v1.7.0"
    )


def test_cache_on_by_default_with_the_environments_name_and_off_on_request() -> None:
    dev = load_settings("dev")
    assert dev.registry.pull_through_cache and dev.image_source.prefix == "dev"
    off = variant("dev", registry={"pull_through_cache": False})
    assert off.ray_image_ref == off.workload.image_ref
    named = variant("dev", registry={"cache_prefix": "team-a/dev"})
    assert named.ray_image_ref.startswith(f"{REGISTRY}/team-a/dev/ecr-public/")


# --- images -----------------------------------------------------------------------------------


def test_ray_pods_pull_the_image_through_the_cache_keeping_the_digest() -> None:
    digest = "sha256:" + "cd" * 32
    s = variant("dev", workload={"image_digest": digest})
    host, path = split_image(s.workload.image)
    assert host == "public.ecr.aws"
    expected = f"{REGISTRY}/dev/ecr-public/{path}@{digest}"
    job = next(o for o in render(s) if o["kind"] == "RayJob")
    spec = job["spec"]
    pods = [spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"], spec["submitterPodTemplate"]["spec"]]
    pods += [g["template"]["spec"] for g in spec["rayClusterSpec"]["workerGroupSpecs"]]
    assert {c["image"] for pod in pods for c in pod["containers"]} == {expected}


def test_an_image_from_another_registry_is_left_as_it_is() -> None:
    s = variant("dev", workload={"image": "123456789012.dkr.ecr.us-west-2.amazonaws.com/ray:own"})
    assert s.ray_image_ref == "123456789012.dkr.ecr.us-west-2.amazonaws.com/ray:own"


@pytest.mark.parametrize("env", ENVS)
def test_rules_for_every_upstream_the_cluster_pulls_from(synthesized, env) -> None:
    s = synthesized[env].settings
    rules = _resources(synthesized[env].template("Cluster"), "AWS::ECR::PullThroughCacheRule")
    props = sorted((r["Properties"] for r in rules.values()), key=lambda p: p["UpstreamRegistry"])
    prefix = s.image_source.prefix
    # Written out, not built from UPSTREAMS (the code under test): ECR's upstream names and hosts.
    assert props == [
        {"EcrRepositoryPrefix": f"{prefix}/{name}", "UpstreamRegistry": name, "UpstreamRegistryUrl": host}
        for name, host in [("ecr-public", "public.ecr.aws"), ("k8s", "registry.k8s.io"), ("quay", "quay.io")]
    ]
    assert all("CredentialArn" not in p for p in props)


@pytest.mark.parametrize("env", ENVS)
def test_add_ons_pull_through_the_cache_except_nvidia(synthesized, env) -> None:
    """The EFA plugin (its ECR Public copy), KubeRay (quay.io), the autoscaler and Kueue
    (registry.k8s.io) come from the environment's registry; the NVIDIA plugin stays on nvcr.io (not
    supports); every release waits for the cache."""
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    charts = {r["Properties"]["Chart"]: r for r in _resources(t, "Custom::AWSCDK-EKS-HelmChart").values()}
    registry = f"{s.account}.dkr.ecr.{s.region}.amazonaws.com/{s.image_source.prefix}"
    values = {name: json.loads(r["Properties"]["Values"]) for name, r in charts.items()}
    repos = {name: v.get("image", {}).get("repository") for name, v in values.items() if name != "kueue"}
    # Kueue's chart nests its controller image (controllerManager.manager.image, values.yaml 0.19.2).
    kueue_image = values["kueue"]["controllerManager"]["manager"]["image"]
    assert kueue_image["repository"] == f"{registry}/k8s/kueue/kueue"
    assert kueue_image["tag"] == f"v{s.addons.kueue}"
    kuberay = chart_image_repository("kuberay-operator", s.addons.kuberay_operator)
    autoscaler = chart_image_repository("cluster-autoscaler", s.addons.cluster_autoscaler)
    assert (kuberay, autoscaler) == (
        "quay.io/kuberay/operator",
        "registry.k8s.io/autoscaling/cluster-autoscaler",
    )
    assert repos == {
        "aws-efa-k8s-device-plugin": f"{registry}/ecr-public/eks/aws-efa-k8s-device-plugin",
        "kuberay-operator": f"{registry}/quay/kuberay/operator",
        "cluster-autoscaler": f"{registry}/k8s/autoscaling/cluster-autoscaler",
        "nvidia-device-plugin": None,
    }
    nvidia = values_file("nvidia-device-plugin", s.addons.nvidia_device_plugin).read_text()
    assert "repository: nvcr.io/nvidia/k8s-device-plugin" in nvidia
    rules = set(_resources(t, "AWS::ECR::PullThroughCacheRule"))
    (grant,) = [k for k in _resources(t, "AWS::IAM::Policy") if k.startswith("ImageCache")]
    for name, chart in charts.items():
        assert rules | {grant} <= set(chart["DependsOn"]), name


@pytest.mark.parametrize("env", ENVS)
def test_node_roles_may_fill_the_cache_and_nothing_else(synthesized, env) -> None:
    import moto.iam.access_control as ac

    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    (policy,) = [r for k, r in _resources(t, "AWS::IAM::Policy").items() if k.startswith("ImageCache")]
    roles = {r["Ref"] for r in policy["Properties"]["Roles"]}
    node_roles = {
        r["Properties"]["NodeRole"]["Fn::GetAtt"][0] for r in _resources(t, "AWS::EKS::Nodegroup").values()
    }
    assert roles == node_roles and len(roles) == 2
    for role in roles:  # the pulls themselves: EKS's managed read-only ECR policy
        arns = json.dumps(t["Resources"][role]["Properties"]["ManagedPolicyArns"])
        assert "AmazonEC2ContainerRegistryReadOnly" in arns
    evaluator = ac.IAMPolicy(json.dumps(policy["Properties"]["PolicyDocument"]))
    base = f"arn:aws:ecr:{s.region}:{s.account}:repository"
    prefix = s.image_source.prefix
    cached = f"{base}/{prefix}/ecr-public/deep-learning-containers/ray"
    for action in FILL_ACTIONS:
        assert evaluator.is_action_permitted(action, cached) is ac.PermissionResult.PERMITTED, action
        for other in (f"{base}/other/ray", f"{base}/{prefix}x/ray",
                      f"arn:aws:ecr:eu-west-1:{s.account}:repository/{prefix}/ecr-public/ray"):  # fmt: skip
            assert evaluator.is_action_permitted(action, other) is not ac.PermissionResult.PERMITTED, other
    for action in ("ecr:PutImage", "ecr:DeleteRepository", "ecr:SetRepositoryPolicy"):
        assert evaluator.is_action_permitted(action, cached) is not ac.PermissionResult.PERMITTED, action


@pytest.mark.parametrize("env", ENVS)
def test_pulls_go_through_the_ecr_and_s3_endpoints(synthesized, env) -> None:
    t = synthesized[env].template("Network")
    services = json.dumps(
        [r["Properties"]["ServiceName"] for r in _resources(t, "AWS::EC2::VPCEndpoint").values()]
    )
    for service in (".ecr.api", ".ecr.dkr", ".s3"):
        assert f'{service}"' in services.replace("]]}", '"'), service
    gateways = [
        r
        for r in _resources(t, "AWS::EC2::VPCEndpoint").values()
        if r["Properties"].get("VpcEndpointType") == "Gateway"
    ]
    assert len(gateways) == 1 and ".s3" in json.dumps(gateways[0]["Properties"]["ServiceName"])


# --- cost -------------------------------------------------------------------------------------


def test_job_start_image_pull_by_hand() -> None:
    """dev: 2 GPU nodes from zero pull 20 GB each = 40 GB a job start. Without the cache:
    40 × $0.045 = $1.80 of NAT processing, and 500 GB / 40 GB = 12 job starts a month before ECR
    Public's anonymous quota is spent. Through it: layers over the S3 gateway endpoint, $0, and
    20 GB × $0.10 = $2.00 a month of ECR storage."""
    pull = cost.image_pull(load_settings("dev"))
    assert (pull.image_gb, pull.nodes, pull.gb_per_job, pull.cached) == (20.0, 2, 40.0, True)
    assert pull.nat_per_job == pytest.approx(1.80)
    assert pull.job_starts_within_quota == 12
    assert pull.cached_per_job == 0
    assert pull.cache_storage_per_month == pytest.approx(2.00)
    kept = cost.image_pull(variant("dev", gpu_nodes={"min_size": 2}))
    assert (kept.nodes, kept.nat_per_job, kept.job_starts_within_quota) == (0, 0, None)
    off = cost.image_pull(variant("dev", registry={"pull_through_cache": False}))
    assert off.cached is False


def test_cost_cli_prints_the_job_start_figures(capsys) -> None:
    from raytrain.cli import main

    assert main(["cost", "--env", "dev", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["image_pull"]
    assert out["gb_per_job"] == 40.0 and out["nat_per_job"] == pytest.approx(1.8)
    assert main(["cost", "--env", "dev"]) == 0
    text = capsys.readouterr().out
    assert "$1.80 per job" in text and "12 job starts" in text and "$2.00 a month" in text

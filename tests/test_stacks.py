"""Template assertions for the network and cluster stacks, for every environment and a p5 variant."""

from __future__ import annotations

import json

import pytest
from aws_cdk.assertions import Template
from ruamel.yaml import YAML

from config.catalogue import CATALOGUE
from config.loader import environment_file

ENVS = ["dev", "prod", "p5"]


def resources(template: dict, type_name: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_name}


def one(template: dict, type_name: str, predicate=lambda r: True) -> dict:
    found = [r for r in resources(template, type_name).values() if predicate(r)]
    assert len(found) == 1, f"expected one {type_name}, found {len(found)}"
    return found[0]


def gpu_nodegroup(template: dict) -> dict:
    return one(
        template, "AWS::EKS::Nodegroup", lambda r: r["Properties"]["Labels"].get("role") == "gpu-worker"
    )


def system_nodegroup(template: dict) -> dict:
    return one(template, "AWS::EKS::Nodegroup", lambda r: r["Properties"]["Labels"].get("role") == "system")


def launch_template_of(template: dict, nodegroup: dict) -> dict:
    logical_id = nodegroup["Properties"]["LaunchTemplate"]["Id"]["Ref"]
    return template["Resources"][logical_id]["Properties"]["LaunchTemplateData"]


# ---------------------------------------------------------------- network


@pytest.mark.parametrize("env", ENVS)
def test_vpc_subnets_nat_and_endpoints(synthesized, env):
    s = synthesized[env].settings
    t = synthesized[env].template("Network")
    template = Template.from_json(t)
    template.has_resource_properties("AWS::EC2::VPC", {"CidrBlock": s.vpc.cidr})
    azs = s.vpc.availability_zones
    template.resource_count_is("AWS::EC2::Subnet", 2 * len(azs))
    template.resource_count_is("AWS::EC2::NatGateway", s.vpc.nat_gateways)
    private = [
        r for r in resources(t, "AWS::EC2::Subnet").values() if not r["Properties"].get("MapPublicIpOnLaunch")
    ]
    assert sorted(r["Properties"]["AvailabilityZone"] for r in private) == sorted(azs)

    endpoints = resources(t, "AWS::EC2::VPCEndpoint").values()
    services = {json.dumps(r["Properties"]["ServiceName"]) for r in endpoints}
    assert any(".s3" in name for name in services)
    for suffix in ("ecr.api", "ecr.dkr", "sts"):
        assert any(suffix in name for name in services), suffix
    gateway = [r for r in endpoints if r["Properties"].get("VpcEndpointType", "Gateway") == "Gateway"]
    assert len(gateway) == 1


@pytest.mark.parametrize("env", ENVS)
def test_flow_logs_and_default_security_group_closed(synthesized, env):
    s = synthesized[env].settings
    template = Template.from_json(synthesized[env].template("Network"))
    template.has_resource_properties("AWS::EC2::FlowLog", {"TrafficType": "ALL"})
    template.has_resource_properties(
        "AWS::Logs::LogGroup", {"RetentionInDays": s.vpc.flow_log_retention_days}
    )
    template.resource_count_is("Custom::VpcRestrictDefaultSG", 1)


def test_nat_gateway_per_az_in_prod(synthesized):
    s = synthesized["prod"].settings
    assert s.vpc.nat_gateways == len(s.vpc.availability_zones)
    Template.from_json(synthesized["prod"].template("Network")).resource_count_is(
        "AWS::EC2::NatGateway", len(s.vpc.availability_zones)
    )


# ---------------------------------------------------------------- cluster


@pytest.mark.parametrize("env", ENVS)
def test_cluster_control_plane(synthesized, env):
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    cluster = one(t, "AWS::EKS::Cluster")["Properties"]
    assert cluster["Version"] == s.cluster.kubernetes_version
    assert cluster["Name"] == s.cluster.name
    assert cluster["AccessConfig"] == {
        "AuthenticationMode": "API",
        "BootstrapClusterCreatorAdminPermissions": False,
    }
    log_types = {e["Type"] for e in cluster["Logging"]["ClusterLogging"]["EnabledTypes"]}
    assert log_types == {"api", "audit", "authenticator", "controllerManager", "scheduler"}
    assert cluster["EncryptionConfig"][0]["Resources"] == ["secrets"]
    key_id = cluster["EncryptionConfig"][0]["Provider"]["KeyArn"]["Fn::GetAtt"][0]
    assert t["Resources"][key_id]["Properties"]["EnableKeyRotation"] is True
    # Managed node groups only: no Auto Mode compute.
    assert cluster["ComputeConfig"] == {"Enabled": False}
    vpc_config = cluster["ResourcesVpcConfig"]
    assert vpc_config["EndpointPrivateAccess"] is True
    assert vpc_config["PublicAccessCidrs"] == s.cluster.public_access_cidrs
    assert "0.0.0.0/0" not in vpc_config["PublicAccessCidrs"]


@pytest.mark.parametrize("env", ENVS)
def test_access_entries_for_configured_admins(synthesized, env):
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    # Besides the admins, only CDK's kubectl handler role (a token, not a literal ARN) has an entry.
    all_entries = list(resources(t, "AWS::EKS::AccessEntry").values())
    entries = [e for e in all_entries if isinstance(e["Properties"]["PrincipalArn"], str)]
    assert len(all_entries) == len(entries) + 1
    principals = sorted(e["Properties"]["PrincipalArn"] for e in entries)
    assert principals == sorted(s.cluster.admin_principal_arns)
    for entry in entries:
        policies = entry["Properties"]["AccessPolicies"]
        assert policies[0]["AccessScope"] == {"Type": "cluster"}
        assert "AmazonEKSClusterAdminPolicy" in json.dumps(policies[0]["PolicyArn"])


@pytest.mark.parametrize("env", ENVS)
def test_managed_addons(synthesized, env):
    t = synthesized[env].template("Cluster")
    addons = {r["Properties"]["AddonName"]: r for r in resources(t, "AWS::EKS::Addon").values()}
    obs = synthesized[env].settings.observability
    assert set(addons) == {
        "vpc-cni",
        "coredns",
        "kube-proxy",
        "eks-pod-identity-agent",
        *(["eks-node-monitoring-agent"] if obs.node_monitoring else []),
        *(["amazon-cloudwatch-observability"] if obs.metrics else []),
    }
    config = json.loads(addons["vpc-cni"]["Properties"]["ConfigurationValues"])
    assert config == {"enableNetworkPolicy": "true"}


@pytest.mark.parametrize("env", ENVS)
def test_system_node_group(synthesized, env):
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    group = system_nodegroup(t)["Properties"]
    assert group["AmiType"] == "AL2023_x86_64_STANDARD"
    assert group["InstanceTypes"] == [s.system_nodes.instance_type]
    assert group["ScalingConfig"] == {
        "MinSize": s.system_nodes.min_size,
        "DesiredSize": s.system_nodes.desired_size,
        "MaxSize": s.system_nodes.max_size,
    }
    assert len(group["Subnets"]) == len(s.vpc.availability_zones)
    assert "Taints" not in group


@pytest.mark.parametrize("env", ENVS)
def test_gpu_node_group(synthesized, env):
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    group = gpu_nodegroup(t)["Properties"]
    assert group["AmiType"] == "AL2023_x86_64_NVIDIA"
    assert "InstanceTypes" not in group  # the launch template names the type
    assert launch_template_of(t, gpu_nodegroup(t))["InstanceType"] == s.gpu_nodes.instance_type
    assert group["CapacityType"] == s.gpu_nodes.capacity_type.value
    accelerator = f"nvidia-{s.gpu_nodes.instance.gpu_model.lower()}"
    assert group["Labels"] == {
        "role": "gpu-worker",
        "nvidia.com/gpu.present": "true",
        "k8s.amazonaws.com/accelerator": accelerator,
    }
    assert group["Taints"] == [{"Effect": "NO_SCHEDULE", "Key": "nvidia.com/gpu", "Value": "present"}]
    assert group["UpdateConfig"] == {"MaxUnavailable": 1}
    # The autoscaler owns the size: the template's desired size is the minimum, never a job's count.
    assert group["ScalingConfig"] == {
        "MinSize": s.gpu_nodes.min_size,
        "DesiredSize": s.gpu_nodes.min_size,
        "MaxSize": s.gpu_nodes.max_size,
    }
    # One subnet: the private subnet of the pinned AZ (checked through the Network stack export).
    assert len(group["Subnets"]) == 1
    export = group["Subnets"][0]["Fn::ImportValue"]
    network = synthesized[env].template("Network")
    subnet_id = next(
        o["Value"]["Ref"] for o in network["Outputs"].values() if o.get("Export", {}).get("Name") == export
    )
    subnet = network["Resources"][subnet_id]["Properties"]
    assert subnet["AvailabilityZone"] == s.gpu_nodes.availability_zone
    assert subnet["MapPublicIpOnLaunch"] is False


@pytest.mark.parametrize("env", ENVS)
def test_gpu_launch_template_carries_every_efa_interface(synthesized, env):
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    data = launch_template_of(t, gpu_nodegroup(t))
    interfaces = data["NetworkInterfaces"]
    instance = CATALOGUE[s.gpu_nodes.instance_type]
    assert len(interfaces) == instance.efa_interfaces
    assert [i["NetworkCardIndex"] for i in interfaces] == list(range(instance.efa_interfaces))
    assert (interfaces[0]["DeviceIndex"], interfaces[0]["InterfaceType"]) == (0, "efa")
    expected = (0, "efa-only") if instance.efa_only else (1, "efa")
    assert all((i["DeviceIndex"], i["InterfaceType"]) == expected for i in interfaces[1:])
    efa_sg = one(t, "AWS::EC2::SecurityGroup", lambda r: "EFA" in r["Properties"]["GroupDescription"])
    efa_sg_id = next(k for k, v in t["Resources"].items() if v is efa_sg)
    for interface in interfaces:
        assert "SubnetId" not in interface
        groups = json.dumps(interface["Groups"])
        assert efa_sg_id in groups and "ClusterSecurityGroupId" in groups
    assert data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == s.gpu_nodes.root_volume_gib >= 200


def test_p5_secondary_cards_are_efa_only(synthesized):
    """p5.48xlarge: 32 cards; the primary EFA (with ENA) on card 0, 31 EFA-only interfaces after it."""
    data = launch_template_of(
        synthesized["p5"].template("Cluster"), gpu_nodegroup(synthesized["p5"].template("Cluster"))
    )
    layout = [
        (i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in data["NetworkInterfaces"]
    ]
    assert layout == [(0, 0, "efa")] + [(card, 0, "efa-only") for card in range(1, 32)]


def test_placement_group_on_unless_reservation(synthesized):
    for env in ("dev", "prod"):
        t = synthesized[env].template("Cluster")
        group = one(t, "AWS::EC2::PlacementGroup")
        assert group["Properties"]["Strategy"] == "cluster"
        data = launch_template_of(t, gpu_nodegroup(t))
        assert "Ref" in data["Placement"]["GroupName"]
        assert "CapacityReservationSpecification" not in data
    t = synthesized["p5"].template("Cluster")
    assert not resources(t, "AWS::EC2::PlacementGroup")
    data = launch_template_of(t, gpu_nodegroup(t))
    assert "Placement" not in data
    target = data["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target == {"CapacityReservationId": "cr-0123456789abcdef0"}


@pytest.mark.parametrize("env", ENVS)
def test_helm_addons_pinned_and_ordered_before_node_groups(synthesized, env):
    s = synthesized[env].settings
    t = synthesized[env].template("Cluster")
    charts = {
        r["Properties"]["Chart"]: (k, r) for k, r in resources(t, "Custom::AWSCDK-EKS-HelmChart").items()
    }
    assert charts["nvidia-device-plugin"][1]["Properties"]["Version"] == s.addons.nvidia_device_plugin
    assert charts["aws-efa-k8s-device-plugin"][1]["Properties"]["Version"] == s.addons.efa_device_plugin
    assert charts["kuberay-operator"][1]["Properties"]["Version"] == s.addons.kuberay_operator
    gpu_group = next(k for k, v in t["Resources"].items() if v is gpu_nodegroup(t))
    system_group = next(k for k, v in t["Resources"].items() if v is system_nodegroup(t))
    # DependsOn makes CloudFormation delete the release before the nodes it runs on.
    for chart in ("nvidia-device-plugin", "aws-efa-k8s-device-plugin"):
        assert gpu_group in charts[chart][1].get("DependsOn", [])
    assert system_group in charts["kuberay-operator"][1].get("DependsOn", [])
    # Node groups wait for the networking add-ons; everything sits on the cluster.
    addons = {r["Properties"]["AddonName"]: k for k, r in resources(t, "AWS::EKS::Addon").items()}
    for group in (gpu_group, system_group):
        depends = t["Resources"][group].get("DependsOn", [])
        assert addons["vpc-cni"] in depends and addons["kube-proxy"] in depends


def test_cluster_stack_depends_on_network(synthesized):
    manifest = json.loads((synthesized["dev"].directory / "manifest.json").read_text())
    deps = manifest["artifacts"]["RayTrain-dev-Cluster"]["dependencies"]
    assert "RayTrain-dev-Network" in deps


def _imports(value) -> list[str]:
    if isinstance(value, dict):
        found = [value["Fn::ImportValue"]] if isinstance(value.get("Fn::ImportValue"), str) else []
        return found + [n for v in value.values() for n in _imports(v)]
    if isinstance(value, list):
        return [n for v in value for n in _imports(v)]
    return []


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_removing_the_job_drain_changes_no_other_stacks_exports(synthesized, env):
    """Every value the drain imports is either a named export its producer always makes or an
    automatic one that another consumer keeps: removing or moving the drain later leaves the
    Cluster and Network stacks' exports as they are (an automatic export whose last consumer goes
    is deleted with the producer's update, which CloudFormation refuses while the deployed
    Workload stack imports it)."""
    templates = synthesized[env].templates()
    prefix = synthesized[env].settings.stack_prefix
    exports = {
        out["Export"]["Name"]
        for t in templates.values() for out in t.get("Outputs", {}).values() if "Export" in out
    }  # fmt: skip
    workload = templates[f"{prefix}-Workload"]["Resources"]
    drain = {i for i in workload if i.startswith("SubmittedJobDrain")}
    assert drain, "the drain's resources were not found"
    elsewhere = [
        name
        for stack, t in templates.items()
        for i, r in t["Resources"].items()
        if not (stack == f"{prefix}-Workload" and i in drain)
        for name in _imports(r)
    ]
    for name in {n for i in drain for n in _imports(workload[i])}:
        assert name in exports, name
        automatic = ":ExportsOutput" in name
        assert not automatic or name in elsewhere, f"{name}: an automatic export only the drain uses"
    # The named export the drain uses now: the cluster's security group.
    assert f"{prefix}-ClusterSecurityGroupId" in {n for i in drain for n in _imports(workload[i])}
    # ... and the automatic one deployed Workload stacks still import, kept for this version's
    # deploy (the Cluster stack is updated first): its name as CDK made it.
    assert f"{prefix}-Cluster:ExportsOutputFnGetAttClusterEB0386A7ClusterSecurityGroupIdC1CF079A" in exports


def test_prod_retains_state_and_is_protected(synthesized):
    manifest = json.loads((synthesized["prod"].directory / "manifest.json").read_text())
    for name in ("RayTrain-prod-Network", "RayTrain-prod-Cluster"):
        assert manifest["artifacts"][name]["properties"]["terminationProtection"] is True
    # The secrets key and the control-plane log group's key; the flow-log group and its key.
    for stack, types in (
        ("Cluster", ("AWS::KMS::Key",)),
        ("Network", ("AWS::KMS::Key", "AWS::Logs::LogGroup")),
    ):
        resources = synthesized["prod"].template(stack)["Resources"].values()
        kept = [r for r in resources if r["Type"] in types]
        assert len(kept) >= len(types)
        assert all(r["DeletionPolicy"] == "Retain" for r in kept), stack


def test_dev_removes_state(synthesized):
    manifest = json.loads((synthesized["dev"].directory / "manifest.json").read_text())
    assert not manifest["artifacts"]["RayTrain-dev-Cluster"]["properties"].get("terminationProtection")
    keys = [
        r
        for r in synthesized["dev"].template("Cluster")["Resources"].values()
        if r["Type"] == "AWS::KMS::Key"
    ]
    assert len(keys) == 2
    assert all(key["DeletionPolicy"] == "Delete" for key in keys)


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_tags_from_settings(synthesized, env):
    """Every tag of the environment file, and `environment`, on every resource that takes a tag
    list, in every stack (cdk.Tags on the app: stacks/environment.py)."""
    s = synthesized[env].settings
    from_file = YAML(typ="safe", pure=True).load(environment_file(env).read_text())["tags"]
    assert from_file and s.tags == from_file
    expected = {"environment": s.name, **from_file}
    tagged = 0
    for stack, template in synthesized[env].templates().items():
        for logical_id, resource in template["Resources"].items():
            tags = resource.get("Properties", {}).get("Tags")
            if isinstance(tags, list) and all(isinstance(t, dict) and "Key" in t for t in tags):
                have = {t["Key"]: t["Value"] for t in tags}
                assert expected.items() <= have.items(), f"{stack}/{logical_id} ({resource['Type']})"
                tagged += 1
    assert tagged >= 10

"""Security gates CI enforces: cdk-nag, cfn-lint, and our own checks where cdk-nag cannot see
(aws_eks_v2 clusters and launch templates attached to EKS node groups)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENVS = ["dev", "prod", "p5"]


def report(synthesized, env) -> dict:
    return json.loads((synthesized[env].directory / "validation-report.json").read_text())


def acknowledgements(synthesized, env) -> dict[str, dict[str, str]]:
    """construct path -> {rule id: reason}, from the assembly's metadata (cdk-nag 3 records them there)."""
    found: dict[str, dict[str, str]] = {}
    for path in synthesized[env].directory.glob("*.metadata.json"):
        for construct, entries in json.loads(path.read_text()).items():
            for entry in entries:
                if entry["type"] == "aws:cdk:acknowledged-rules":
                    found.setdefault(construct, {}).update(entry["data"])
    return found


def test_cdk_nag_gate_fails_synthesis_on_a_new_finding(tmp_path):
    """The AwsSolutions pack is attached to the app: an unacknowledged finding stops synthesis
    (so every environment that synthesizes has zero unacknowledged findings)."""
    from aws_cdk import aws_sqs as sqs

    from config.loader import load_settings
    from stacks.environment import build_environment, new_app

    settings = load_settings("dev")
    app = new_app(settings, outdir=str(tmp_path))
    stacks = build_environment(app, settings)
    sqs.Queue(stacks.network, "UnencryptedQueueWithoutDlq")
    with pytest.raises(RuntimeError, match="AwsSolutions-SQS4"):
        app.synth()


@pytest.mark.parametrize("env", ENVS)
def test_cdk_nag_acknowledgements_are_scoped_and_explained(synthesized, env):
    nag = {
        path: rules
        for path, rules in acknowledgements(synthesized, env).items()
        for rule in rules
        if "AwsSolutions" in rule
    }
    assert nag, "expected the documented acknowledgements"
    stack = f"/RayTrain-{env}-Cluster/"
    allowed = (
        stack + "Cluster/Role",
        stack + "Cluster/KubectlProvider",
        "/Nodegroup/NodeGroupRole",
        # The CloudWatch observability add-on's Pod Identity role (CloudWatchAgentServerPolicy).
        stack + "ContainerInsights/AgentRole",
        f"/RayTrain-{env}-Workload/RayPodRole/DefaultPolicy",
        # What `raytrain job submit` may do: put and read code/<sha256>.zip in the checkpoint bucket.
        f"/RayTrain-{env}-Workload/JobSubmitterPolicy",
        # Cluster Autoscaler: Describe calls on *, scaling limited to this cluster's groups by tag.
        stack + "ClusterAutoscaler/Role/DefaultPolicy",
        # Pull-through cache: the nodes may create and fill repositories under the cache prefix only.
        stack + "ImageCache/FillFromNodes",
        # The digest-pinned image's warm at deploy: GetAuthorizationToken on *, pulls under the prefix.
        stack + "RayImageWarm/Role/DefaultPolicy",
        # EKS-leftovers cleanup: Describe calls on *, deletes scoped by VPC / ownership-tag conditions.
        f"/RayTrain-{env}-Network/EksLeftoverCleanup/Role/DefaultPolicy",
        # Each team's Ray pods' role (RayPodRole<Team>): its checkpoint prefix, the code, inputs.
        f"/RayTrain-{env}-Workload/RayPodRole",
        # Submitted-jobs drain: its own log group's streams; the AWS managed VPC-access policy.
        f"/RayTrain-{env}-Workload/SubmittedJobDrain/Policy",
        f"/RayTrain-{env}-Workload/SubmittedJobDrain/Role",
        # CDK Pipelines' generated roles (prod hosts the pipeline) and the post-deploy steps' role.
        f"/RayTrain-{env}-Pipeline/Pipeline/Pipeline/Role/DefaultPolicy",
        f"/RayTrain-{env}-Pipeline/Pipeline/Pipeline/Build/Synth/CdkBuildProject/Role/DefaultPolicy",
        f"/RayTrain-{env}-Pipeline/Pipeline/Pipeline/Source/",
        f"/RayTrain-{env}-Pipeline/Pipeline/UpdatePipeline/SelfMutation/Role/DefaultPolicy",
        f"/RayTrain-{env}-Pipeline/Pipeline/Assets/FileRole/DefaultPolicy",
        f"/RayTrain-{env}-Pipeline/Pipeline/PipelinesSecurityCheck/",
        f"/RayTrain-{env}-Pipeline/Pipeline/Deploy-",
        f"/RayTrain-{env}-Pipeline/StepsRole/DefaultPolicy",
    )
    for path, rules in nag.items():
        # Never the whole stack or app: each acknowledgement sits on the construct it concerns.
        assert any(a in path for a in allowed), path
        for rule, reason in rules.items():
            if "AwsSolutions" in rule:
                assert len(reason) > 40, (path, rule)


@pytest.mark.parametrize("env", ENVS)
def test_every_launch_template_requires_imdsv2_and_encrypts_root(synthesized, env):
    templates = synthesized[env].templates()
    launch_templates = [
        r
        for t in templates.values()
        for r in t["Resources"].values()
        if r["Type"] == "AWS::EC2::LaunchTemplate"
    ]
    assert len(launch_templates) == 2
    for lt in launch_templates:
        data = lt["Properties"]["LaunchTemplateData"]
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
        assert data["BlockDeviceMappings"], "root volume must be declared"
        for mapping in data["BlockDeviceMappings"]:
            assert mapping["Ebs"]["Encrypted"] is True
            assert mapping["Ebs"]["VolumeType"] == "gp3"


@pytest.mark.parametrize("env", ENVS)
def test_nodes_private_and_without_remote_access(synthesized, env):
    cluster = synthesized[env].template("Cluster")
    for resource in cluster["Resources"].values():
        if resource["Type"] != "AWS::EKS::Nodegroup":
            continue
        props = resource["Properties"]
        assert "RemoteAccess" not in props
        for subnet in props["Subnets"]:
            assert "PrivateSubnet" in subnet["Fn::ImportValue"], subnet
    # The cluster's own ENIs sit in private subnets too.
    eks = next(r for r in cluster["Resources"].values() if r["Type"] == "AWS::EKS::Cluster")
    for subnet in eks["Properties"]["ResourcesVpcConfig"]["SubnetIds"]:
        assert "PrivateSubnet" in subnet["Fn::ImportValue"]


@pytest.mark.parametrize("env", ENVS)
def test_endpoint_not_open_to_world_unless_configured(synthesized, env):
    s = synthesized[env].settings
    eks = next(
        r
        for r in synthesized[env].template("Cluster")["Resources"].values()
        if r["Type"] == "AWS::EKS::Cluster"
    )
    cidrs = eks["Properties"]["ResourcesVpcConfig"].get("PublicAccessCidrs", [])
    if "0.0.0.0/0" not in s.cluster.public_access_cidrs:
        assert "0.0.0.0/0" not in cidrs
    assert cidrs == s.cluster.public_access_cidrs


@pytest.mark.parametrize("env", ENVS)
def test_efa_security_group_rules_are_self_references_only(synthesized, env):
    t = synthesized[env].template("Cluster")
    resources = t["Resources"]
    efa_id = next(
        k
        for k, r in resources.items()
        if r["Type"] == "AWS::EC2::SecurityGroup" and "EFA" in r["Properties"]["GroupDescription"]
    )
    efa = resources[efa_id]["Properties"]
    assert "SecurityGroupIngress" not in efa
    # No inline rules: no CIDR egress (allow_all_outbound=False); the self-rules are separate resources.
    assert "SecurityGroupEgress" not in efa
    rules = {"ingress": [], "egress": []}
    for r in resources.values():
        if r["Type"] == "AWS::EC2::SecurityGroupIngress" and json.dumps(r["Properties"]["GroupId"]).count(
            efa_id
        ):
            rules["ingress"].append(r["Properties"])
        if r["Type"] == "AWS::EC2::SecurityGroupEgress" and json.dumps(r["Properties"]["GroupId"]).count(
            efa_id
        ):
            rules["egress"].append(r["Properties"])
    assert len(rules["ingress"]) == 1 and len(rules["egress"]) == 1
    (ingress,), (egress,) = rules["ingress"], rules["egress"]
    assert ingress["IpProtocol"] == "-1" and egress["IpProtocol"] == "-1"
    assert ingress["SourceSecurityGroupId"] == {"Fn::GetAtt": [efa_id, "GroupId"]}
    assert egress["DestinationSecurityGroupId"] == {"Fn::GetAtt": [efa_id, "GroupId"]}
    for props in (ingress, egress):
        assert "CidrIp" not in props and "CidrIpv6" not in props


def test_cfn_lint_clean_on_every_template(synthesized):
    templates = sorted(str(p) for s in synthesized.values() for p in s.directory.glob("*.template.json"))
    assert templates
    # Nested stacks are separate *.template.json files in the assembly, so the glob covers them.
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("cfn-lint")),
            "--config-file",
            str(ROOT / ".cfnlintrc.yaml"),
            *templates,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr

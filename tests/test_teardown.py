"""Destroy: dependency edges that make `cdk destroy` orderly, the EKS-leftovers cleanup (handler against
moto, placement in the Network stack), and what each environment keeps."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from cdk_constructs.vpc_cleanup import RESOURCE_TYPE
from cdk_constructs.vpc_cleanup_handler import handler

REGION = "us-west-2"
CLUSTER = "ray-train-dev"
ENVS = ["dev", "prod"]


# ---------------------------------------------------------------- handler, against moto


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(key, "testing")
    with mock_aws():
        yield boto3.session.Session(region_name=REGION)


def _leftovers(session, cluster: str = CLUSTER) -> dict:
    """A VPC as EKS leaves it after the cluster is deleted, plus look-alikes that must stay."""
    ec2 = session.client("ec2")
    elbv2 = session.client("elbv2")
    elb = session.client("elb")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    other_vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=f"{REGION}{az}")["Subnet"][
            "SubnetId"
        ]
        for i, az in enumerate("ab")
    ]
    other_subnet = ec2.create_subnet(VpcId=other_vpc, CidrBlock="10.1.0.0/24")["Subnet"]["SubnetId"]

    def group(name: str, vpc_id: str = vpc, tags: dict | None = None) -> str:
        spec = [
            {
                "ResourceType": "security-group",
                "Tags": [{"Key": k, "Value": v} for k, v in (tags or {}).items()],
            }
        ]
        return ec2.create_security_group(
            GroupName=name, Description=name, VpcId=vpc_id, **({"TagSpecifications": spec} if tags else {})
        )["GroupId"]

    cluster_sg = group(f"eks-cluster-sg-{cluster}-123456789", tags={"aws:eks:cluster-name": cluster})
    elb_sg = group("k8s-elb-a1b2c3", tags={f"kubernetes.io/cluster/{cluster}": "owned"})
    lbc_sg = group("k8s-ray-ingress-1a2b", tags={"elbv2.k8s.aws/cluster": cluster})
    keep_sg = group("endpoints")  # ours, CloudFormation-managed: must stay
    other_cluster_sg = group("eks-cluster-sg-another-1", tags={"kubernetes.io/cluster/another": "owned"})
    # The cluster SG admits the ELB SG (mutual references block deletion until revoked) ...
    ec2.authorize_security_group_ingress(
        GroupId=cluster_sg,
        IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": elb_sg}]}],
    )
    # ... and a group we keep references the cluster SG.
    ec2.authorize_security_group_ingress(
        GroupId=keep_sg,
        IpPermissions=[
            {
                "IpProtocol": "tcp",
                "FromPort": 443,
                "ToPort": 443,
                "UserIdGroupPairs": [{"GroupId": cluster_sg}],
            }
        ],
    )

    def eni(subnet: str, description: str, groups: list[str] | None = None, tags: dict | None = None) -> str:
        kwargs: dict = {"SubnetId": subnet, "Description": description}
        if groups:
            kwargs["Groups"] = groups
        if tags:
            kwargs["TagSpecifications"] = [
                {
                    "ResourceType": "network-interface",
                    "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
                }
            ]
        return ec2.create_network_interface(**kwargs)["NetworkInterface"]["NetworkInterfaceId"]

    cni_eni = eni(subnets[0], "aws-K8S-i-0123456789abcdef0", tags={"cluster.k8s.amazonaws.com/name": cluster})
    eks_eni = eni(subnets[1], f"Amazon EKS {cluster}", groups=[cluster_sg])
    sg_eni = eni(subnets[0], "left by a node", groups=[elb_sg])
    keep_eni = eni(subnets[0], "someone else's", groups=[keep_sg])
    other_vpc_eni = eni(other_subnet, "aws-K8S-i-0fedcba9876543210")

    def lb(name: str, tags: dict, subnet_ids: list[str], groups: list[str]) -> str:
        return elbv2.create_load_balancer(
            Name=name,
            Subnets=subnet_ids,
            SecurityGroups=groups,
            Scheme="internal",
            Tags=[{"Key": k, "Value": v} for k, v in tags.items()],
        )["LoadBalancers"][0]["LoadBalancerArn"]

    owned_lb = lb("k8s-ray-dashboard", {"elbv2.k8s.aws/cluster": cluster}, subnets, [lbc_sg])
    intree_lb = lb("a1b2c3", {f"kubernetes.io/cluster/{cluster}": "owned"}, subnets, [elb_sg])
    keep_lb = lb("ours", {"team": "platform"}, subnets, [keep_sg])
    tg = elbv2.create_target_group(
        Name="k8s-ray-tg",
        Protocol="TCP",
        Port=8265,
        VpcId=vpc,
        Tags=[{"Key": "elbv2.k8s.aws/cluster", "Value": cluster}],
    )["TargetGroups"][0]["TargetGroupArn"]
    keep_tg = elbv2.create_target_group(Name="ours", Protocol="TCP", Port=80, VpcId=vpc)["TargetGroups"][0][
        "TargetGroupArn"
    ]
    elb.create_load_balancer(
        LoadBalancerName="a9f8e7",
        Listeners=[{"Protocol": "TCP", "LoadBalancerPort": 80, "InstancePort": 30080}],
        Subnets=subnets[:1],
        Tags=[{"Key": f"kubernetes.io/cluster/{cluster}", "Value": "owned"}],
    )
    elb.create_load_balancer(
        LoadBalancerName="keep-classic",
        Listeners=[{"Protocol": "TCP", "LoadBalancerPort": 80, "InstancePort": 30081}],
        Subnets=subnets[:1],
    )
    return {
        "vpc": vpc,
        "keep_sg": keep_sg,
        "gone": {
            "groups": {cluster_sg, elb_sg, lbc_sg},
            "enis": {cni_eni, eks_eni, sg_eni},
            "lbs": {owned_lb, intree_lb},
            "tgs": {tg},
            "classic": {"a9f8e7"},
        },
        "kept": {
            "groups": {keep_sg, other_cluster_sg},
            "enis": {keep_eni, other_vpc_eni},
            "lbs": {keep_lb},
            "tgs": {keep_tg},
            "classic": {"keep-classic"},
        },
    }


def _present(session) -> dict:
    ec2, elbv2, elb = (session.client(n) for n in ("ec2", "elbv2", "elb"))
    return {
        "groups": {g["GroupId"] for g in ec2.describe_security_groups()["SecurityGroups"]},
        "enis": {e["NetworkInterfaceId"] for e in ec2.describe_network_interfaces()["NetworkInterfaces"]},
        "lbs": {lb["LoadBalancerArn"] for lb in elbv2.describe_load_balancers()["LoadBalancers"]},
        "tgs": {tg["TargetGroupArn"] for tg in elbv2.describe_target_groups()["TargetGroups"]},
        "classic": {
            lb["LoadBalancerName"] for lb in elb.describe_load_balancers()["LoadBalancerDescriptions"]
        },
    }


def test_cleanup_removes_what_the_cluster_left_and_nothing_else(aws):
    world = _leftovers(aws)
    report = handler.cleanup(world["vpc"], CLUSTER, session=aws, seconds=5, sleep=lambda s: None)
    present = _present(aws)
    for kind in world["gone"]:
        assert not world["gone"][kind] & present[kind], kind
        assert world["kept"][kind] <= present[kind], kind
    assert set(report.security_groups) == world["gone"]["groups"]
    assert set(report.network_interfaces) == world["gone"]["enis"]
    assert report.remaining == []
    # The rule our group had on the cluster SG was revoked (it would have blocked the delete).
    ec2 = aws.client("ec2")
    keep_sg = world["keep_sg"]
    rules = ec2.describe_security_groups(GroupIds=[keep_sg])["SecurityGroups"][0]["IpPermissions"]
    assert all(not r.get("UserIdGroupPairs") for r in rules)


def _event(request_type: str, vpc: str) -> dict:
    return {
        "RequestType": request_type,
        "ResponseURL": "https://cloudformation-custom-resource-response.example/",
        "StackId": "arn:aws:cloudformation:us-west-2:111122223333:stack/RayTrain-dev-Network/1",
        "RequestId": "r-1",
        "LogicalResourceId": "EksLeftoverCleanup",
        "ResourceType": RESOURCE_TYPE,
        "ResourceProperties": {"VpcId": vpc, "ClusterName": CLUSTER},
        **({"PhysicalResourceId": f"eks-vpc-cleanup-{CLUSTER}"} if request_type != "Create" else {}),
    }


@pytest.mark.parametrize("request_type", ["Create", "Update"])
def test_create_and_update_touch_nothing(aws, request_type):
    world = _leftovers(aws)
    before = _present(aws)
    sent = []
    context = SimpleNamespace(get_remaining_time_in_millis=lambda: 900_000)
    handler.on_event(_event(request_type, world["vpc"]), context, send=lambda *a: sent.append(a))
    assert _present(aws) == before
    ((_, status, _, physical_id),) = sent
    assert status == "SUCCESS" and physical_id == f"eks-vpc-cleanup-{CLUSTER}"


def test_delete_event_cleans_up_and_answers_success(aws, monkeypatch):
    world = _leftovers(aws)
    # The handler builds its own clients from the default session (moto's, here).
    monkeypatch.setattr(handler, "RESPONSE_MARGIN_SECONDS", 0)
    sent = []
    context = SimpleNamespace(get_remaining_time_in_millis=lambda: 3_000)
    handler.on_event(_event("Delete", world["vpc"]), context, send=lambda *a: sent.append(a))
    ((_, status, reason, _),) = sent
    assert status == "SUCCESS", reason
    assert "3 security groups" in reason and "2 load balancers" in reason
    assert not world["gone"]["groups"] & _present(aws)["groups"]


def test_delete_that_cannot_finish_fails_so_a_retry_runs_it_again(aws, monkeypatch):
    world = _leftovers(aws)
    ec2 = aws.client("ec2")
    cluster_sg = next(g for g in world["gone"]["groups"] if "eks-cluster-sg" in _group_name(ec2, g))
    real_delete = ec2.delete_security_group
    attempts = []

    def still_in_use(GroupId):  # an ENI still detaching from a terminated node holds the group
        if GroupId == cluster_sg:
            attempts.append(GroupId)
            raise ClientError(
                {"Error": {"Code": "DependencyViolation", "Message": "in use"}}, "DeleteSecurityGroup"
            )
        return real_delete(GroupId=GroupId)

    monkeypatch.setattr(ec2, "delete_security_group", still_in_use)
    session = SimpleNamespace(client=lambda name: ec2 if name == "ec2" else aws.client(name))
    # A deadline of seconds, not a fraction: under load one pass over moto took longer than 0.5 s.
    report = handler.cleanup(world["vpc"], CLUSTER, session=session, seconds=3, sleep=lambda s: None)
    assert report.remaining == [cluster_sg]
    assert len(attempts) >= 2  # retried until the deadline, not given up at once
    assert world["gone"]["groups"] - {cluster_sg} <= set(report.security_groups)

    # FAILED keeps the custom resource, so the next delete attempt runs the cleanup again.
    monkeypatch.setattr(handler, "cleanup", lambda *a, **k: report)
    sent = []
    context = SimpleNamespace(get_remaining_time_in_millis=lambda: 900_000)
    handler.on_event(_event("Delete", world["vpc"]), context, send=lambda *a: sent.append(a))
    ((_, status, reason, _),) = sent
    assert status == "FAILED" and cluster_sg in reason


def _group_name(ec2, group_id: str) -> str:
    return ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"][0]["GroupName"]


# ---------------------------------------------------------------- templates


def _resources(template: dict, type_name: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_name}


@pytest.mark.parametrize("env", ENVS)
def test_cleanup_runs_before_any_vpc_resource_is_deleted(synthesized, env):
    t = synthesized[env].template("Network")
    ((_, cleanup),) = _resources(t, RESOURCE_TYPE).items()
    depends = set(cleanup["DependsOn"])
    # CloudFormation deletes a resource before what it depends on: every VPC resource outlives it.
    for type_name in (
        "AWS::EC2::VPC",
        "AWS::EC2::Subnet",
        "AWS::EC2::InternetGateway",
        "AWS::EC2::VPCGatewayAttachment",
        "AWS::EC2::NatGateway",
        "AWS::EC2::VPCEndpoint",
        "AWS::EC2::RouteTable",
    ):
        assert set(_resources(t, type_name)) <= depends, type_name
    props = cleanup["Properties"]
    assert props["ClusterName"] == synthesized[env].settings.cluster.name
    assert props["VpcId"] == {"Ref": next(iter(_resources(t, "AWS::EC2::VPC")))}
    # The function, its role and its log group outlive the custom resource (they are its dependencies).
    function_id = props["ServiceToken"]["Fn::GetAtt"][0]
    function = t["Resources"][function_id]
    assert function["Properties"]["Runtime"].startswith("python3")
    role_policy = next(
        r
        for r in _resources(t, "AWS::IAM::Policy").values()
        if function["Properties"]["Role"]["Fn::GetAtt"][0] in json.dumps(r["Properties"]["Roles"])
    )
    statements = role_policy["Properties"]["PolicyDocument"]["Statement"]
    deletes = [s for s in statements if any("Delete" in a for a in _list(s["Action"]))]
    assert deletes and all("Condition" in s for s in deletes)


def _list(value):
    return value if isinstance(value, list) else [value]


@pytest.mark.parametrize("env", ENVS)
def test_node_groups_deleted_before_the_cluster(synthesized, env):
    t = synthesized[env].template("Cluster")
    ((cluster_id, _),) = _resources(t, "AWS::EKS::Cluster").items()
    for group in _resources(t, "AWS::EKS::Nodegroup").values():
        # ClusterName references the cluster: CloudFormation deletes the group first.
        assert group["Properties"]["ClusterName"] == {"Ref": cluster_id}


STATEFUL = ("AWS::S3::Bucket", "AWS::KMS::Key", "AWS::Logs::LogGroup")


@pytest.mark.parametrize(("env", "policy"), [("dev", "Delete"), ("prod", "Retain")])
def test_every_stateful_resource_follows_the_environment(synthesized, env, policy):
    """All stacks (the pipeline's too): dev removes every bucket, key and log group (buckets emptied
    first); prod keeps them and protects every stack from deletion."""
    manifest = json.loads((synthesized[env].directory / "manifest.json").read_text())
    for name, template in synthesized[env].templates().items():
        stateful = {k: r for t in STATEFUL for k, r in _resources(template, t).items()}
        for logical_id, resource in stateful.items():
            assert resource.get("DeletionPolicy") == policy, (name, logical_id)
        buckets = _resources(template, "AWS::S3::Bucket")
        emptied = {
            r["Properties"]["BucketName"]["Ref"]
            for r in _resources(template, "Custom::S3AutoDeleteObjects").values()
        }
        assert emptied == (set(buckets) if policy == "Delete" else set()), name
        protected = manifest["artifacts"][name]["properties"].get("terminationProtection", False)
        assert protected is (policy == "Retain"), name


@pytest.mark.parametrize("env", ENVS)
def test_control_plane_log_group_is_cloudformations(synthesized, env):
    """EKS would create /aws/eks/<name>/cluster itself (outside CloudFormation, never deleted); the
    Cluster stack creates it first so destroy treats it like the other logs."""
    t = synthesized[env].template("Cluster")
    name = f"/aws/eks/{synthesized[env].settings.cluster.name}/cluster"
    ((group_id, _),) = [
        (k, r)
        for k, r in _resources(t, "AWS::Logs::LogGroup").items()
        if r["Properties"]["LogGroupName"] == name
    ]
    (cluster,) = _resources(t, "AWS::EKS::Cluster").values()
    assert group_id in cluster["DependsOn"]


def _depends_on(template: dict, logical_id: str) -> set[str]:
    """Every resource `logical_id` depends on, directly or not: DependsOn, Ref and Fn::GetAtt edges
    (CloudFormation deletes a resource before everything it depends on)."""

    def edges(value) -> set[str]:
        if isinstance(value, dict):
            found = set()
            for key, inner in value.items():
                if key == "Ref" and isinstance(inner, str):
                    found.add(inner)
                elif key == "Fn::GetAtt":
                    found.add(inner[0] if isinstance(inner, list) else inner.split(".")[0])
                else:
                    found |= edges(inner)
            return found
        if isinstance(value, list):
            return set().union(*(edges(v) for v in value)) if value else set()
        return set()

    resources = template["Resources"]
    seen: set[str] = set()
    todo = [logical_id]
    while todo:
        resource = resources[todo.pop()]
        direct = set(_list(resource.get("DependsOn", []))) | edges(resource.get("Properties", {}))
        for dep in direct & set(resources) - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


@pytest.mark.parametrize("env", ENVS)
def test_ray_workload_is_deleted_before_the_checkpoint_bucket_is_emptied(synthesized, env):
    """Destroy while a job writes checkpoints: the RayJob (its Ray cluster with it) and the
    manifest holding the standing cluster and the service account must be gone before the
    auto-delete handler empties the checkpoint bucket, or a late checkpoint leaves the bucket
    non-empty and the destroy fails. Retained buckets (prod) are never emptied."""
    t = synthesized[env].template("Workload")
    ((bucket_id, _),) = [
        (k, r) for k, r in _resources(t, "AWS::S3::Bucket").items() if "ckpt" in json.dumps(r["Properties"])
    ]
    emptying = [
        k
        for k, r in _resources(t, "Custom::S3AutoDeleteObjects").items()
        if r["Properties"]["BucketName"] == {"Ref": bucket_id}
    ]
    manifests = _resources(t, "Custom::AWSCDK-EKS-KubernetesResource")
    kinds = {
        k: set(re.findall(r'"kind":"(\w+)"', json.dumps(r["Properties"]["Manifest"]).replace('\\"', '"')))
        for k, r in manifests.items()
    }
    # A deploy renders a RayJob only where job.deploy asks (dev's smoke job; prod submits).
    assert any("RayJob" in v for v in kinds.values()) is synthesized[env].settings.job.deploy, kinds
    if synthesized[env].settings.storage.removal_policy == "retain":
        assert emptying == []
        return
    (emptying_id,) = emptying
    for logical_id in manifests:
        assert emptying_id in _depends_on(t, logical_id), (logical_id, kinds[logical_id])
    # ... and the emptying itself does not wait for the workload (no cycle, order as intended).
    assert not set(manifests) & _depends_on(t, emptying_id)

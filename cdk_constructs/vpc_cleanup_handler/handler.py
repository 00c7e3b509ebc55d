"""Custom resource handler: on delete, remove what EKS and Kubernetes left in the VPC outside
CloudFormation, so that the VPC (and its subnets and internet gateway) can be deleted.

Left behind after the cluster is deleted, and each able to block the VPC's deletion:
- load balancers made for `Service type: LoadBalancer` / Ingress (ELBv2 by the AWS Load Balancer
  Controller, tagged `elbv2.k8s.aws/cluster`; Classic/NLB by the in-tree controller, tagged
  `kubernetes.io/cluster/<name>`), their target groups, and the ENIs they hold;
- security groups: EKS's cluster security group `eks-cluster-sg-<name>-*` (usually removed with the
  cluster, not always), `k8s-elb-*` / controller-made groups tagged for the cluster;
- ENIs left `available` by the VPC CNI (tagged `cluster.k8s.amazonaws.com/name`, described
  `aws-K8S-…`) or by EKS (`Amazon EKS <name>`), or still carrying one of the groups above.

Create and update do nothing. Runs as a Lambda function (stdlib + boto3, and cdk_constructs/cfn_response.py
bundled beside it); tests call `cleanup` and `on_event` against moto.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.exceptions import ClientError

from cdk_constructs import cfn_response

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)

ELBV2_CLUSTER_TAG = "elbv2.k8s.aws/cluster"
CNI_CLUSTER_TAG = "cluster.k8s.amazonaws.com/name"
# Leave this much of the Lambda's time to answer CloudFormation.
RESPONSE_MARGIN_SECONDS = 30


def cluster_tag(cluster_name: str) -> str:
    return f"kubernetes.io/cluster/{cluster_name}"


@dataclass
class Report:
    load_balancers: list[str] = field(default_factory=list)
    classic_load_balancers: list[str] = field(default_factory=list)
    target_groups: list[str] = field(default_factory=list)
    network_interfaces: list[str] = field(default_factory=list)
    security_groups: list[str] = field(default_factory=list)
    remaining: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [
            f"{len(self.load_balancers)} load balancers",
            f"{len(self.classic_load_balancers)} classic load balancers",
            f"{len(self.target_groups)} target groups",
            f"{len(self.network_interfaces)} ENIs",
            f"{len(self.security_groups)} security groups",
        ]
        text = "removed " + ", ".join(parts)
        if self.remaining:
            text += "; still present: " + ", ".join(self.remaining)
        return text


def _owned(tags: dict[str, str], cluster_name: str) -> bool:
    return tags.get(ELBV2_CLUSTER_TAG) == cluster_name or cluster_tag(cluster_name) in tags


def _tags(items: Iterable[dict[str, str]] | None) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in items or []}


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _elbv2_owned(elbv2: Any, arns: list[str], cluster_name: str) -> list[str]:
    owned = []
    for chunk in _chunks(arns, 20):  # DescribeTags takes at most 20 ARNs
        for desc in elbv2.describe_tags(ResourceArns=chunk)["TagDescriptions"]:
            if _owned(_tags(desc.get("Tags")), cluster_name):
                owned.append(desc["ResourceArn"])
    return owned


def delete_load_balancers(elbv2: Any, vpc_id: str, cluster_name: str, report: Report) -> None:
    arns = [
        lb["LoadBalancerArn"]
        for page in elbv2.get_paginator("describe_load_balancers").paginate()
        for lb in page["LoadBalancers"]
        if lb.get("VpcId") == vpc_id
    ]
    for arn in _elbv2_owned(elbv2, arns, cluster_name):
        # The controller can turn deletion protection on through an annotation.
        elbv2.modify_load_balancer_attributes(
            LoadBalancerArn=arn, Attributes=[{"Key": "deletion_protection.enabled", "Value": "false"}]
        )
        elbv2.delete_load_balancer(LoadBalancerArn=arn)
        report.load_balancers.append(arn)


def delete_target_groups(elbv2: Any, vpc_id: str, cluster_name: str, report: Report) -> None:
    arns = [
        tg["TargetGroupArn"]
        for page in elbv2.get_paginator("describe_target_groups").paginate()
        for tg in page["TargetGroups"]
        if tg.get("VpcId") == vpc_id
    ]
    for arn in _elbv2_owned(elbv2, arns, cluster_name):
        elbv2.delete_target_group(TargetGroupArn=arn)
        report.target_groups.append(arn)


def delete_classic_load_balancers(elb: Any, vpc_id: str, cluster_name: str, report: Report) -> None:
    names = [
        lb["LoadBalancerName"]
        for page in elb.get_paginator("describe_load_balancers").paginate()
        for lb in page["LoadBalancerDescriptions"]
        if lb.get("VPCId") == vpc_id
    ]
    for chunk in _chunks(names, 20):
        for desc in elb.describe_tags(LoadBalancerNames=chunk)["TagDescriptions"]:
            if _owned(_tags(desc.get("Tags")), cluster_name):
                elb.delete_load_balancer(LoadBalancerName=desc["LoadBalancerName"])
                report.classic_load_balancers.append(desc["LoadBalancerName"])


def cluster_security_groups(ec2: Any, vpc_id: str, cluster_name: str) -> dict[str, dict[str, Any]]:
    """Security groups in the VPC that EKS or a Kubernetes controller made for this cluster."""
    vpc = {"Name": "vpc-id", "Values": [vpc_id]}
    queries = [
        [vpc, {"Name": "group-name", "Values": [f"eks-cluster-sg-{cluster_name}-*"]}],
        [vpc, {"Name": "tag-key", "Values": [cluster_tag(cluster_name)]}],
        [vpc, {"Name": f"tag:{ELBV2_CLUSTER_TAG}", "Values": [cluster_name]}],
    ]
    found: dict[str, dict[str, Any]] = {}
    for filters in queries:
        for page in ec2.get_paginator("describe_security_groups").paginate(Filters=filters):
            for group in page["SecurityGroups"]:
                if group["GroupName"] != "default":
                    found[group["GroupId"]] = group
    return found


def _eni_owned(eni: dict[str, Any], cluster_name: str, group_ids: set[str]) -> bool:
    description = eni.get("Description", "")
    return (
        _tags(eni.get("TagSet")).get(CNI_CLUSTER_TAG) == cluster_name
        or description.startswith("aws-K8S-")
        or description == f"Amazon EKS {cluster_name}"
        or any(g["GroupId"] in group_ids for g in eni.get("Groups", []))
    )


def _enis(ec2: Any, vpc_id: str, *extra: dict[str, Any]) -> list[dict[str, Any]]:
    filters = [{"Name": "vpc-id", "Values": [vpc_id]}, *extra]
    return [
        eni
        for page in ec2.get_paginator("describe_network_interfaces").paginate(Filters=filters)
        for eni in page["NetworkInterfaces"]
    ]


def wait_for_load_balancer_enis(
    ec2: Any, vpc_id: str, report: Report, deadline: float, sleep: Callable[[float], None]
) -> None:
    """Load balancers release their ENIs (and public IPs) some time after deletion; until then the
    subnets, security groups and internet gateway cannot go."""
    names = [arn.split(":loadbalancer/", 1)[1] for arn in report.load_balancers]  # app/x/id, net/x/id
    descriptions = [f"ELB {name}" for name in names + report.classic_load_balancers]
    while descriptions and time.monotonic() < deadline:
        pending = _enis(ec2, vpc_id, {"Name": "description", "Values": descriptions})
        if not pending:
            return
        LOG.info("waiting for %d load balancer ENIs to be released", len(pending))
        sleep(10)


def _revoke_references(ec2: Any, vpc_id: str, group_ids: set[str]) -> None:
    """Rules that reference a group (from itself or any other group in the VPC) block its deletion."""
    for page in ec2.get_paginator("describe_security_groups").paginate(
        Filters=[{"Name": "vpc-id", "Values": [vpc_id]}]
    ):
        for group in page["SecurityGroups"]:
            for key, revoke in (
                ("IpPermissions", ec2.revoke_security_group_ingress),
                ("IpPermissionsEgress", ec2.revoke_security_group_egress),
            ):
                rules = [
                    rule
                    for rule in group.get(key, [])
                    if group["GroupId"] in group_ids
                    or any(pair.get("GroupId") in group_ids for pair in rule.get("UserIdGroupPairs", []))
                ]
                if rules:
                    revoke(GroupId=group["GroupId"], IpPermissions=rules)


def delete_enis_and_groups(
    ec2: Any,
    vpc_id: str,
    cluster_name: str,
    report: Report,
    *,
    deadline: float,
    sleep: Callable[[float], None],
) -> None:
    groups = cluster_security_groups(ec2, vpc_id, cluster_name)
    group_ids = set(groups)
    if group_ids:
        _revoke_references(ec2, vpc_id, group_ids)
    pending_groups = dict(groups)
    while True:
        for eni in _enis(ec2, vpc_id, {"Name": "status", "Values": ["available"]}):
            eni_id = eni["NetworkInterfaceId"]
            if eni_id in report.network_interfaces or not _eni_owned(eni, cluster_name, group_ids):
                continue
            try:
                ec2.delete_network_interface(NetworkInterfaceId=eni_id)
                report.network_interfaces.append(eni_id)
            except ClientError as exc:  # detached meanwhile by its owner, or still in use
                LOG.info("ENI %s: %s", eni_id, exc)
        for group_id in list(pending_groups):
            try:
                ec2.delete_security_group(GroupId=group_id)
                report.security_groups.append(group_id)
                del pending_groups[group_id]
            except ClientError as exc:
                code = exc.response["Error"]["Code"]
                if code == "InvalidGroup.NotFound":
                    del pending_groups[group_id]
                elif code != "DependencyViolation":
                    raise
        if not pending_groups or time.monotonic() >= deadline:
            break
        # An ENI still attached (e.g. detaching from a terminated node) holds its groups; retry.
        sleep(15)
    report.remaining.extend(sorted(pending_groups))


def cleanup(
    vpc_id: str,
    cluster_name: str,
    *,
    session: Any = None,
    seconds: float = 600,
    sleep: Callable[[float], None] = time.sleep,
) -> Report:
    session = session or boto3.session.Session()
    ec2, elbv2, elb = (session.client(name) for name in ("ec2", "elbv2", "elb"))
    deadline = time.monotonic() + seconds
    report = Report()
    delete_load_balancers(elbv2, vpc_id, cluster_name, report)
    delete_classic_load_balancers(elb, vpc_id, cluster_name, report)
    delete_target_groups(elbv2, vpc_id, cluster_name, report)
    wait_for_load_balancer_enis(ec2, vpc_id, report, deadline, sleep)
    delete_enis_and_groups(ec2, vpc_id, cluster_name, report, deadline=deadline, sleep=sleep)
    LOG.info("vpc %s, cluster %s: %s", vpc_id, cluster_name, report.summary())
    return report


def on_event(event: dict[str, Any], context: Any, *, send: cfn_response.Send | None = None) -> None:
    """Lambda entry point (CloudFormation custom resource protocol: always answer the response URL)."""
    props = event.get("ResourceProperties", {})

    def act() -> tuple[str, str]:
        if event["RequestType"] != "Delete":
            return cfn_response.SUCCESS, "nothing to do"
        seconds = context.get_remaining_time_in_millis() / 1000 - RESPONSE_MARGIN_SECONDS
        report = cleanup(props["VpcId"], props["ClusterName"], seconds=seconds)
        # FAILED keeps this resource, so a retried delete runs the cleanup again.
        return (cfn_response.FAILED if report.remaining else cfn_response.SUCCESS), report.summary()

    default_id = f"eks-vpc-cleanup-{props.get('ClusterName', 'unknown')}"
    cfn_response.answer(event, default_id, act, what="cleanup", send=send)

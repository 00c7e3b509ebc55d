"""Cluster Autoscaler: GPU nodes from zero when a RayJob's workers are pending, and back to zero.

Why the Cluster Autoscaler and not Karpenter (README, "GPU nodes only while a job runs"): Karpenter
covers what the EFA group needs by now (EFA interfaces for pods requesting vpc.amazonaws.com/efa,
capacityReservationSelectorTerms, one subnet by selector, and since v1.11.0 of April 2026 a
placementGroupSelector), but it would replace the managed node group: a second definition of the
GPU nodes (EC2NodeClass + NodePool, its own AMI and interface choices) beside the launch template
that the tests pin, and a controller that launches instances itself (ec2:RunInstances/CreateFleet,
iam:PassRole, an interruption queue). With one instance type in one AZ, Karpenter's choice among
types and zones buys nothing. The Cluster Autoscaler only changes the desired size of the node
group's Auto Scaling group, so every node it starts comes from exactly that launch template.

How scale-from-zero works on AWS (cluster-autoscaler/cloudprovider/aws/README.md, "Auto-Discovery
Setup", tag cluster-autoscaler-1.35.2):
- Discovery: EKS tags the Auto Scaling group of every managed node group with
  `k8s.io/cluster-autoscaler/enabled` and `k8s.io/cluster-autoscaler/<cluster>` ("Nodes launched
  as part of a managed node group are automatically tagged for auto-discovery by the Kubernetes
  Cluster Autoscaler", EKS User Guide, managed-node-groups).
- With no node of a group running, the autoscaler builds the node it would get from the instance
  type (CPU, memory, GPUs) and from the group's `k8s.io/cluster-autoscaler/node-template/...`
  tags: labels (`label/<key>`), taints (`taint/<key>` = `value:effect`) and extended resources
  (`resources/<name>`). It can read labels and taints of a managed node group from
  eks:DescribeNodegroup, but only "when a managed nodegroup is created with 0 nodes and has never
  had any nodes added to it" (same README, "Minimal IAM Permissions Policy"): after the first job
  the tags are all it has. And nothing but a tag tells it about `vpc.amazonaws.com/efa`, which
  every worker pod requests.
- EKS does not put our labels, taints or resources on that group, and the node group's own
  `Tags` do not propagate to it ("Tags on the node group don't propagate to any other resources
  associated with the node group", EKS API CreateNodegroup; aws/containers-roadmap#608).
  `NodegroupAsgTags` below finds the group with eks:DescribeNodegroup and tags it.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import ArnFormat, CfnResource, Duration, Stack, Token
from aws_cdk import aws_eks as eks_l1
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import custom_resources as cr
from constructs import Construct

from cdk_constructs.nag import acknowledge, managed_policy_finding
from config.catalogue import Instance
from config.names import EFA_RESOURCE, GPU_RESOURCE, GPU_TAINT_KEY, GPU_TAINT_VALUE, SYSTEM_NODE_LABELS

REPOSITORY = "https://kubernetes.github.io/autoscaler"
CHART = "cluster-autoscaler"
NAMESPACE = "kube-system"
RELEASE = "cluster-autoscaler"
SERVICE_ACCOUNT = "cluster-autoscaler"
# The chart version is pinned in settings (addons.cluster_autoscaler); its values.yaml is in
# chart_values/ (tests check our keys against it): 9.59.0's is copied from kubernetes/autoscaler at
# tag cluster-autoscaler-chart-9.59.0 (commit 5a0b98e45f89).

# The autoscaler's minor must match the cluster's ("We recommend using Cluster Autoscaler with the
# Kubernetes control plane version for which it was meant", cluster-autoscaler/README.md). The
# chart (9.59.0, appVersion 1.35.0) takes the image tag as a value; these are the newest patch
# releases per minor (tags cluster-autoscaler-1.34.5, -1.35.2, -1.36.1 of kubernetes/autoscaler,
# 2026-07-22). The keys must be the Kubernetes versions the settings accept (a test checks).
IMAGE_TAGS: dict[str, str] = {
    "1.34": "v1.34.5",
    "1.35": "v1.35.2",
    "1.36": "v1.36.1",
}

NODE_TEMPLATE = "k8s.io/cluster-autoscaler/node-template"
# Scale-down timing. A GPU node without GPU pods is "unneeded"; it is removed after
# scale-down-unneeded-time (default 10m), but no sooner than scale-down-delay-after-add (default
# 10m) after the last scale-up. 5m each keeps the removal well inside 15 minutes of the job's Ray
# cluster going away (5m + drain + EC2 shutdown), and a short job does not hold its nodes for 10m.
SCALE_DOWN_UNNEEDED = "5m"
SCALE_DOWN_DELAY_AFTER_ADD = "5m"
# Allowance for the drain and the EC2 shutdown once a node is found unneeded (an estimate, not a
# setting): with it, how long a GPU node stays after its worker pod went (raytrain cost).
DRAIN_AND_SHUTDOWN_MINUTES = 5


def empty_gpu_node_minutes() -> int:
    """At most how long a GPU node is billed after its last GPU pod is deleted."""
    assert SCALE_DOWN_UNNEEDED.endswith("m")
    return int(SCALE_DOWN_UNNEEDED[:-1]) + DRAIN_AND_SHUTDOWN_MINUTES


def node_template_tags(instance: Instance, *, efa: bool, labels: dict[str, str]) -> dict[str, str]:
    """ASG tags describing a GPU node before one exists: labels, the GPU taint, GPUs and EFA."""
    tags = {f"{NODE_TEMPLATE}/label/{key}": value for key, value in sorted(labels.items())}
    tags[f"{NODE_TEMPLATE}/taint/{GPU_TAINT_KEY}"] = f"{GPU_TAINT_VALUE}:NoSchedule"
    tags[f"{NODE_TEMPLATE}/resources/{GPU_RESOURCE}"] = str(instance.gpus)
    if efa:
        tags[f"{NODE_TEMPLATE}/resources/{EFA_RESOURCE}"] = str(instance.efa_interfaces)
    return tags


def chart_values(
    *, cluster_name: str, region: str, kubernetes_version: str, image_repository: str | None = None
) -> dict[str, Any]:
    """Values of the cluster-autoscaler chart; every key exists in its values.yaml (tests).
    `image_repository`: the chart's registry.k8s.io image through the pull-through cache."""
    image = {"tag": IMAGE_TAGS[kubernetes_version]}
    if image_repository is not None:
        image["repository"] = image_repository
    return {
        "cloudProvider": "aws",
        "awsRegion": region,
        # --node-group-auto-discovery=asg:tag=k8s.io/cluster-autoscaler/enabled,
        # k8s.io/cluster-autoscaler/<cluster> (the chart's default autoDiscovery.tags).
        "autoDiscovery": {"clusterName": cluster_name},
        "image": image,
        # The Pod Identity association names this service account.
        "rbac": {"serviceAccount": {"create": True, "name": SERVICE_ACCOUNT}},
        "nodeSelector": dict(SYSTEM_NODE_LABELS),
        "extraArgs": {
            "scale-down-unneeded-time": SCALE_DOWN_UNNEEDED,
            "scale-down-delay-after-add": SCALE_DOWN_DELAY_AFTER_ADD,
            # Pick the group that wastes least when several could take a pod (system vs GPU).
            "expander": "least-waste",
        },
        "resources": {
            "requests": {"cpu": "100m", "memory": "300Mi"},
            "limits": {"memory": "600Mi"},
        },
        "containerSecurityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65534,
            "runAsGroup": 65534,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


class NodegroupAsgTags(Construct):
    """Tags the Auto Scaling group that EKS created for a managed node group.

    Two SDK calls through CDK's AwsCustomResource: eks:DescribeNodegroup gives the group's name
    (`nodegroup.resources.autoScalingGroups[0].name`), autoscaling:CreateOrUpdateTags writes the
    tags. The node group's name is a parameter of both, so a replaced node group (new group) is
    tagged again. Permissions: describe only this node group; tag only a group that EKS tagged
    as this node group's, and only with node-template keys.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        nodegroup: eks.Nodegroup,
        tags: dict[str, str],
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        # Not `nodegroup.nodegroup_name`: without the @aws-cdk/aws-eks:nodegroupNameAttribute flag
        # that is the resource's Ref, "<cluster>/<nodegroup>", which the EKS API rejects
        # (aws/aws-cdk#22442). The NodegroupName attribute is the name itself.
        cfn_nodegroup = nodegroup.node.default_child
        assert isinstance(cfn_nodegroup, CfnResource)
        nodegroup_name = Token.as_string(cfn_nodegroup.get_att("NodegroupName"))
        describe = cr.AwsCustomResource(
            self,
            "FindGroup",
            on_update=cr.AwsSdkCall(
                service="EKS",
                action="describeNodegroup",
                parameters={"clusterName": cluster_name, "nodegroupName": nodegroup_name},
                physical_resource_id=cr.PhysicalResourceId.of(nodegroup_name),
                output_paths=["nodegroup.resources.autoScalingGroups.0.name"],
            ),
            policy=cr.AwsCustomResourcePolicy.from_statements(
                [iam.PolicyStatement(actions=["eks:DescribeNodegroup"], resources=[nodegroup.nodegroup_arn])]
            ),
            install_latest_aws_sdk=False,
            timeout=Duration.minutes(2),
        )
        self.group_name = describe.get_response_field("nodegroup.resources.autoScalingGroups.0.name")
        asg_tags = [
            {
                "ResourceId": self.group_name,
                "ResourceType": "auto-scaling-group",
                "Key": key,
                "Value": value,
                # Tags for the autoscaler only; instances get their tags from the launch template.
                "PropagateAtLaunch": False,
            }
            for key, value in sorted(tags.items())
        ]
        group_arn = _group_arns(stack)
        tagging = iam.PolicyStatement(
            actions=["autoscaling:CreateOrUpdateTags", "autoscaling:DeleteTags"],
            resources=[group_arn],
            conditions={
                # EKS tags the group it creates with these (read them back with
                # `aws autoscaling describe-tags`); no other group can be tagged.
                "StringEquals": {
                    "aws:ResourceTag/eks:cluster-name": cluster_name,
                    "aws:ResourceTag/eks:nodegroup-name": nodegroup_name,
                },
                "ForAllValues:StringLike": {"aws:TagKeys": [f"{NODE_TEMPLATE}/*"]},
            },
        )
        self.resource = cr.AwsCustomResource(
            self,
            "Tag",
            on_update=cr.AwsSdkCall(
                service="AutoScaling",
                action="createOrUpdateTags",
                parameters={"Tags": asg_tags},
                physical_resource_id=cr.PhysicalResourceId.of(f"{nodegroup_name}-node-template"),
            ),
            on_delete=cr.AwsSdkCall(
                service="AutoScaling",
                action="deleteTags",
                parameters={
                    "Tags": [{k: t[k] for k in ("ResourceId", "ResourceType", "Key")} for t in asg_tags]
                },
                # The group may already be gone with its node group.
                ignore_error_codes_matching="ValidationError",
            ),
            policy=cr.AwsCustomResourcePolicy.from_statements([tagging]),
            install_latest_aws_sdk=False,
            timeout=Duration.minutes(2),
        )
        self.tags = dict(tags)
        acknowledge(
            self.resource,
            f"AwsSolutions-IAM5[Resource::{stack.resolve(group_arn)}]",
            "EKS names the node group's Auto Scaling group; tagging is limited to the group EKS "
            "tagged as this node group's (aws:ResourceTag conditions) and to node-template keys.",
        )
        # CDK's one shared function behind every AwsCustomResource of the stack.
        provider = stack.node.find_child("AWS" + cr.AwsCustomResource.PROVIDER_FUNCTION_UUID.replace("-", ""))
        acknowledge(
            provider.node.find_child("ServiceRole"),
            managed_policy_finding("AWSLambdaBasicExecutionRole", service_role=True),
            "CDK's AwsCustomResource function writes its logs with the AWS managed basic execution "
            "policy; CDK owns this role, and the SDK calls it may make are the statements above.",
        )


class ClusterAutoscaler(Construct):
    """The cluster-autoscaler Helm release on system nodes, with its IAM role through Pod Identity.

    Permissions follow the AWS README's "Full Cluster Autoscaler Features Policy" with the scaling
    actions restricted by tag, as it recommends and as the EKS best-practices guide shows
    (aws:ResourceTag/k8s.io/cluster-autoscaler/<cluster> = owned, the tag EKS puts on the groups of
    this cluster's managed node groups); eks:DescribeNodegroup only on this cluster's node groups.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        cluster_name: str,
        kubernetes_version: str,
        chart_version: str,
        image_repository: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        principal = iam.ServicePrincipal("pods.eks.amazonaws.com")
        nodegroup_arns = stack.format_arn(
            service="eks", resource="nodegroup", resource_name=f"{cluster_name}/*/*"
        )
        group_arns = _group_arns(stack)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=principal,
            description=f"Cluster Autoscaler of {cluster_name}: scale this cluster's node groups",
        )
        assert self.role.assume_role_policy is not None
        # Pod Identity tags the session (cluster, namespace, service account).
        self.role.assume_role_policy.add_statements(
            iam.PolicyStatement(actions=["sts:TagSession"], principals=[principal])
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="Describe",
                actions=[
                    "autoscaling:DescribeAutoScalingGroups",
                    "autoscaling:DescribeAutoScalingInstances",
                    "autoscaling:DescribeLaunchConfigurations",
                    "autoscaling:DescribeScalingActivities",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplateVersions",
                    "ec2:GetInstanceTypesFromInstanceRequirements",
                ],
                # Describe/List calls that support no resource-level permissions.
                resources=["*"],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="NodegroupLabelsAndTaints",
                actions=["eks:DescribeNodegroup"],
                resources=[nodegroup_arns],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                sid="ScaleThisClustersGroups",
                actions=["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
                resources=[group_arns],
                conditions={
                    "StringEquals": {
                        f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name}": "owned",
                        "aws:ResourceTag/k8s.io/cluster-autoscaler/enabled": "true",
                    }
                },
            )
        )
        self.association = eks_l1.CfnPodIdentityAssociation(
            self,
            "PodIdentity",
            cluster_name=cluster_name,
            namespace=NAMESPACE,
            service_account=SERVICE_ACCOUNT,
            role_arn=self.role.role_arn,
        )
        self.values = chart_values(
            cluster_name=cluster_name,
            region=stack.region,
            kubernetes_version=kubernetes_version,
            image_repository=image_repository,
        )
        self.chart = eks.HelmChart(
            self,
            "Chart",
            cluster=cluster,
            repository=REPOSITORY,
            chart=CHART,
            release=RELEASE,
            version=chart_version,
            namespace=NAMESPACE,
            values=self.values,
            # `--wait`: the deploy stops here until the autoscaler runs (no job gets GPU nodes
            # without it). No `--atomic` (deprecated in the layer's Helm 4; see addons.py):
            # CloudFormation's rollback undoes a failed release.
            wait=True,
            timeout=Duration.minutes(10),
        )
        role_policy = self.role.node.find_child("DefaultPolicy")
        acknowledge(
            role_policy,
            "AwsSolutions-IAM5[Resource::*]",
            "The Describe calls of the autoscaler's AWS provider support no resource-level "
            "permissions (AWS README, Full Cluster Autoscaler Features Policy).",
        )
        acknowledge(
            role_policy,
            f"AwsSolutions-IAM5[Resource::{stack.resolve(nodegroup_arns)}]",
            "Labels and taints of this cluster's node groups, whose names and IDs EKS assigns.",
        )
        acknowledge(
            role_policy,
            f"AwsSolutions-IAM5[Resource::{stack.resolve(group_arns)}]",
            "Auto Scaling group names are assigned by EKS; scaling is limited by condition to "
            "groups tagged k8s.io/cluster-autoscaler/<this cluster> = owned.",
        )
        # Pod Identity injects credentials when a pod is created: the association must exist
        # before the autoscaler's pod does, or that pod runs without AWS credentials.
        self.chart.node.add_dependency(self.association)


def _group_arns(stack: Stack) -> str:
    """ARNs of every Auto Scaling group of the account and region (narrowed by conditions)."""
    return stack.format_arn(
        service="autoscaling",
        resource="autoScalingGroup",
        resource_name="*:autoScalingGroupName/*",
        arn_format=ArnFormat.COLON_RESOURCE_NAME,
    )

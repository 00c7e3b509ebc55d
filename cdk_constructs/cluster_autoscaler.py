"""Cluster Autoscaler: GPU nodes from zero when a RayJob's workers are pending, and back to zero.

Why the Cluster Autoscaler and not Karpenter (docs/gpu-fleet.md, "GPU nodes only while a job runs"): Karpenter
covers what the EFA group needs by now (EFA interfaces for pods requesting vpc.amazonaws.com/efa,
capacityReservationSelectorTerms, one subnet by selector, and since v1.11.0 of April 2026 a
placementGroupSelector), but it would replace the managed node group: a second definition of the
GPU nodes (EC2NodeClass + NodePool, its own AMI and interface choices) beside the launch template
that the tests pin, and a controller that launches instances itself (ec2:RunInstances/CreateFleet,
iam:PassRole, an interruption queue). With one instance type in one AZ, Karpenter's choice among
types and zones buys nothing. The Cluster Autoscaler only changes the desired size of the node
group's Auto Scaling group, so every node it starts comes from exactly that launch template.

How scale-from-zero works on AWS (kubernetes/autoscaler, cluster-autoscaler/cloudprovider/aws/
aws_manager.go `buildNodeFromTemplate` and aws_wrapper.go `getManagedNodegroupInfo`, read at tags
cluster-autoscaler-1.34.5, -1.35.2 and -1.36.1, the image tags below; the code came with commit
3ab6ead79d, "Add support for tags on AWS managed nodegroups to indicate resources", March 2023):
- Discovery: EKS tags the Auto Scaling group of every managed node group with
  `k8s.io/cluster-autoscaler/enabled` and `k8s.io/cluster-autoscaler/<cluster>` ("Nodes launched
  as part of a managed node group are automatically tagged for auto-discovery by the Kubernetes
  Cluster Autoscaler", EKS User Guide, managed-node-groups), and with `eks:cluster-name` and
  `eks:nodegroup-name`.
- With no node of a group running, the autoscaler builds the node it would get from the instance
  type (CPU, memory, GPUs). The group's `eks:` tags make it a managed node group to the
  autoscaler, which then calls eks:DescribeNodegroup and takes the node group's own `labels`,
  its `taints`, and from the node group's `tags` every
  `k8s.io/cluster-autoscaler/node-template/resources/<name>` as allocatable (these override the
  same keys on the Auto Scaling group). Labels and taints therefore need no tags: they are the node
  group's own. Only `vpc.amazonaws.com/efa`, which every worker pod requests and which no instance
  type field carries, needs a tag, and it goes on the node group (`node_template_resource_tags`).
- The AWS README says DescribeNodegroup is used "only when a managed nodegroup is created with 0
  nodes and has never had any nodes added to it". What the code does: once a group had a Ready node,
  the core keeps that real node's description (labels, taints, allocatable as the device plugins
  advertised them) and builds no template; after an autoscaler restart with the group at 0 it builds
  the template again, with DescribeNodegroup. Either way the pending worker is matched against what
  a GPU node offers.
- Earlier this construct wrote node-template tags onto the Auto Scaling group through
  AwsCustomResource calls: their IAM policy could still be propagating at the first call (rolling
  back the Cluster stack), and on a node group replacement the old tags' delete ran under the
  updated policy, whose condition named the new group. Node group tags are a plain property of
  AWS::EKS::Nodegroup, updated in place (not in its createOnlyProperties).
"""

from __future__ import annotations

from typing import Any

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_eks as eks_l1
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk_constructs.nag import acknowledge
from config.catalogue import Instance
from config.names import EFA_RESOURCE, GPU_RESOURCE, SYSTEM_NODE_LABELS

# Scale-down timing: config/provisioned.py (the cost estimate counts it too).
from config.provisioned import SCALE_DOWN_DELAY_AFTER_ADD, SCALE_DOWN_UNNEEDED
from config.startup import max_node_provision_time

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


def node_template_resource_tags(instance: Instance, *, efa: bool) -> dict[str, str]:
    """Node group tags telling the autoscaler what a GPU node offers before one exists: its GPUs
    (also known from the instance type) and, on EFA types, its EFA interfaces."""
    tags = {f"{NODE_TEMPLATE}/resources/{GPU_RESOURCE}": str(instance.gpus)}
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
            # Kueue's admission check asks for a job's GPU nodes with a ProvisioningRequest of
            # class best-effort-atomic-scale-up (k8s/kueue.py says why that class); the autoscaler
            # handles those only with this flag (config/flags/flags.go, cluster-autoscaler-1.35.2:
            # "enable-provisioning-requests", default false). The chart's ClusterRole already
            # grants provisioningrequests and their status (templates/clusterrole.yaml, 9.59.0).
            "enable-provisioning-requests": True,
            # How long it waits for a requested node to register before giving up on it (default
            # 15m, FAQ.md). Kueue's waitForPodsReady timeout counts this part too
            # (config/startup.py): one figure, so neither gives up while the other still waits.
            "max-node-provision-time": max_node_provision_time(),
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

"""Managed node groups: the CPU system group and the EFA GPU group.

Both use launch templates so the root volume is encrypted gp3 and IMDSv2 is required with a hop
limit of 1 (pods cannot reach the node's credentials; they get their own through Pod Identity).
With a launch template CDK sends no AMI type, so it is always set explicitly.
"""

from __future__ import annotations

from aws_cdk import CfnResource, CfnTag
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from config.catalogue import Instance
from config.names import (
    ACCELERATOR_LABEL,
    GPU_NODE_LABELS,
    GPU_NODE_ROLE,
    GPU_TAINT_KEY,
    GPU_TAINT_VALUE,
    SYSTEM_NODE_LABELS,
    SYSTEM_NODE_ROLE,
    accelerator_label_value,
)

# Root volume IOPS and throughput: config/provisioned.py (the cost estimate counts them too).
from config.provisioned import ROOT_IOPS, ROOT_THROUGHPUT_MIBPS
from config.settings import CapacityType, GpuNodeSettings, SystemNodeSettings

# The accelerator label and every label of a GPU node: config/names.py (Kueue's ResourceFlavor,
# k8s/kueue.py, must name exactly the labels the node group sets).


def accelerator_label(instance: Instance) -> dict[str, str]:
    """`k8s.amazonaws.com/accelerator` of a GPU type (e.g. nvidia-l4): a node group label, so the
    kubelet registers the node with it, before the device plugin advertises any GPU."""
    assert instance.gpu_model is not None, instance.name
    return {ACCELERATOR_LABEL: accelerator_label_value(instance.gpu_model)}


def gpu_node_labels(instance: Instance) -> dict[str, str]:
    """Every label of a GPU node: the ones pods select on, plus the accelerator label."""
    return {**GPU_NODE_LABELS, **accelerator_label(instance)}


ROOT_DEVICE = "/dev/xvda"  # AL2023 EKS AMIs boot from /dev/xvda

_METADATA_OPTIONS = ec2.CfnLaunchTemplate.MetadataOptionsProperty(
    http_endpoint="enabled",
    http_tokens="required",
    http_put_response_hop_limit=1,
)


def _root_volume(size_gib: int) -> ec2.CfnLaunchTemplate.BlockDeviceMappingProperty:
    return ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
        device_name=ROOT_DEVICE,
        ebs=ec2.CfnLaunchTemplate.EbsProperty(
            volume_size=size_gib,
            volume_type="gp3",
            encrypted=True,
            delete_on_termination=True,
            iops=ROOT_IOPS,
            throughput=ROOT_THROUGHPUT_MIBPS,
        ),
    )


class SystemNodeGroup(Construct):
    """CPU nodes for the Ray head, the KubeRay operator and cluster add-ons."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        settings: SystemNodeSettings,
        subnets: list[ec2.ISubnet],
    ) -> None:
        super().__init__(scope, construct_id)
        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                metadata_options=_METADATA_OPTIONS,
                block_device_mappings=[_root_volume(settings.root_volume_gib)],
                tag_specifications=_tag_specs(SYSTEM_NODE_ROLE),
            ),
        )
        self.nodegroup = eks.Nodegroup(
            self,
            "Nodegroup",
            cluster=cluster,
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            instance_types=[ec2.InstanceType(settings.instance_type)],
            min_size=settings.min_size,
            desired_size=settings.desired_size,
            max_size=settings.max_size,
            labels=dict(SYSTEM_NODE_LABELS),
            subnets=ec2.SubnetSelection(subnets=subnets),
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.ref,
                version=self.launch_template.attr_latest_version_number,
            ),
            max_unavailable=1,
        )


class EfaGpuNodeGroup(Construct):
    """GPU nodes with every EFA interface of their type, in one AZ and (optionally) one placement group.

    - Launch template network interfaces: one per network card, from the catalogue's layout
      (`Instance.efa_interface_layout`): an EFA with ENA on card 0, EFA-only interfaces on the other
      cards where the type supports them (p5), else EFA with ENA at device index 1. No SubnetId:
      the managed node group supplies the subnet.
    - A security group allowing all traffic from and to itself: EFA's SRD traffic is not IP and
      is only permitted between interfaces whose security groups allow each other, both ways.
      The cluster security group rides along so nodes reach the control plane and other pods.
    - A cluster placement group unless a capacity reservation is targeted (reservations made
      outside the group cause capacity errors; settings validation enforces this).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        vpc: ec2.IVpc,
        settings: GpuNodeSettings,
        subnet: ec2.ISubnet,
        auto_repair: bool = True,
        tags: dict[str, str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        instance: Instance = settings.instance

        self.security_group: ec2.SecurityGroup | None = None
        network_interfaces = None
        if settings.efa:
            self.security_group = ec2.SecurityGroup(
                self,
                "EfaSecurityGroup",
                vpc=vpc,
                description="EFA: all traffic between GPU nodes, in and out",
                allow_all_outbound=False,
            )
            # Separate ingress/egress resources referencing the group itself (inline self
            # references would be a circular dependency in CloudFormation).
            self.security_group.connections.allow_internally(ec2.Port.all_traffic(), "EFA between GPU nodes")
            groups = [self.security_group.security_group_id, cluster.cluster_security_group_id]
            network_interfaces = [
                ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
                    device_index=device,
                    network_card_index=card,
                    interface_type=kind,
                    groups=groups,
                    delete_on_termination=True,
                )
                for card, device, kind in instance.efa_interface_layout()
            ]

        self.placement_group: ec2.CfnPlacementGroup | None = None
        placement = None
        if settings.placement_group:
            self.placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")
            placement = ec2.CfnLaunchTemplate.PlacementProperty(group_name=self.placement_group.ref)

        reservation = None
        market_options = None
        if settings.capacity_reservation_id:
            reservation = ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
                capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                    capacity_reservation_id=settings.capacity_reservation_id
                )
            )
        if settings.capacity_type is CapacityType.CAPACITY_BLOCK:
            market_options = ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(market_type="capacity-block")

        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                metadata_options=_METADATA_OPTIONS,
                block_device_mappings=[_root_volume(settings.root_volume_gib)],
                # One type sits in the launch template, not the node group: CDK's node group
                # checks AMI/type pairs against a list that lags new GPU types (p5 is missing).
                # Several (Spot) go to the node group instead (below): EKS takes "zero or one
                # Instance type ... in a launch template" or "0-20 instance types" through its API,
                # not both (EKS User Guide, "Customize managed nodes with launch templates").
                instance_type=settings.instance_type if len(settings.types) == 1 else None,
                network_interfaces=network_interfaces,
                placement=placement,
                capacity_reservation_specification=reservation,
                instance_market_options=market_options,
                tag_specifications=_tag_specs(GPU_NODE_ROLE),
            ),
        )

        self.nodegroup = eks.Nodegroup(
            self,
            "Nodegroup",
            cluster=cluster,
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
            capacity_type=_capacity_type(settings.capacity_type),
            # The Cluster Autoscaler owns the group's size between min and max. EKS needs a
            # desired size when the group is created ("specify all or none of the properties",
            # EKS API, NodegroupScalingConfig), and "whenever this parameter changes" EKS resizes
            # the group to it: pinned to the minimum, a deploy never changes it. Whether a new
            # min/max sends it again is documented nowhere; `raytrain review` says to deploy such
            # a change between jobs (when the group is at its minimum anyway).
            min_size=settings.min_size,
            desired_size=settings.min_size,
            max_size=settings.max_size,
            labels=gpu_node_labels(instance),
            taints=[
                eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=GPU_TAINT_KEY, value=GPU_TAINT_VALUE)
            ],
            subnets=ec2.SubnetSelection(subnets=[subnet]),
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.ref,
                version=self.launch_template.attr_latest_version_number,
            ),
            # Replace GPU nodes one at a time: a training job loses at most one worker.
            max_unavailable=1,
            # EKS replaces or reboots nodes whose health conditions fail (Ready, and with the node
            # monitoring agent AcceleratedHardwareReady for GPU/XID faults, NetworkingReady, ...):
            # https://docs.aws.amazon.com/eks/latest/userguide/node-health.html
            enable_node_auto_repair=auto_repair,
            # The Cluster Autoscaler's node-template tags (cluster_autoscaler.py): read through
            # eks:DescribeNodegroup when no node of the group runs.
            tags=tags,
        )
        cfn = self.nodegroup.node.default_child
        assert isinstance(cfn, CfnResource)
        if len(settings.types) > 1:
            # "When deploying your node group with the Spot capacity type that's using a custom
            # launch template, use the API to pass multiple instance types. Don't pass a single
            # instance type through the launch template." EKS then picks the Spot allocation
            # strategy itself: "When creating new node groups in a cluster with Kubernetes version
            # 1.28 or higher, the allocation strategy is set to price-capacity-optimized" (EKS User
            # Guide, "Managed node group capacity types", https://docs.aws.amazon.com/eks/latest/
            # userguide/managed-node-groups.html#managed-node-group-capacity-types). The node group
            # has no property for it, and the launch template sets no InstanceMarketOptions on Spot
            # (the Auto Scaling group EKS makes holds the Spot settings). Set as an override so CDK's
            # lagging AMI/type check (above) does not refuse new GPU types.
            cfn.add_property_override("InstanceTypes", list(settings.types))
        if auto_repair:
            # Like updates, one GPU node at a time: a job loses at most one worker to a repair.
            cfn.add_property_override("NodeRepairConfig.MaxParallelNodesRepairedCount", 1)
        else:
            # CDK omits the property when off; a group that had repair on would keep it, so say so.
            cfn.add_property_override("NodeRepairConfig", {"Enabled": False})


def _capacity_type(value: CapacityType) -> eks.CapacityType:
    return {
        CapacityType.ON_DEMAND: eks.CapacityType.ON_DEMAND,
        CapacityType.SPOT: eks.CapacityType.SPOT,
        CapacityType.CAPACITY_BLOCK: eks.CapacityType.CAPACITY_BLOCK,
    }[value]


def _tag_specs(role: str) -> list[ec2.CfnLaunchTemplate.TagSpecificationProperty]:
    # Instances and volumes carry the node role so cost reports split GPU from system spend.
    return [
        ec2.CfnLaunchTemplate.TagSpecificationProperty(
            resource_type=resource_type,
            tags=[CfnTag(key="ray-train/node-role", value=role)],
        )
        for resource_type in ("instance", "volume")
    ]

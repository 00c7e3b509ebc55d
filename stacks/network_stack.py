"""Network: VPC with private node subnets, NAT for egress, VPC endpoints and flow logs."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from cdk_constructs.encrypted_logs import encrypted_log_group
from cdk_constructs.vpc_cleanup import VpcCleanup
from config.network import PRIVATE_SUBNET_MASK, PUBLIC_SUBNET_MASK
from config.provisioned import INTERFACE_ENDPOINTS
from config.settings import Settings
from stacks.common import log_retention, removal_policy


class NetworkStack(cdk.Stack):
    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings, **kwargs: Any):
        super().__init__(scope, construct_id, **kwargs)
        vpc_settings = settings.vpc

        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(vpc_settings.cidr),
            availability_zones=list(vpc_settings.availability_zones),
            nat_gateways=vpc_settings.nat_gateways,
            subnet_configuration=[
                # Public subnets hold only the NAT gateways (and nothing EKS may put there: no
                # public load balancers are created by this app).
                ec2.SubnetConfiguration(
                    name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=PUBLIC_SUBNET_MASK
                ),
                # The VPC CNI gives every pod a VPC address: /19 leaves room for 8k pods per AZ.
                ec2.SubnetConfiguration(
                    name="Private",
                    subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
                    cidr_mask=PRIVATE_SUBNET_MASK,
                ),
            ],
            # Removes the default security group's rules (CIS 5.4): nothing may use it by accident.
            restrict_default_security_group=True,
        )
        # EKS discovers subnets for internal load balancers by these tags.
        for subnet in self.vpc.private_subnets:
            cdk.Tags.of(subnet).add("kubernetes.io/role/internal-elb", "1")

        # Every connection's addresses and ports: encrypted with a key of its own.
        flow_log_group = encrypted_log_group(
            self,
            "FlowLogs",
            description=f"VPC flow logs of {settings.cluster.name}",
            retention=log_retention(vpc_settings.flow_log_retention_days),
            removal_policy=removal_policy(settings),
        )
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )

        # Image pulls and checkpoint traffic stay off the NAT gateway where an endpoint exists.
        self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        endpoint_sg = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            description="HTTPS from inside the VPC to the interface endpoints",
            allow_all_outbound=False,
        )
        endpoint_sg.add_ingress_rule(
            ec2.Peer.ipv4(vpc_settings.cidr), ec2.Port.tcp(443), "HTTPS from the VPC"
        )
        # Which endpoints: config/provisioned.py (the cost estimate counts them per AZ).
        for name, member in INTERFACE_ENDPOINTS.items():
            self.vpc.add_interface_endpoint(
                name,
                service=getattr(ec2.InterfaceVpcEndpointAwsService, member),
                private_dns_enabled=True,
                # The group above already admits HTTPS from the VPC; no second, token-built rule.
                open=False,
                security_groups=[endpoint_sg],
                subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            )

        # On destroy, removes what EKS left in the VPC outside CloudFormation before the VPC goes.
        self.cleanup = VpcCleanup(
            self,
            "EksLeftoverCleanup",
            vpc=self.vpc,
            cluster_name=settings.cluster.name,
        )

    def private_subnet_in(self, availability_zone: str) -> ec2.ISubnet:
        for subnet in self.vpc.private_subnets:
            if subnet.availability_zone == availability_zone:
                return subnet
        raise ValueError(f"no private subnet in {availability_zone}")

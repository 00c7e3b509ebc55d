"""Cluster: EKS (aws_eks_v2), managed add-ons, system and EFA GPU node groups, Helm add-ons."""

from __future__ import annotations

import importlib
from typing import Any, cast

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from cdk_constructs import cluster_autoscaler as autoscaler_chart
from cdk_constructs.addons import (
    EFA_PUBLIC_REPOSITORY,
    GpuDevicePlugins,
    KubeRayOperator,
    chart_image_repository,
)
from cdk_constructs.cluster_autoscaler import ClusterAutoscaler, node_template_resource_tags
from cdk_constructs.dcgm_engine import SharedDcgmEngine
from cdk_constructs.encrypted_logs import encrypted_log_group
from cdk_constructs.image_cache import PullThroughCache
from cdk_constructs.image_cache_warmer import ImageCacheWarmer
from cdk_constructs.kueue import IMAGE as KUEUE_IMAGE
from cdk_constructs.kueue import Kueue
from cdk_constructs.node_groups import EfaGpuNodeGroup, SystemNodeGroup
from cdk_constructs.observability import (
    METRICS_LOG_KIND,
    ContainerInsights,
    TrainingDashboard,
    container_insights_log_group,
    node_monitoring_agent,
)
from config.names import KUBERAY_CHART
from config.registries import split_image, split_tag
from config.settings import KUBECTL_LAYERS, ClusterMode, EndpointAccess, Settings
from k8s.kueue import queue_objects
from stacks.common import log_retention, removal_policy

CONTROL_PLANE_LOG_TYPES = [
    eks.ClusterLoggingTypes.API,
    eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR,
    eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
]


def kubernetes_version(version: str) -> eks.KubernetesVersion:
    version_enum: eks.KubernetesVersion = getattr(eks.KubernetesVersion, "V" + version.replace(".", "_"))
    return version_enum


def kubectl_layer(scope: Construct, version: str) -> Any:
    """The kubectl/helm Lambda layer whose kubectl matches the cluster's Kubernetes version."""
    module_name, class_name = KUBECTL_LAYERS[version].rsplit(".", 1)
    layer_class = getattr(importlib.import_module(module_name), class_name)
    return layer_class(scope, "KubectlLayer")


def control_plane_security_group_export(settings: Settings) -> str:
    """Export name of the control plane's security group: the pipeline's PipelineAccess stack adds
    its in-VPC build's HTTPS rule to it. Exported by name in the standalone app as well, so a
    manual deploy and the pipeline write the same Cluster stack (and neither removes the export
    the other's stack imports)."""
    return f"{settings.stack_prefix}-ControlPlaneSecurityGroupId"


def cluster_security_group_export(settings: Settings) -> str:
    """Export name of the security group EKS creates for the cluster (nodes and control plane): the
    Workload stack's job drain runs in it to reach the API server. Named and always exported, so
    the Cluster stack's exports do not depend on what the Workload stack happens to use: an
    automatic export (CDK's `ExportsOutput…`) disappears from the Cluster stack as soon as its
    last consumer does, and CloudFormation refuses that update while the deployed Workload stack
    still imports it ("Export … cannot be deleted as it is in use")."""
    return f"{settings.stack_prefix}-ClusterSecurityGroupId"


class ClusterStack(cdk.Stack):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: Settings,
        vpc: ec2.IVpc,
        gpu_subnet: ec2.ISubnet,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        cluster_settings = settings.cluster

        self.secrets_key = kms.Key(
            self,
            "SecretsKey",
            description=f"Envelope encryption of Kubernetes secrets ({cluster_settings.name})",
            enable_key_rotation=True,
            removal_policy=removal_policy(settings),
        )

        if cluster_settings.endpoint_access is EndpointAccess.PRIVATE:
            endpoint = eks.EndpointAccess.PRIVATE
        else:
            endpoint = eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*cluster_settings.public_access_cidrs)

        private_subnets = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=cluster_settings.name,
            version=kubernetes_version(cluster_settings.kubernetes_version),
            vpc=vpc,
            vpc_subnets=[private_subnets],
            endpoint_access=endpoint,
            cluster_logging=CONTROL_PLANE_LOG_TYPES,
            secrets_encryption_key=self.secrets_key,
            # Capacity comes only from the node groups below (no Auto Mode, no default group).
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            # Admins come from settings through access entries, not from whoever ran the deploy.
            bootstrap_cluster_creator_admin_permissions=False,
            # The networking add-ons are installed below as managed add-ons, with versions EKS
            # keeps compatible, instead of the unmanaged copies EKS would otherwise bootstrap.
            bootstrap_self_managed_addons=False,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=kubectl_layer(self, cluster_settings.kubernetes_version),
            ),
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )

        # jsii's Python typing declares `kubectl_provider_options` on the ICluster protocol but not
        # on the Cluster class, so mypy cannot match them; the object is an ICluster at run time.
        self.cluster_ref = cast("eks.ICluster", self.cluster)

        # EKS writes control-plane logs to /aws/eks/<name>/cluster and, when that group is missing,
        # creates it itself: outside CloudFormation, kept forever and left behind by every destroy.
        # Created here first, it follows the environment's removal policy like the other logs.
        # The API audit log among them: encrypted with a key of its own.
        self.control_plane_logs = encrypted_log_group(
            self,
            "ControlPlaneLogs",
            description=f"EKS control-plane logs of {cluster_settings.name}",
            log_group_name=f"/aws/eks/{cluster_settings.name}/cluster",
            retention=logs.RetentionDays.THREE_MONTHS,
            removal_policy=removal_policy(settings),
        )
        cfn_cluster = self.cluster.node.default_child
        assert cfn_cluster is not None
        cfn_cluster.node.add_dependency(self.control_plane_logs)

        for index, arn in enumerate(cluster_settings.admin_principal_arns):
            self.cluster.grant_access(
                f"Admin{index}",
                arn,
                [
                    eks.AccessPolicy.from_access_policy_name(
                        "AmazonEKSClusterAdminPolicy",
                        access_scope_type=eks.AccessScopeType.CLUSTER,
                    )
                ],
            )

        # Managed add-ons. The VPC CNI enforces Kubernetes NetworkPolicy (the Ray namespace relies
        # on it); Pod Identity gives Ray pods their S3 permissions.
        vpc_cni = eks.Addon(
            self,
            "VpcCni",
            cluster=self.cluster_ref,
            addon_name="vpc-cni",
            configuration_values={"enableNetworkPolicy": "true"},
        )
        kube_proxy = eks.Addon(self, "KubeProxy", cluster=self.cluster_ref, addon_name="kube-proxy")
        pod_identity = eks.Addon(
            self, "PodIdentityAgent", cluster=self.cluster_ref, addon_name="eks-pod-identity-agent"
        )

        self.system_nodes = SystemNodeGroup(
            self,
            "SystemNodes",
            cluster=self.cluster_ref,
            settings=settings.system_nodes,
            subnets=vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS).subnets,
        )
        self.gpu_nodes = EfaGpuNodeGroup(
            self,
            "GpuNodes",
            cluster=self.cluster_ref,
            vpc=vpc,
            settings=settings.gpu_nodes,
            subnet=gpu_subnet,
            auto_repair=settings.observability.gpu_node_auto_repair,
            tags=node_template_resource_tags(settings.gpu_nodes.instance, efa=settings.gpu_nodes.efa),
        )
        for group in (self.system_nodes.nodegroup, self.gpu_nodes.nodegroup):
            # Nodes join only once their networking add-ons exist.
            group.node.add_dependency(vpc_cni, kube_proxy, pod_identity)
        # CoreDNS needs somewhere to run before EKS reports it active.
        coredns = eks.Addon(self, "CoreDns", cluster=self.cluster_ref, addon_name="coredns")
        coredns.node.add_dependency(self.system_nodes.nodegroup)

        # Public images from the environment's own registry (ECR pull-through cache), where ECR
        # supports their upstream: config/registries.py, docs/images.md.
        images = settings.image_source
        autoscaler_image = chart_image_repository(autoscaler_chart.CHART, settings.addons.cluster_autoscaler)
        self.image_cache: PullThroughCache | None = None
        if images.prefix is not None:
            pulled = [
                settings.workload.image,
                chart_image_repository(KUBERAY_CHART, settings.addons.kuberay_operator),
                autoscaler_image,
                KUEUE_IMAGE,
            ]
            if settings.gpu_nodes.efa:
                pulled.append(EFA_PUBLIC_REPOSITORY)
            self.image_cache = PullThroughCache(
                self,
                "ImageCache",
                source=images,
                upstreams=[u for u in map(images.upstream_of, pulled) if u is not None],
                node_roles=[self.system_nodes.nodegroup.role, self.gpu_nodes.nodegroup.role],
            )
            self._warm_ray_image(settings)

        self.device_plugins = GpuDevicePlugins(
            self,
            "GpuDevicePlugins",
            cluster=self.cluster_ref,
            nvidia_version=settings.addons.nvidia_device_plugin,
            efa_version=settings.addons.efa_device_plugin if settings.gpu_nodes.efa else None,
            images=images,
        )
        self.kuberay = KubeRayOperator(
            self,
            "KubeRay",
            cluster=self.cluster_ref,
            version=settings.addons.kuberay_operator,
            ray_namespaces=[team.namespace for team in settings.team_list],
            images=images,
            queued=settings.job.cluster is ClusterMode.OWN,
        )
        # GPU nodes start when a RayJob's workers are pending and stop when they are gone.
        self.autoscaler = ClusterAutoscaler(
            self,
            "ClusterAutoscaler",
            cluster=self.cluster_ref,
            cluster_name=cluster_settings.name,
            kubernetes_version=cluster_settings.kubernetes_version,
            chart_version=settings.addons.cluster_autoscaler,
            image_repository=images.resolve(autoscaler_image)
            if images.upstream_of(autoscaler_image)
            else None,
        )
        self._kueue(settings, coredns)
        # Teardown order: Helm releases go before the nodes they run on (a release deleted after
        # its nodes leaves finalizers and pods stuck), and both before the cluster.
        self.device_plugins.node.add_dependency(self.gpu_nodes.nodegroup, coredns)
        self.kuberay.node.add_dependency(self.system_nodes.nodegroup, coredns)
        # The release (not its association, which comes before the nodes: below).
        self.autoscaler.chart.node.add_dependency(self.system_nodes.nodegroup, coredns, pod_identity)
        # Pod Identity associations take effect "several seconds" after they are created (EKS API
        # reference) and a pod admitted before gets no credentials, ever (k8s/pods.py). The
        # autoscaler is a Deployment (restartPolicy Always: a failing pod is never replaced), so
        # its association comes before the system nodes: minutes before its pod can be created.
        system_nodegroup = self.system_nodes.nodegroup.node.default_child
        assert system_nodegroup is not None
        system_nodegroup.node.add_dependency(self.autoscaler.association)
        if self.image_cache is not None:
            # Their pods pull through the cache: its rules and the nodes' grant exist first.
            for release in (self.device_plugins, self.kuberay, self.autoscaler.chart, self.kueue):
                release.node.add_dependency(self.image_cache)

        self._observability(settings, pod_identity)

        # The security group CDK creates for the cluster (eks_v2 `ControlPlaneSecurityGroup`), which
        # EKS attaches to the control plane's network interfaces only (ResourcesVpcConfig
        # SecurityGroupIds), not to nodes: the API server's HTTPS rules go here.
        self.control_plane_security_group = cast(
            "ec2.SecurityGroup", self.cluster.node.find_child("ControlPlaneSecurityGroup")
        )
        cdk.CfnOutput(
            self,
            "ControlPlaneSecurityGroupId",
            value=self.control_plane_security_group.security_group_id,
            export_name=control_plane_security_group_export(settings),
            description="Security group of the EKS control plane's network interfaces",
        )
        cdk.CfnOutput(
            self,
            "ClusterSecurityGroupId",
            value=self.cluster.cluster_security_group_id,
            export_name=cluster_security_group_export(settings),
            description=(
                "Security group EKS created for the cluster (the Workload stack's job drain runs in it)"
            ),
        )
        # The automatic export the Workload stack imported before it used the named one: kept so
        # that deploying this version updates the Cluster stack (first) while the deployed Workload
        # stack still imports it (CDK's documented way to break a cross-stack reference,
        # Stack.exportValue). Remove once every environment's Workload stack is on this version.
        self.export_value(self.cluster.cluster_security_group_id)
        cdk.CfnOutput(
            self,
            "UpdateKubeconfig",
            value=(f"aws eks update-kubeconfig --region {settings.region} --name {cluster_settings.name}"),
            description="Configure kubectl for this cluster",
        )

    def _kueue(self, settings: Settings, coredns: eks.Addon) -> None:
        """Kueue, then the teams' queues (in the namespaces created with KubeRay), before the
        Workload stack submits anything (it depends on this stack)."""
        self.kueue = Kueue(
            self,
            "Kueue",
            cluster=self.cluster_ref,
            version=settings.addons.kueue,
            images=settings.image_source,
        )
        self.kueue.node.add_dependency(self.system_nodes.nodegroup, coredns)
        self.queues = eks.KubernetesManifest(
            self, "KueueQueues", cluster=self.cluster_ref, manifest=queue_objects(settings), overwrite=True
        )
        self.queues.node.add_dependency(self.kueue.chart, self.kuberay.namespace)
        # The autoscaler watches ProvisioningRequests (--enable-provisioning-requests): their CRD first.
        self.autoscaler.chart.node.add_dependency(self.kueue.provisioning_crd)

    def _warm_ray_image(self, settings: Settings) -> None:
        """A digest-pinned Ray image is pulled through the cache by tag at deploy, and its digest
        checked: an uncached digest is not found through the cache (aws/containers-roadmap#2837)."""
        images, digest = settings.image_source, settings.workload.effective_image_digest
        repository = images.cache_repository(settings.workload.image)
        self.image_warmer: ImageCacheWarmer | None = None
        if digest is None or repository is None or images.prefix is None:
            return
        tag = split_tag(split_image(settings.workload.image)[1])[1]
        assert tag is not None  # settings: a digest-pinned image through the cache names its tag
        self.image_warmer = ImageCacheWarmer(
            self,
            "RayImageWarm",
            registry=images.registry,
            repository=repository,
            tag=tag,
            digest=digest,
            repository_prefix=images.prefix,
            function_name=f"{settings.cluster.name}-image-cache-warm"[:64],
        )
        # The cache's rules first: the pull goes through them.
        assert self.image_cache is not None
        self.image_warmer.node.add_dependency(self.image_cache)

    def _observability(self, settings: Settings, pod_identity: eks.Addon) -> None:
        """Node health agent (auto-repair's eyes), and opt-in Container Insights with a dashboard."""
        obs = settings.observability
        self.node_monitoring: eks.Addon | None = None
        if obs.node_monitoring:
            self.node_monitoring = node_monitoring_agent(
                self, "NodeMonitoringAgent", self.cluster_ref, settings.addons.node_monitoring_agent
            )
            self.node_monitoring.node.add_dependency(self.system_nodes.nodegroup)
        self.container_insights: ContainerInsights | None = None
        self.dashboard: TrainingDashboard | None = None
        if obs.metrics:
            self.container_insights = ContainerInsights(
                self,
                "ContainerInsights",
                cluster=self.cluster_ref,
                cluster_name=settings.cluster.name,
                version=settings.addons.cloudwatch_observability,
                ray_namespace=settings.workload.namespace,
                retention=log_retention(obs.log_retention_days),
                removal_policy=removal_policy(settings),
            )
            # Its agents get credentials from the Pod Identity agent; the add-on's operator runs
            # on the system nodes.
            self.container_insights.node.add_dependency(pod_identity, self.system_nodes.nodegroup)
            self.dashboard = TrainingDashboard(
                self,
                "Dashboard",
                dashboard_name=settings.stack_prefix,
                cluster_name=settings.cluster.name,
                metrics_log_group=container_insights_log_group(settings.cluster.name, METRICS_LOG_KIND),
            )
        self.dcgm_engine: SharedDcgmEngine | None = None
        if (
            self.node_monitoring is not None
            and self.container_insights is not None
            and settings.observability.dcgm_engine == "shared"
        ):
            # Both add-ons bring a DCGM engine to GPU nodes: the exporter uses dcgm-server's
            # (observability.dcgm_engine `exporter` leaves it its own).
            self.dcgm_engine = SharedDcgmEngine(
                self,
                "SharedDcgmEngine",
                cluster=self.cluster_ref,
                engine_addon=self.node_monitoring,
                exporter_addon=self.container_insights.addon,
            )

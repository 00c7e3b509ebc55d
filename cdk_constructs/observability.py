"""Seeing and healing the GPU fleet: node health, Container Insights, and a dashboard.

- `node_monitoring_agent`: the EKS add-on `eks-node-monitoring-agent`. It reads node logs and sets
  per-category NodeConditions (KernelReady, NetworkingReady, StorageReady, and for GPUs
  AcceleratedHardwareReady from NVIDIA XID errors and DCGM); managed node group auto-repair acts
  on them (https://docs.aws.amazon.com/eks/latest/userguide/node-health.html). The repair side
  is on the GPU node group (cdk_constructs/node_groups.py, NodeRepairConfig). On GPU nodes its
  DCGM host engine (`dcgm-server`) must run too, so the configuration gives it the GPU toleration
  (docs/node-health.md).
- `ContainerInsights`: the EKS add-on `amazon-cloudwatch-observability` (CloudWatch agent with
  Container Insights enhanced observability, DCGM exporter for NVIDIA GPU metrics, EFA metrics,
  Fluent Bit for container logs). Permissions through EKS Pod Identity, which the add-on supports
  from version 3.1.0: the agent and Fluent Bit both run as the service account `cloudwatch-agent`
  in the namespace `amazon-cloudwatch`, which gets a role with CloudWatchAgentServerPolicy
  (Container-Insights-setup-EKS-addon.html; amazon-cloudwatch-observability.html in the EKS user
  guide). Its log groups are created here with a retention and the environment's removal policy,
  so destroy does not leave groups Fluent Bit would otherwise create without either; one extra
  Fluent Bit file (the add-on's documented `containerLogs.fluentBit.config.extraFiles`) ships the
  training loop's EMF lines to their own group (training/reporting/emf.py says why).
- `TrainingDashboard`: GPU utilisation and memory per node, EFA bytes in/out per node, node
  counts, and the job's tokens/s, MFU, training and held-out loss, step time, held-out perplexity
  and token accuracy per run.

Metric names: Container Insights' are from its EKS metric reference
(Container-Insights-metrics-enhanced-EKS.html: node_gpu_utilization, node_gpu_memory_utilization,
node_efa_rx_bytes, node_efa_tx_bytes with dimensions ClusterName, InstanceId, NodeName;
cluster_node_count, cluster_failed_node_count with ClusterName); the job's are training/reporting/emf.py's.
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from cdk_constructs.addons import GPU_TOLERATION
from cdk_constructs.encrypted_logs import encrypted_log_group, log_group_key
from cdk_constructs.nag import acknowledge, managed_policy_finding
from config.names import NODE_MONITORING_AGENT
from training.reporting import emf

NODE_MONITORING_ADDON = NODE_MONITORING_AGENT
CLOUDWATCH_ADDON = "amazon-cloudwatch-observability"
CLOUDWATCH_SERVICE_ACCOUNT = "cloudwatch-agent"
CLOUDWATCH_AGENT_POLICY = "CloudWatchAgentServerPolicy"
CONTAINER_INSIGHTS_NAMESPACE = "ContainerInsights"
# The groups the add-on writes to (Fluent Bit: application, dataplane, host; the agent: performance).
CONTAINER_INSIGHTS_LOG_KINDS = ("application", "dataplane", "host", "performance")
METRICS_LOG_KIND = "raytrain-metrics"
METRICS_FLUENT_BIT_FILE = "raytrain-metrics.conf"
METRICS_TAG = "raytrain.emf.*"


def container_insights_log_group(cluster_name: str, kind: str) -> str:
    return f"/aws/containerinsights/{cluster_name}/{kind}"


def node_monitoring_configuration() -> dict[str, Any]:
    """The add-on's configuration values (its schema: charts/configuration.schema.json of the
    release; a copy in tests/fixtures/charts/, against which tests validate these).

    - `dcgmAgent.tolerations`: the chart's default is `[]`, so on our tainted GPU nodes no DCGM
      host engine would run; the agent then reports a DCGM error on AcceleratedHardwareReady and
      auto-repair replaces the node minutes after it boots (aws/containers-roadmap#2567, #2555).
      Only the GPU taint: its affinity already keeps it to GPU instance types.
    - `nodeAgent.tolerations`: the chart's own default (tolerate every taint), written here so a
      later chart that narrowed it could not take node health off the GPU nodes unnoticed.
    """
    return {
        "nodeAgent": {"tolerations": [{"operator": "Exists"}]},
        "dcgmAgent": {"tolerations": [dict(GPU_TOLERATION)]},
    }


def node_monitoring_agent(
    scope: Construct, construct_id: str, cluster: eks.ICluster, version: str
) -> eks.Addon:
    """The node monitoring agent and its DCGM host engine, at a pinned add-on version (settings
    addons.node_monitoring_agent); removed with the stack (preserve_on_delete off)."""
    return eks.Addon(
        scope,
        construct_id,
        cluster=cluster,
        addon_name=NODE_MONITORING_ADDON,
        addon_version=version,
        configuration_values=node_monitoring_configuration(),
        preserve_on_delete=False,
    )


def emf_grep_regex() -> str:
    """Fluent Bit grep: keep only lines that are whole EMF objects from the training loop."""
    return "^" + emf.EMF_LINE_PREFIX.replace("{", r"\{")


def metrics_fluent_bit_conf(ray_namespace: str, log_group: str) -> str:
    """Tail the Ray namespace's container logs, keep the EMF lines, send only the raw line.

    - kubelet names container logs /var/log/containers/<pod>_<namespace>_<container>-<id>.log;
    - the tag does not start with `application.`, so the add-on's kubernetes filter (which would
      nest the JSON under `log_processed`) does not touch these records;
    - `log_key log` sends the line itself, not Fluent Bit's record around it, and
      `log_format json/emf` tells CloudWatch Logs to extract its metrics (Fluent Bit's
      cloudwatch_logs output); the environment variables are the add-on DaemonSet's own.
    """
    return "\n".join(
        [
            "[INPUT]",
            "    Name                tail",
            f"    Tag                 {METRICS_TAG}",
            f"    Path                /var/log/containers/*_{ray_namespace}_*.log",
            "    multiline.parser    docker, cri",
            "    DB                  /var/fluent-bit/state/flb_raytrain_metrics.db",
            "    Mem_Buf_Limit       5MB",
            "    Skip_Long_Lines     On",
            "    Refresh_Interval    10",
            "    Read_from_Head      ${READ_FROM_HEAD}",
            "",
            "[FILTER]",
            "    Name                grep",
            f"    Match               {METRICS_TAG}",
            f"    Regex               log {emf_grep_regex()}",
            "",
            "[OUTPUT]",
            "    Name                cloudwatch_logs",
            f"    Match               {METRICS_TAG}",
            "    region              ${AWS_REGION}",
            f"    log_group_name      {log_group}",
            "    log_stream_prefix   ${HOST_NAME}-",
            "    auto_create_group   false",
            "    log_key             log",
            "    log_format          json/emf",
            "    extra_user_agent    container-insights",
            "",
        ]
    )


def cloudwatch_addon_configuration(ray_namespace: str, metrics_log_group: str) -> dict[str, Any]:
    """The add-on's advanced configuration: only an extra Fluent Bit file; the agent, DCGM exporter,
    tolerations (all taints, so GPU nodes too) and default log files stay the add-on's own (which
    DCGM engine the exporter uses: cdk_constructs/dcgm_engine.py)."""
    return {
        "containerLogs": {
            "fluentBit": {
                "config": {
                    "extraFiles": {
                        METRICS_FLUENT_BIT_FILE: metrics_fluent_bit_conf(ray_namespace, metrics_log_group)
                    }
                }
            }
        }
    }


class ContainerInsights(Construct):
    """The CloudWatch observability add-on, its Pod Identity role and its log groups."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        cluster_name: str,
        version: str,
        ray_namespace: str,
        retention: logs.RetentionDays,
        removal_policy: cdk.RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_groups: dict[str, logs.LogGroup] = {}
        # Container logs (the training job's output among them): encrypted, one key for the set.
        self.logs_key = log_group_key(
            self,
            "LogsKey",
            description=f"Container Insights logs of {cluster_name}",
            removal_policy=removal_policy,
            log_group_names=container_insights_log_group(cluster_name, "*"),
        )
        for kind in (*CONTAINER_INSIGHTS_LOG_KINDS, METRICS_LOG_KIND):
            self.log_groups[kind] = encrypted_log_group(
                self,
                f"Logs-{kind}",
                description=f"Container Insights {kind} logs of {cluster_name}",
                log_group_name=container_insights_log_group(cluster_name, kind),
                retention=retention,
                removal_policy=removal_policy,
                key=self.logs_key,
            )
        self.metrics_log_group = self.log_groups[METRICS_LOG_KIND]

        self.role = iam.Role(
            self,
            "AgentRole",
            assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com"),
            description=f"CloudWatch agent and Fluent Bit of {cluster_name} (Pod Identity)",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(CLOUDWATCH_AGENT_POLICY)],
        )
        assert self.role.assume_role_policy is not None
        # Pod Identity's trust policy: AssumeRole (added above) and TagSession.
        self.role.assume_role_policy.add_statements(
            iam.PolicyStatement(
                actions=["sts:TagSession"],
                principals=[iam.ServicePrincipal("pods.eks.amazonaws.com")],
            )
        )
        acknowledge(
            self.role,
            managed_policy_finding(CLOUDWATCH_AGENT_POLICY),
            "The CloudWatch observability add-on documents CloudWatchAgentServerPolicy as its "
            "permissions; AWS keeps it in step with the agent and Fluent Bit.",
        )

        self.addon = eks.Addon(
            self,
            "Addon",
            cluster=cluster,
            addon_name=CLOUDWATCH_ADDON,
            # Pinned (settings addons.cloudwatch_observability): the chart the tests render.
            addon_version=version,
            # The literal name (not the group's token): the add-on's configuration stays plain
            # text in the template; the dependency below orders the two.
            configuration_values=cloudwatch_addon_configuration(
                ray_namespace, container_insights_log_group(cluster_name, METRICS_LOG_KIND)
            ),
            preserve_on_delete=False,
        )
        # aws_eks_v2.Addon has no Pod Identity property yet; AWS::EKS::Addon does.
        cfn_addon = self.addon.node.default_child
        assert isinstance(cfn_addon, cdk.CfnResource)
        cfn_addon.add_property_override(
            "PodIdentityAssociations",
            [{"RoleArn": self.role.role_arn, "ServiceAccount": CLOUDWATCH_SERVICE_ACCOUNT}],
        )
        # The groups exist before the agents write (auto_create_group false for the metrics group).
        for group in self.log_groups.values():
            self.addon.node.add_dependency(group)


def _search(
    namespace: str, dimensions: tuple[str, ...], metric: str, filters: dict[str, str], stat: str
) -> str:
    schema = ",".join((namespace, *dimensions))
    where = " ".join(f'{k}="{v}"' for k, v in filters.items())
    return f"SEARCH('{{{schema}}} MetricName=\"{metric}\" {where}', '{stat}', 60)"


_NODE_DIMS = ("ClusterName", "InstanceId", "NodeName")


class TrainingDashboard(Construct):
    """One CloudWatch dashboard per environment; SEARCH expressions draw one line per node or run,
    so nodes that come and go (scale-from-zero, repairs) appear without a redeploy."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        dashboard_name: str,
        cluster_name: str,
        metrics_log_group: str,
    ) -> None:
        super().__init__(scope, construct_id)
        on_cluster = {"ClusterName": cluster_name}

        def lines(title: str, series: list[tuple[str, str]], unit: str = "") -> cw.GraphWidget:
            """One graph of (expression, label) pairs on the left axis."""
            return cw.GraphWidget(
                title=title,
                left=[
                    cw.MathExpression(
                        expression=expression, using_metrics={}, label=label, period=Duration.minutes(1)
                    )
                    for expression, label in series
                ],
                left_y_axis=cw.YAxisProps(label=unit, show_units=False) if unit else None,
                width=12,
                height=6,
            )

        def graph(title: str, expression: str, label: str, unit: str = "") -> cw.GraphWidget:
            return lines(title, [(expression, label)], unit)

        def node(metric: str, stat: str = "Average") -> str:
            return _search(CONTAINER_INSIGHTS_NAMESPACE, _NODE_DIMS, metric, on_cluster, stat)

        def job(metric: str) -> str:
            return _search(emf.NAMESPACE, emf.DIMENSIONS, metric, on_cluster, "Average")

        self.dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=dashboard_name)
        self.dashboard.add_widgets(
            cw.TextWidget(
                markdown=(
                    f"## Ray Train on EKS: {cluster_name}\n"
                    f"Nodes from Container Insights (`{CONTAINER_INSIGHTS_NAMESPACE}`), the job from "
                    f"the training loop (`{emf.NAMESPACE}`, one line per run; EMF lines in "
                    f"`{metrics_log_group}`). "
                    "`raytrain job status --env …` for the RayJob itself."
                ),
                width=24,
                height=2,
            )
        )
        self.dashboard.add_widgets(
            graph("Job: tokens/s", job(emf.TOKENS_PER_SECOND), "", "tokens/s"),
            graph("Job: MFU", job(emf.MFU), "", "%"),
        )
        # Two searches on one graph: a dynamic label (applied to every series a search returns)
        # tells a run's training line from its held-out one.
        run = f"${{PROP('Dim.{emf.RUN_DIMENSION}')}}"
        self.dashboard.add_widgets(
            lines(
                "Job: loss (training, held-out)",
                [(job(emf.LOSS), f"{run} training"), (job(emf.EVAL_LOSS), f"{run} held-out")],
            ),
            graph("Job: step time", job(emf.STEP_TIME), "", "s"),
        )
        # Held-out figures: one point per evaluation (--eval-every), none on other steps.
        self.dashboard.add_widgets(
            graph("Job: held-out perplexity", job(emf.EVAL_PERPLEXITY), ""),
            graph("Job: held-out token accuracy", job(emf.EVAL_ACCURACY), "", "%"),
        )
        self.dashboard.add_widgets(
            graph("GPU utilisation per node", node("node_gpu_utilization"), "", "%"),
            graph("GPU memory used per node", node("node_gpu_memory_utilization"), "", "%"),
        )
        self.dashboard.add_widgets(
            graph("EFA bytes in per node", node("node_efa_rx_bytes"), "", "bytes/s"),
            graph("EFA bytes out per node", node("node_efa_tx_bytes"), "", "bytes/s"),
        )
        self.dashboard.add_widgets(
            graph(
                "Nodes",
                _search(
                    CONTAINER_INSIGHTS_NAMESPACE,
                    ("ClusterName",),
                    "cluster_node_count",
                    on_cluster,
                    "Maximum",
                ),
                "",
                "nodes",
            ),
            graph(
                "Failed nodes",
                _search(
                    CONTAINER_INSIGHTS_NAMESPACE,
                    ("ClusterName",),
                    "cluster_failed_node_count",
                    on_cluster,
                    "Maximum",
                ),
                "",
                "nodes",
            ),
        )

        def latest(title: str, fields: list[str], *filters: str) -> cw.LogQueryWidget:
            """The newest 20 step lines of the metrics log group with these fields."""
            return cw.LogQueryWidget(
                title=title,
                log_group_names=[metrics_log_group],
                query_lines=[f"fields @timestamp, {emf.RUN_DIMENSION}, Step, {', '.join(fields)}",
                             *filters, "sort @timestamp desc", "limit 20"],
                width=24,
                height=6,
            )  # fmt: skip

        evals = [emf.EVAL_LOSS, emf.EVAL_PERPLEXITY, emf.EVAL_ACCURACY]
        self.dashboard.add_widgets(latest("Latest steps", [emf.LOSS, emf.TOKENS_PER_SECOND, emf.MFU, *evals]))
        # Evaluations are sparse (every --eval-every steps): the latest steps seldom hold one.
        self.dashboard.add_widgets(
            latest("Latest evaluations", [emf.LOSS, *evals], f"filter ispresent({emf.EVAL_LOSS})")
        )

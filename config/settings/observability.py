"""Settings of the `observability:` section: node health and repair, metrics and the dashboard."""

from __future__ import annotations

from typing import Literal

from config.settings.base import SettingsModel


class ObservabilitySettings(SettingsModel):
    """How the environment sees and heals its GPU fleet (cdk_constructs/observability.py)."""

    # EKS node monitoring agent (add-on): sets NodeConditions for kernel, network, storage and
    # GPU (NVIDIA XID / DCGM) faults that auto-repair acts on.
    node_monitoring: bool = True
    # Managed node group auto-repair on the GPU group: EKS replaces or reboots unhealthy GPU
    # nodes, one at a time. Without node_monitoring it sees only Ready, not GPU faults.
    gpu_node_auto_repair: bool = True
    # CloudWatch Container Insights with enhanced observability (add-on; GPU metrics from DCGM,
    # EFA metrics, container logs), the training job's step metrics, and a dashboard. Costs per
    # observation and per GB of logs: opt-in per environment.
    metrics: bool = False
    # With node_monitoring and metrics both on, which DCGM host engine the metrics exporter uses
    # (docs/node-health.md): `shared`, the node monitoring agent's dcgm-server (one engine per GPU
    # node, as NVIDIA supports; but an exporter that crashes nv-hostengine, NVIDIA/dcgm-exporter#273,
    # then reads as a GPU fault and auto-repair replaces the node), or `exporter`, its own embedded
    # engine beside dcgm-server (two engines per node, which NVIDIA does not support; a crash stays
    # in the metrics pod).
    dcgm_engine: Literal["shared", "exporter"] = "shared"
    # CloudWatch Logs retention of the Container Insights and step-metric log groups.
    log_retention_days: Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365] = 30

"""One DCGM host engine per GPU node when node health and Container Insights both run (prod).

The node monitoring agent's `dcgm-server` (nv-hostengine) must stay: the agent connects to it for
the GPU health that auto-repair acts on, and its chart renders it unconditionally. The CloudWatch
add-on's dcgm-exporter starts an embedded engine of its own unless it is given a remote one, and
NVIDIA does not support two engines on one machine ("may lead to deadlocks in the driver",
NVIDIA/DCGM#108; the profiling module cannot be shared, NVIDIA/dcgm-exporter#7). So the exporter
becomes a client of `dcgm-server`, as in NVIDIA's GPU Operator (its `nvidia-dcgm` Service with
internalTrafficPolicy Local, assets/state-dcgm/0500_service.yaml, and the exporter's
DCGM_REMOTE_HOSTENGINE_INFO=nvidia-dcgm:5555):

- `engine_service()`: a ClusterIP Service in front of the `dcgm-server` pods with
  internalTrafficPolicy Local, so a pod reaches the engine of its own node and never another
  node's (whose GPUs it would then report under this node's name).
- `exporter_patch()`: `spec.args` of the add-on's DcgmExporter resource. The chart renders no
  `args` (only a fixed `env`), so EKS's server-side apply does not manage that field, and EKS
  documents that fields it does not manage may be changed "without issue" (EKS User Guide,
  kubernetes-field-management). The add-on's operator turns each `args` entry into `--key=value`
  on the exporter container (aws/amazon-cloudwatch-agent-operator v3.6.0,
  internal/manifests/dcgmexporter/container.go). The DaemonSet itself is never touched.

tests/test_dcgm_engine.py proves each link against the charts, the CRD and the operator's rule.
"""

from __future__ import annotations

import json
from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from config.names import (
    CLOUDWATCH_NAMESPACE,
    DCGM_ENGINE_PORT,
    DCGM_ENGINE_SERVICE,
    DCGM_REMOTE_ENGINE_FLAG,
    DCGM_SERVER_LABELS,
    NODE_MONITORING_NAMESPACE,
    PART_OF,
    PART_OF_LABEL,
    dcgm_engine_address,
)

# The add-on's DcgmExporter custom resource: its chart names it dcgm-exporter
# (templates/_helpers.tpl "dcgm-exporter.name", dcgmExporter.name unset).
DCGM_EXPORTER_RESOURCE = "dcgmexporters.cloudwatch.aws.amazon.com/dcgm-exporter"


def engine_service() -> dict[str, Any]:
    """The node-local Service in front of dcgm-server (selector: the chart's pod labels)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": DCGM_ENGINE_SERVICE,
            "namespace": NODE_MONITORING_NAMESPACE,
            "labels": {PART_OF_LABEL: PART_OF},
        },
        "spec": {
            "type": "ClusterIP",
            # Traffic from a pod goes to an endpoint on the same node, or nowhere
            # (Kubernetes "Service Internal Traffic Policy").
            "internalTrafficPolicy": "Local",
            "selector": dict(DCGM_SERVER_LABELS),
            "ports": [
                {"name": "dcgm", "port": DCGM_ENGINE_PORT, "targetPort": DCGM_ENGINE_PORT, "protocol": "TCP"}
            ],
        },
    }


def exporter_patch() -> dict[str, Any]:
    """JSON merge patch (RFC 7386) naming dcgm-server's engine as the exporter's."""
    return {"spec": {"args": {DCGM_REMOTE_ENGINE_FLAG: dcgm_engine_address()}}}


def exporter_restore_patch() -> dict[str, Any]:
    """Removes only our key again (null deletes it in a merge patch)."""
    return {"spec": {"args": {DCGM_REMOTE_ENGINE_FLAG: None}}}


class SharedDcgmEngine(Construct):
    """The Service and the DcgmExporter patch; after both add-ons (the patch needs the resource)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.ICluster,
        engine_addon: eks.Addon,
        exporter_addon: eks.Addon,
    ) -> None:
        super().__init__(scope, construct_id)
        self.service = eks.KubernetesManifest(
            self, "EngineService", cluster=cluster, manifest=[engine_service()], overwrite=True
        )
        self.service.node.add_dependency(engine_addon)
        self.patch = eks.KubernetesPatch(
            self,
            "ExporterUsesEngine",
            cluster=cluster,
            resource_name=DCGM_EXPORTER_RESOURCE,
            resource_namespace=CLOUDWATCH_NAMESPACE,
            # A custom resource takes no strategic merge patch; a merge patch adds one map key.
            patch_type=eks.PatchType.MERGE,
            apply_patch=exporter_patch(),
            restore_patch={},  # written below
        )
        # The restore patch needs a JSON null, but jsii turns Python's None into "undefined",
        # which the property's JSON drops: {"spec":{"args":{}}} would leave the flag behind (and
        # the exporter pointed at an engine that is gone when node monitoring is turned off).
        # The handler hands this string to `kubectl patch -p` as it is.
        custom = self.patch.node.default_child
        assert custom is not None
        cfn = custom.node.default_child
        assert isinstance(cfn, cdk.CfnResource)
        cfn.add_property_override(
            "RestorePatchJson", json.dumps(exporter_restore_patch(), separators=(",", ":"))
        )
        self.patch.node.add_dependency(exporter_addon, self.service)

"""Typed settings: one validated object per environment.

Everything the stacks, the cdk8s chart and the RayJob need comes from here. An environment file
(`config/environments/<name>.yaml`) is parsed into `Settings`; unknown keys and bad values stop
synthesis with one message naming the file, the field and what would be valid (see `loader.py`).

One module per section: `infrastructure` (VPC, cluster, node groups, add-ons, storage), `workload`
(the Ray pods and the RayJob), `pipeline`, `observability`, and `root` (the `Settings` model and
its cross-section checks); `base` holds the strict base model and `FieldError`. Import from
`config.settings`.
"""

from config.settings.base import AZ_RE, SEMVER_RE, FieldError, SettingsModel
from config.settings.infrastructure import (
    CAPACITY_RESERVATION_RE,
    KUBECTL_LAYERS,
    AddonSettings,
    CapacityType,
    ChartVersion,
    Cidr,
    ClusterSettings,
    EndpointAccess,
    GpuNodeSettings,
    InstanceTypeName,
    RegistrySettings,
    RemovalPolicy,
    StorageSettings,
    SystemNodeSettings,
    VpcSettings,
)
from config.settings.observability import ObservabilitySettings
from config.settings.pipeline import PipelineSettings
from config.settings.root import Settings
from config.settings.workload import (
    ClusterMode,
    JobSettings,
    LoraSettings,
    ModelInit,
    Sharding,
    Transport,
    WorkloadSettings,
)

__all__ = [
    "AZ_RE",
    "CAPACITY_RESERVATION_RE",
    "KUBECTL_LAYERS",
    "SEMVER_RE",
    "AddonSettings",
    "CapacityType",
    "ChartVersion",
    "Cidr",
    "ClusterMode",
    "ClusterSettings",
    "EndpointAccess",
    "FieldError",
    "GpuNodeSettings",
    "InstanceTypeName",
    "JobSettings",
    "LoraSettings",
    "ModelInit",
    "ObservabilitySettings",
    "PipelineSettings",
    "RegistrySettings",
    "RemovalPolicy",
    "Settings",
    "SettingsModel",
    "Sharding",
    "StorageSettings",
    "SystemNodeSettings",
    "Transport",
    "VpcSettings",
    "WorkloadSettings",
]

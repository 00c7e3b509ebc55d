"""Names that several packages must agree on, written once.

The node groups (cdk_constructs), the Helm add-ons, the cdk8s chart (k8s), the stacks and the
operator commands (raytrain) all refer to these: a node label the node group sets is the one the
device plugins and the Ray pods select, the release the cluster stack installs is the Deployment
`raytrain verify` looks for. A plain module (standard library only), so every side can use it.
"""

from __future__ import annotations

from dataclasses import dataclass

# --- Nodes ----------------------------------------------------------------------------------------

NODE_ROLE_LABEL = "role"
GPU_NODE_ROLE = "gpu-worker"
SYSTEM_NODE_ROLE = "system"
# The NVIDIA device plugin's DaemonSet selects nodes by this label (its chart's default affinity
# matches it too): a GPU node without it advertises no `nvidia.com/gpu`.
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_NODE_LABELS = {NODE_ROLE_LABEL: GPU_NODE_ROLE, GPU_PRESENT_LABEL: "true"}
SYSTEM_NODE_LABELS = {NODE_ROLE_LABEL: SYSTEM_NODE_ROLE}
# Only pods that tolerate it land on GPU nodes.
GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "present"

# Label the autoscaler reads to know a node is a GPU node whose GPUs are not advertised yet (the
# device plugin starts after the node is Ready): without it, it sees a Ready node that cannot take
# the pending pod and starts another ("Special note on GPU instances", AWS README). A node group
# label (cdk_constructs/node_groups.py), so every GPU node has it from the start.
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"


def accelerator_label_value(gpu_model: str) -> str:
    """The accelerator label's value for a GPU model (e.g. nvidia-l4)."""
    return f"nvidia-{gpu_model.lower()}"


# Extended resources the device plugins advertise.
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"

# --- Add-ons --------------------------------------------------------------------------------------

# Both device-plugin charts go into kube-system, each released under its chart's name.
DEVICE_PLUGIN_NAMESPACE = "kube-system"
NVIDIA_DEVICE_PLUGIN_CHART = "nvidia-device-plugin"
EFA_DEVICE_PLUGIN_CHART = "aws-efa-k8s-device-plugin"
# The KubeRay operator's namespace and Helm release; its chart names the Deployment after the
# release (fullnameOverride unset), which is what `raytrain verify` reads.
KUBERAY_NAMESPACE = "kuberay-system"
KUBERAY_CHART = "kuberay-operator"
KUBERAY_RELEASE = "kuberay-operator"

# The EKS add-on eks-node-monitoring-agent runs two DaemonSets in kube-system (its chart's
# templates/daemonset.yaml and dcgm-daemonset.yaml, aws/eks-node-monitoring-agent v1.7.0): the
# agent, and `dcgm-server`, the DCGM host engine (nv-hostengine, host port 5555) that the agent's
# NVIDIA monitor connects to on GPU nodes. The agent reports GPU health as this node condition,
# which managed node group auto-repair acts on (EKS User Guide, node-health).
NODE_MONITORING_NAMESPACE = "kube-system"
NODE_MONITORING_AGENT = "eks-node-monitoring-agent"
DCGM_SERVER = "dcgm-server"
DCGM_SERVER_LABELS = {"k8s-app": DCGM_SERVER, "version": "v1"}
ACCELERATED_HARDWARE_CONDITION = "AcceleratedHardwareReady"
# dcgm-server's nv-hostengine listens here (`-b ALL`, containerPort and hostPort 5555).
DCGM_ENGINE_PORT = 5555
# Our ClusterIP Service in front of dcgm-server with internalTrafficPolicy Local: a client pod
# reaches the engine of its own node only (cdk_constructs/dcgm_engine.py, docs/node-health.md).
DCGM_ENGINE_SERVICE = "dcgm-hostengine"
# The CloudWatch observability add-on's namespace, and the image repository of its DCGM exporter
# (chart amazon-cloudwatch-observability 6.4.0, values dcgmExporter.image.repository), whose pods
# run a DCGM host engine of their own unless told to use another: the flag
# --remote-hostengine-info (-r) or its environment variable (NVIDIA/dcgm-exporter pkg/cmd/app.go).
CLOUDWATCH_NAMESPACE = "amazon-cloudwatch"
DCGM_EXPORTER_IMAGE = "dcgm-exporter"
DCGM_REMOTE_ENGINE_ENV = "DCGM_REMOTE_HOSTENGINE_INFO"
DCGM_REMOTE_ENGINE_FLAG = "remote-hostengine-info"


def dcgm_engine_address() -> str:
    """host:port of the node-local DCGM host engine, as a pod in another namespace names it."""
    return f"{DCGM_ENGINE_SERVICE}.{NODE_MONITORING_NAMESPACE}.svc:{DCGM_ENGINE_PORT}"


# --- The Ray workload -----------------------------------------------------------------------------

# Default namespace of the Ray pods (settings: workload.namespace).
RAY_NAMESPACE = "ray"
# The Kubernetes service account of the Ray pods, bound to the IAM role by Pod Identity.
SERVICE_ACCOUNT = "ray-train"
# `app.kubernetes.io/part-of` of everything this app creates in Kubernetes.
PART_OF_LABEL = "app.kubernetes.io/part-of"
PART_OF = "ray-train"
# Label of the team namespaces whose RayJobs Kueue manages even without a queue label (they stay
# suspended until given a queue): the namespaces of own-cluster jobs (cdk_constructs/kueue.py).
QUEUED_NAMESPACE_LABEL = "ray-train/queued"
# The job submitter pod of every RayJob (K8sJobMode: it only runs `ray job submit` and follows the
# logs): its requests (k8s/job.py), which Kueue counts beside the head on the system flavor
# (k8s/kueue.py) and the system node group must hold (config/settings/queueing.py).
SUBMITTER_CPU_MILLIS = 500
SUBMITTER_MEMORY_MIB = 1024
# The standing RayCluster's name (job.cluster: standing).
STANDING_CLUSTER_NAME = "ray-train"
# Labels of every RayJob: its checkpoint run name, and who applied it (the Workload stack's
# `cdk deploy`, or `raytrain job submit`). `raytrain job` selects the jobs by PART_OF_LABEL.
RUN_NAME_LABEL = "ray-train/run-name"
STEP_LABEL = "ray-train/step"
ORIGIN_LABEL = "ray-train/origin"
DEPLOYED, SUBMITTED = "deployed", "submitted"
# Deployed RayJobs are named rj-<run>-<hash> (k8s/job.py); submitted ones never start with it.
DEPLOYED_JOB_PREFIX = "rj-"
# A ConfigMap of the Workload stack that owns every submitted RayJob (ownerReferences), so that
# deleting the stack deletes them while the KubeRay operator still runs (k8s/chart.py).
JOBS_ANCHOR = "ray-train-jobs"
# The Workload stack's custom resource that drains the submitted RayJobs on stack delete
# (cdk_constructs/job_drain.py); `raytrain review` guards it and the manifest holding JOBS_ANCHOR.
JOB_DRAIN_RESOURCE_TYPE = "Custom::RayJobDrain"
# Kubernetes groups that EKS access entries of type STANDARD map IAM principals to (EKS API
# reference, CreateAccessEntry kubernetesGroups: a name may not start with `system:`); Roles in
# the Ray namespace are bound to them (k8s/rbac.py). Submitters run `raytrain job`; the drainer is
# the Workload stack's function that deletes submitted jobs on destroy and waits for them.
JOB_SUBMITTER_GROUP = "ray-train:job-submitters"
JOB_DRAINER_GROUP = "ray-train:job-drainer"


def team_submitter_group(team: str, *, implicit: bool = False) -> str:
    """The Kubernetes group of a team's submitters; the implicit team (no `teams:` section) keeps
    the group every submitter was in before teams existed."""
    return JOB_SUBMITTER_GROUP if implicit else f"ray-train:{team}:job-submitters"


# --- The pipeline's in-VPC verification -----------------------------------------------------------


def arn_partition(region: str) -> str:
    """The ARN partition of a region (ARNs built from settings, across accounts)."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


@dataclass(frozen=True)
class VerifyBuild:
    """The in-VPC verification of one environment: what its PipelineAccess stack creates
    (stacks/pipeline/access.py) and what the pipeline's step in another account drives
    (`raytrain pipeline-verify`). Physical names, so neither side needs the other's outputs."""

    account: str
    region: str
    stack_prefix: str

    # The checkout is uploaded to one key of a versioned bucket; the build names the version.
    SOURCE_KEY = "source/checkout.zip"

    @property
    def partition(self) -> str:
        return arn_partition(self.region)

    @property
    def project(self) -> str:
        return f"{self.stack_prefix}-verify"

    @property
    def project_arn(self) -> str:
        return f"arn:{self.partition}:codebuild:{self.region}:{self.account}:project/{self.project}"

    @property
    def log_group(self) -> str:
        return f"/aws/codebuild/{self.project}"

    @property
    def bucket(self) -> str:
        # At most 62 characters: a stack prefix of 29 (RayTrain- and a 20-character environment).
        return f"{self.stack_prefix}-vsrc-{self.account}-{self.region}".lower()

    @property
    def starter_role(self) -> str:
        return f"{self.stack_prefix}-pipeline-verify-starter"

    @property
    def starter_role_arn(self) -> str:
        return f"arn:{self.partition}:iam::{self.account}:role/{self.starter_role}"

"""Pod-template pieces shared by the Ray head, the GPU workers and the job submitter.

cdk8s-cli generates one family of classes per place a pod template appears in the KubeRay CRDs
(the RayCluster's head and worker groups, the same under a RayJob's `rayClusterSpec`, the RayJob's
`submitterPodTemplate`); the schemas are the same. `SpecTypes` picks a family by its name prefix,
so every pod is built by the same helpers and checked by the generated types.
"""

from __future__ import annotations

from typing import Any

from config.names import PART_OF, PART_OF_LABEL

COMPONENT = "app.kubernetes.io/component"
HEAD, WORKER, SUBMITTER = "ray-head", "ray-worker", "job-submitter"


def aws_region_env(region: str) -> dict[str, str]:
    """The environment's region for the AWS SDKs in a Ray pod. The Pod Identity webhook injects
    credentials only (AWS_CONTAINER_CREDENTIALS_FULL_URI and the token file; EKS User Guide, "Learn
    how EKS Pod Identity grants pods access to AWS services"), no region: without one, boto3 (Ray's
    s3:// working_dir download) has none and the AWS CLI fails, and pyarrow's S3 filesystem starts
    at the us-east-1 endpoint and follows redirects, which the NetworkPolicy blocks when
    workload.s3_cidrs is set. botocore reads AWS_DEFAULT_REGION; the AWS SDKs for other languages
    and the CRT read AWS_REGION (AWS SDKs and Tools Reference Guide, "AWS Region"): both, one value."""
    return {"AWS_REGION": region, "AWS_DEFAULT_REGION": region}


def labels(component: str) -> dict[str, str]:
    return {PART_OF_LABEL: PART_OF, COMPONENT: component}


class SpecTypes:
    """One family of generated classes: `t("SpecContainers")` is `<prefix>SpecContainers`.

    The RayCluster CRD and the RayJob CRD's `rayClusterSpec` have the same schema, but cdk8s-cli
    generates separate classes for each (`RayClusterSpecHeadGroupSpec...` and
    `RayJobSpecRayClusterSpecHeadGroupSpec...`); the RayJob's submitter pod template has its own
    (`RayJobSpecSubmitterPodTemplate...`). The builders take the family, so the standing cluster,
    the job's copy and the submitter are the same code, all checked by the generated types.
    """

    def __init__(self, module: Any, prefix: str) -> None:
        self._module = module
        self._prefix = prefix

    def __call__(self, suffix: str) -> Any:
        return getattr(self._module, self._prefix + suffix)

    def sub(self, infix: str) -> SpecTypes:
        return SpecTypes(self._module, self._prefix + infix)


def quantities(t: SpecTypes, kind: str, values: dict[str, str | int]) -> Any:
    cls = t(f"SpecContainersResources{kind}")
    return {
        key: cls.from_number(v) if isinstance(v, int) else cls.from_string(v) for key, v in values.items()
    }


def resources(t: SpecTypes, values: dict[str, str | int]) -> Any:
    # requests == limits: Guaranteed QoS, so the kubelet never evicts a training pod for a
    # neighbour and CPU pinning policies apply.
    return t("SpecContainersResources")(
        limits=quantities(t, "Limits", values), requests=quantities(t, "Requests", values)
    )


def empty_dir(t: SpecTypes, name: str, *, memory: bool = False, size_gib: int | None = None) -> Any:
    size = t("SpecVolumesEmptyDirSizeLimit").from_string(f"{size_gib}Gi") if size_gib else None
    return t("SpecVolumes")(
        name=name,
        empty_dir=t("SpecVolumesEmptyDir")(medium="Memory" if memory else None, size_limit=size),
    )


def container_security(t: SpecTypes, add: list[str]) -> Any:
    # No privilege escalation and no capabilities beyond what the pod needs (`add`). The DLC image
    # runs as root, so runAsNonRoot is not set (the kubelet would refuse to start it); a root
    # process without capabilities cannot load modules, change ownership or bypass file modes.
    # The root filesystem stays writable: Ray, pip (runtime_env) and the HF cache write outside
    # /tmp/ray.
    return t("SpecContainersSecurityContext")(
        allow_privilege_escalation=False,
        privileged=False,
        capabilities=t("SpecContainersSecurityContextCapabilities")(drop=["ALL"], add=add or None),
    )


def pod_security(t: SpecTypes) -> Any:
    return t("SpecSecurityContext")(
        seccomp_profile=t("SpecSecurityContextSeccompProfile")(type="RuntimeDefault")
    )


# EKS Pod Identity puts a pod's credentials in at admission, when the pod is created: the webhook adds
# AWS_CONTAINER_CREDENTIALS_FULL_URI and AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (with its projected
# token) to every container and init container (aws/amazon-eks-pod-identity-webhook,
# pkg/handler/handler.go getPodSpecPatch; pkg/constants.go). Associations are eventually consistent
# ("may take several seconds", EKS API reference, CreatePodIdentityAssociation): a pod created in
# that window is admitted without them and never gets them. This init container fails such a pod,
# which with restartPolicy Never ends in phase Failed; KubeRay deletes a Failed Ray pod and creates
# a new one (ray-operator v1.7.0, raycluster_controller.go shouldDeletePod), admitted anew.
POD_IDENTITY_CHECK = "pod-identity-check"
POD_IDENTITY_ENV = ("AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
_POD_IDENTITY_SCRIPT = (
    'if [ -n "$AWS_CONTAINER_CREDENTIALS_FULL_URI" ] && [ -s "$AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE" ]; '
    "then exit 0; fi; "
    'echo "no EKS Pod Identity credentials in this pod (created before its association was in effect?): '
    'failing it so that KubeRay creates a new one" >&2; exit 1'
)


def pod_identity_check(t: SpecTypes, image: str) -> Any:
    """An init container that fails the pod unless Pod Identity gave it credentials (above). The
    pod's own image (pulled for the Ray container anyway); requests == limits keeps Guaranteed QoS."""
    amounts = {"cpu": "100m", "memory": "64Mi"}
    return t("SpecInitContainers")(
        name=POD_IDENTITY_CHECK,
        image=image,
        image_pull_policy="IfNotPresent",
        command=["/bin/sh", "-c", _POD_IDENTITY_SCRIPT],
        resources=t("SpecInitContainersResources")(
            limits={k: t("SpecInitContainersResourcesLimits").from_string(v) for k, v in amounts.items()},
            requests={k: t("SpecInitContainersResourcesRequests").from_string(v) for k, v in amounts.items()},
        ),
        security_context=t("SpecInitContainersSecurityContext")(
            allow_privilege_escalation=False,
            privileged=False,
            capabilities=t("SpecInitContainersSecurityContextCapabilities")(drop=["ALL"]),
        ),
    )

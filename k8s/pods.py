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

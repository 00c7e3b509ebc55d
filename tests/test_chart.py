"""The workload chart: schema validity of every rendered object, the RayCluster and the RayJob
(the invariants of issue 3). Network policies, Pod Identity and the review files:
tests/test_chart_network.py; the variants rendered: tests/chart_render.py."""

from __future__ import annotations

import copy

import cdk8s
import kubernetes_validate
import pytest

from config.catalogue import CATALOGUE
from k8s import chart as wl
from tests.chart_render import (
    ALL,
    CHECKPOINT_URI,
    CODE_HASH,
    CODE_URI,
    cluster_spec,
    crd_errors,
    crd_validator,
    env_of,
    head_pod,
    objects,
    render,
    rendered,
    settings_of,
    the,
    variant,
    worker_container,
    worker_group,
)

# --- Schemas --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_ray_objects_match_the_crd_schema(name: str) -> None:
    ray_objects = [o for o in rendered(name) if o["apiVersion"].startswith("ray.io/")]
    assert {o["kind"] for o in ray_objects} >= {"RayJob"}
    for obj in ray_objects:
        assert obj["apiVersion"] == "ray.io/v1"
        errors = crd_errors(obj)
        assert not errors, f"{obj['kind']}: {errors[:5]}"


def test_the_crd_check_catches_a_bad_field() -> None:
    job = copy.deepcopy(the("dev", "RayJob"))
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "two"
    job["spec"]["backoffLimit"] = "1"
    errors = list(crd_validator("RayJob").iter_errors(job))
    assert len(errors) == 2


def test_the_crd_check_evaluates_its_cel_rules() -> None:
    job = copy.deepcopy(the("dev", "RayJob"))
    rule = {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED"}}
    strategy = job["spec"]["deletionStrategy"] = {"deletionRules": [copy.deepcopy(rule), copy.deepcopy(rule)]}
    strategy["onSuccess"] = {"policy": "DeleteCluster"}  # legacy beside rules
    strategy["deletionRules"][0]["condition"]["jobDeploymentStatus"] = "Failed"  # both conditions
    del strategy["deletionRules"][1]["condition"]["jobStatus"]  # no condition at all
    assert [e.split(": ", 1)[0] for e in crd_errors(job)] == [
        ".spec.deletionStrategy",
        ".spec.deletionStrategy.deletionRules[0].condition",
        ".spec.deletionStrategy.deletionRules[1].condition",
    ]
    job["spec"]["managedBy"] = "someone-else"
    assert crd_errors(job)[-1].startswith(".spec.managedBy: the managedBy field value must be")


@pytest.mark.parametrize("name", ALL)
def test_core_objects_are_valid_kubernetes(name: str) -> None:
    version = f"{settings_of(name).cluster.kubernetes_version}.0"
    core = [o for o in rendered(name) if not o["apiVersion"].startswith("ray.io/")]
    kinds = {"Namespace", "ServiceAccount", "NetworkPolicy", "ConfigMap", "Role", "RoleBinding"}
    assert {o["kind"] for o in core} == kinds  # the Roles: k8s/rbac.py
    (anchor,) = objects(name, "ConfigMap")
    assert anchor["metadata"]["finalizers"] == ["foregroundDeletion"]  # submitted jobs go first
    for obj in core:
        kubernetes_validate.validate(obj, version, strict=True)


def test_kubernetes_validate_catches_a_bad_policy() -> None:
    policy = copy.deepcopy(objects("dev", "NetworkPolicy")[0])
    policy["spec"]["policyTypes"] = "Ingress"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(policy, "1.35.0", strict=True)


# --- RayCluster -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_cluster_follows_settings(name: str) -> None:
    s = settings_of(name)
    spec = cluster_spec(name)
    assert spec["rayVersion"] == s.workload.ray_version
    assert spec["authOptions"] == {"mode": "token"}
    assert spec["enableInTreeAutoscaling"] is False
    images = {c["image"] for c in head_pod(name)["containers"]} | {worker_container(name)["image"]}
    assert images == {s.ray_image_ref}


def test_image_digest_pins_the_image() -> None:
    digest = "sha256:" + "ab" * 32
    s = variant("dev", workload={"image_digest": digest})
    job = next(o for o in render(s) if o["kind"] == "RayJob")
    pods = [job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]]
    pods += [g["template"]["spec"] for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]]
    pods.append(job["spec"]["submitterPodTemplate"]["spec"])
    for pod in pods:
        assert pod["containers"][0]["image"] == f"{s.image_source.resolve(s.workload.image)}@{digest}"


@pytest.mark.parametrize("name", ALL)
def test_head_runs_on_system_nodes_without_gpus_or_tasks(name: str) -> None:
    s = settings_of(name)
    group = cluster_spec(name)["headGroupSpec"]
    pod = head_pod(name)
    (container,) = pod["containers"]
    assert group["rayStartParams"] == {"num-cpus": "0", "num-gpus": "0"}
    assert group["serviceType"] == "ClusterIP"
    assert pod["nodeSelector"] == {"role": "system"}
    assert "tolerations" not in pod
    assert env_of(container)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert {p["containerPort"] for p in container["ports"]} == {6379, 8265, 10001}
    assert all("hostPort" not in p for p in container["ports"])
    quantities = {"cpu": f"{s.workload.head_cpu_millis}m", "memory": f"{s.workload.head_memory_mib}Mi"}
    assert container["resources"] == {"limits": quantities, "requests": quantities}
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/tmp/ray"]]["emptyDir"] == {}


@pytest.mark.parametrize("name", ALL)
def test_worker_group_matches_the_catalogue(name: str) -> None:
    s = settings_of(name)
    itype = CATALOGUE[s.gpu_nodes.instance_type]
    group = worker_group(name)
    container = worker_container(name)
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == s.job.nodes
    assert group["rayStartParams"]["num-gpus"] == str(itype.gpus)
    assert limits["nvidia.com/gpu"] == itype.gpus
    # Guaranteed QoS: requests == limits, sized below what the node can allocate.
    assert limits == requests
    cpu = itype.allocatable_cpu_millis() - s.workload.gpu_node_daemon_cpu_millis
    memory = itype.allocatable_memory_mib() - s.workload.gpu_node_daemon_memory_mib
    assert limits["cpu"] == f"{cpu}m"
    assert limits["memory"] == f"{memory}Mi"
    assert memory < itype.memory_gib * 1024 * 0.95
    assert int(group["rayStartParams"]["num-cpus"]) <= cpu // 1000
    if s.gpu_nodes.efa:
        assert limits["vpc.amazonaws.com/efa"] == itype.efa_interfaces
    else:
        assert "vpc.amazonaws.com/efa" not in limits


def test_p5_variant_requests_all_32_efa_interfaces() -> None:
    limits = worker_container("p5")["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 8
    assert limits["vpc.amazonaws.com/efa"] == 32
    assert worker_group("p5")["rayStartParams"]["num-gpus"] == "8"


@pytest.mark.parametrize("name", ALL)
def test_worker_placement_and_shared_memory(name: str) -> None:
    s = settings_of(name)
    pod = worker_group(name)["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "gpu-worker"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
    ]
    mounts = {m["mountPath"]: m["name"] for m in worker_container(name)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": f"{s.workload.shm_size_gib}Gi",
    }
    assert volumes[mounts["/tmp/ray"]]["emptyDir"] == {}


@pytest.mark.parametrize("name", ALL)
def test_head_object_store_has_memory_backed_shm(name: str) -> None:
    s = settings_of(name)
    pod = head_pod(name)
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": f"{s.workload.head_shm_size_gib}Gi",
    }
    # It counts against the head's memory limit.
    assert (
        s.workload.head_shm_size_gib * 1024
        <= int(container["resources"]["limits"]["memory"].removesuffix("Mi")) // 2
    )


@pytest.mark.parametrize("name", ALL)
def test_worker_nccl_environment(name: str) -> None:
    s = settings_of(name)
    env = env_of(worker_container(name))
    assert env["NCCL_DEBUG"] == "INFO"
    assert env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["NCCL_DEBUG_FILE"] == "/tmp/ray/nccl.%h.%p.log"
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    if s.gpu_nodes.efa:
        assert env["FI_PROVIDER"] == "efa"
        assert env["NCCL_NET_PLUGIN"] == "ofi"
        assert env["RAYTRAIN_EXPECT_TRANSPORT"] == "efa"
    else:
        assert "FI_PROVIDER" not in env
        assert "NCCL_NET_PLUGIN" not in env
        assert env["RAYTRAIN_EXPECT_TRANSPORT"] == "socket"


def test_worker_env_overrides_and_extends_the_defaults() -> None:
    s = variant("dev", workload={"worker_env": {"NCCL_DEBUG": "TRACE", "FI_EFA_USE_DEVICE_RDMA": "1"}})
    env = wl.worker_env(s)
    assert env["NCCL_DEBUG"] == "TRACE"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["FI_PROVIDER"] == "efa"


@pytest.mark.parametrize("name", ALL)
def test_security_contexts(name: str) -> None:
    s = settings_of(name)
    job = the(name, "RayJob")
    pods = {
        "head": head_pod(name),
        "worker": worker_group(name)["template"]["spec"],
        "submitter": job["spec"]["submitterPodTemplate"]["spec"],
    }
    for role, pod in pods.items():
        assert pod["automountServiceAccountToken"] is False, role
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, role
        for container in pod["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, role
            assert ctx["privileged"] is False, role
            assert ctx["capabilities"]["drop"] == ["ALL"], role
            added = ctx["capabilities"].get("add", [])
            # Only EFA workers keep a capability: IPC_LOCK, to pin memory for RDMA.
            expected = ["IPC_LOCK"] if role == "worker" and s.gpu_nodes.efa else []
            assert added == expected, role
    assert pods["head"]["serviceAccountName"] == pods["worker"]["serviceAccountName"] == "ray-train"
    assert the(name, "ServiceAccount")["automountServiceAccountToken"] is False


@pytest.mark.parametrize("name", ALL)
def test_no_service_leaves_the_cluster(name: str) -> None:
    assert not objects(name, "Service")
    assert cluster_spec(name)["headGroupSpec"]["serviceType"] == "ClusterIP"
    assert "enableIngress" not in cluster_spec(name)["headGroupSpec"]


@pytest.mark.parametrize("name", ALL)
def test_everything_lives_in_the_ray_namespace(name: str) -> None:
    ns = settings_of(name).workload.namespace
    assert the(name, "Namespace")["metadata"]["name"] == ns
    team_namespaces = {t.namespace for t in settings_of(name).team_list}
    assert ns in team_namespaces
    assert {o["metadata"]["name"] for o in rendered(name) if o["kind"] == "Namespace"} == team_namespaces
    for obj in rendered(name):
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] in team_namespaces, obj["kind"]


@pytest.mark.parametrize("name", ["dev", "prod"])
def test_every_team_gets_the_same_objects_in_its_namespace(name: str) -> None:
    """Each team its own service account, jobs anchor, Roles and network policies; the RayJob only
    in the first team's (the deployed job)."""

    def kinds(ns: str) -> list[tuple[str, str]]:
        return sorted(
            (o["kind"], o["metadata"]["name"])
            for o in rendered(name)
            if o["kind"] not in ("Namespace", "RayJob") and o["metadata"].get("namespace") == ns
        )

    teams = settings_of(name).team_list
    assert len(teams) == 2
    first, second = teams
    assert kinds(first.namespace) == kinds(second.namespace) != []
    jobs = [o["metadata"]["namespace"] for o in rendered(name) if o["kind"] == "RayJob"]
    assert set(jobs) <= {first.namespace}


def test_namespace_can_be_left_to_the_caller() -> None:
    chart = wl.build_workload_chart(
        cdk8s.App(),
        settings_of("dev"),
        code_uri=CODE_URI,
        code_hash=CODE_HASH,
        checkpoint_uri=CHECKPOINT_URI,
        include_namespace=False,
    )
    assert "Namespace" not in {o["kind"] for o in chart.to_json()}

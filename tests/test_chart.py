"""The workload chart: schema validity of every rendered object and the invariants of issue 3.

Variants: every environment file, a p5.48xlarge variant (8 GPUs, 32 EFA interfaces), a non-EFA
type with efa false, and the standing-cluster mode. Each variant is rendered once per session.
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import cdk8s
import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml

from config.catalogue import CATALOGUE
from config.loader import environment_names, load_settings
from config.names import KUBERAY_NAMESPACE
from config.settings import Settings
from k8s import chart as wl
from k8s import network_policy, pods
from k8s.pods import POD_IDENTITY_CHECK, POD_IDENTITY_ENV

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "k8s" / "crds"
CODE_URI = "s3://cdk-assets-111122223333-us-west-2/0123abcd.zip"
CHECKPOINT_URI = "s3://ray-train-checkpoints-dev/checkpoints"
CODE_HASH = "0123abcd"


def variant(base: str, **changes: dict[str, Any]) -> Settings:
    """A validated copy of an environment with some sections changed (validators run again)."""
    data = load_settings(base).model_dump(mode="json")
    for section, values in changes.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    return Settings.model_validate(data)


VARIANTS: dict[str, Any] = {name: (lambda n=name: load_settings(n)) for name in environment_names()}
P5_NODES = {
    "instance_type": "p5.48xlarge",
    "capacity_reservation_id": "cr-0123456789abcdef0",
    "placement_group": False,
}
VARIANTS["p5"] = lambda: variant("prod", gpu_nodes=P5_NODES)
VARIANTS["g5-no-efa"] = lambda: variant("dev", gpu_nodes={"instance_type": "g5.12xlarge", "efa": False})
VARIANTS["standing"] = lambda: variant("dev", job={"cluster": "standing", "ttl_seconds_after_finished": 0})


@cache
def settings_of(name: str) -> Settings:
    return VARIANTS[name]()


def render(
    settings: Settings,
    *,
    code_uri: str = CODE_URI,
    code_hash: str = CODE_HASH,
    checkpoint_uri: str = CHECKPOINT_URI,
) -> list[dict[str, Any]]:
    app = cdk8s.App()
    chart = wl.build_workload_chart(
        app, settings, code_uri=code_uri, code_hash=code_hash, checkpoint_uri=checkpoint_uri
    )
    return list(chart.to_json())


@cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(render(settings_of(name)))


def objects(name: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in rendered(name) if o["kind"] == kind]


def the(name: str, kind: str) -> dict[str, Any]:
    (obj,) = objects(name, kind)
    return obj


def cluster_spec(name: str) -> dict[str, Any]:
    """The RayCluster spec in force: the job's copy, or the standing cluster's."""
    if settings_of(name).job.cluster == "standing":
        return the(name, "RayCluster")["spec"]
    return the(name, "RayJob")["spec"]["rayClusterSpec"]


def head_pod(name: str) -> dict[str, Any]:
    return cluster_spec(name)["headGroupSpec"]["template"]["spec"]


def worker_group(name: str) -> dict[str, Any]:
    (group,) = cluster_spec(name)["workerGroupSpecs"]
    return group


def worker_container(name: str) -> dict[str, Any]:
    (container,) = worker_group(name)["template"]["spec"]["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


ALL = sorted(VARIANTS)


# --- Schemas --------------------------------------------------------------------------------------


@cache
def crd_validator(kind: str) -> jsonschema.protocols.Validator:
    path = CRDS / f"ray.io_{kind.lower()}s.yaml"
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = version["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(schema)


@cache
def _crd_schema(kind: str) -> dict[str, Any]:
    return crd_validator(kind).schema  # type: ignore[no-any-return]


@cache
def _cel_program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_errors(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """The CRD's x-kubernetes-validations (CEL) rules that `value` breaks, at every level of the
    schema: the API server evaluates them with `self` bound to the value at that level, and
    jsonschema skips them. Transition rules (those naming `oldSelf`) run only on updates
    (Kubernetes, "Validation rules" in Extend the Kubernetes API with CustomResourceDefinitions)."""
    errors = []
    for rule in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            continue
        result = _cel_program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        if result is not True and result != celpy.celtypes.BoolType(True):
            errors.append(f"{path or '.'}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                errors += cel_errors(sub, item, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += cel_errors(schema["items"], item, f"{path}[{i}]")
    return errors


def crd_errors(obj: dict[str, Any]) -> list[str]:
    """Everything the API server's CRD validation would refuse in `obj`: the openAPIV3Schema
    (jsonschema) and its CEL rules."""
    errors = [e.message for e in crd_validator(obj["kind"]).iter_errors(obj)]
    return errors + cel_errors(_crd_schema(obj["kind"]), obj)


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
    strategy = job["spec"]["deletionStrategy"]
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
    assert {o["kind"] for o in core} == {"Namespace", "ServiceAccount", "NetworkPolicy", "ConfigMap"}
    (anchor,) = [o for o in core if o["kind"] == "ConfigMap"]
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
    for obj in rendered(name):
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == ns, obj["kind"]


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


# --- RayJob ---------------------------------------------------------------------------------------


def parsed_entrypoint(job: dict[str, Any]) -> tuple[list[str], dict[str, str], set[str]]:
    words = shlex.split(job["spec"]["entrypoint"])
    command, rest = words[:3], words[3:]
    flags: dict[str, str] = {}
    switches: set[str] = set()
    i = 0
    while i < len(rest):
        if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            flags[rest[i]] = rest[i + 1]
            i += 2
        else:
            switches.add(rest[i])
            i += 1
    return command, flags, switches


@pytest.mark.parametrize("name", ALL)
def test_entrypoint_carries_the_job_settings(name: str) -> None:
    s = settings_of(name)
    command, flags, switches = parsed_entrypoint(the(name, "RayJob"))
    assert command == ["python", "-m", "training"]
    job = s.job
    assert flags == {
        "--run-name": job.run_name,
        "--storage-path": CHECKPOINT_URI,
        "--num-workers": str(s.job.nodes * s.gpu_nodes.instance.gpus),
        "--address": "auto",
        "--max-failures": str(job.max_failures),
        "--checkpoint-every": str(job.checkpoint_every),
        "--keep-checkpoints": str(job.keep_checkpoints),
        "--model": job.model,
        "--init": job.init.value,
        "--shape": job.shape.value,
        "--data": job.data,
        "--seq-len": str(job.seq_len),
        "--global-batch-size": str(job.global_batch_size),
        # `auto` resolved for the node group's GPU by the memory plan (config/memory.py).
        "--micro-batch-size": str(job.micro_batch(s.gpu_nodes.instance)),
        "--steps": str(job.steps),
        "--lr": repr(job.lr),
        "--seed": str(job.seed),
        "--sharding": job.sharding.value,
        "--expect-transport": "auto",
        # CloudWatch step metrics where the environment turns them on (training/emf.py).
        **({"--metrics-cluster": s.cluster.name} if s.observability.metrics else {}),
        # Text or chat data the job prepares itself (k8s/job.py prepared_data_uri).
        **(
            {
                "--text-field": job.text_field,
                "--prepared-data": flags.get("--prepared-data"),
                "--max-skipped-fraction": repr(job.max_skipped_fraction),
                "--data-format": job.data_format.value,
                "--too-long": job.too_long.value,
            }
            if "--prepared-data" in flags
            else {}
        ),
        # Held-out evaluation, only where the job sets it.
        **({"--eval-data": job.eval_data} if job.eval_data else {}),
        **({"--eval-fraction": repr(job.eval_fraction)} if job.eval_fraction else {}),
        **({"--eval-every": str(job.eval_every)} if job.eval_every else {}),
        **({"--early-stop-patience": str(job.early_stop_patience)} if job.early_stop_patience else {}),
    }
    assert switches == {
        "--compile" if job.compile else "--no-compile",
        "--liger" if job.liger else "--no-liger",
        "--float8" if job.float8_on(s.gpu_nodes.instance) else "--no-float8",
        "--export" if job.export else "--no-export",
        *(["--activation-checkpointing"] if job.activation_checkpointing else []),
    }


def test_entrypoint_switches_and_quoting() -> None:
    s = variant(
        "dev",
        job={"compile": True, "liger": True, "activation_checkpointing": True, "data": "/data/a&b;c"},
    )
    job = next(o for o in render(s) if o["kind"] == "RayJob")
    _, flags, switches = parsed_entrypoint(job)
    assert switches == {"--compile", "--liger", "--activation-checkpointing", "--no-float8", "--export"}
    assert flags["--data"] == "/data/a&b;c"
    # Eager layers and the full-logits loss need more memory per token: shorter sequences keep
    # this variant inside dev's L4 (the memory plan would refuse it at 2048, config/memory.py).
    off = variant("dev", job={"compile": False, "liger": False, "seq_len": 512})
    _, _, switches = parsed_entrypoint(next(o for o in render(off) if o["kind"] == "RayJob"))
    assert switches == {"--no-compile", "--no-liger", "--no-float8", "--export"}
    runtime_env = yaml.safe_load(
        next(o for o in render(off) if o["kind"] == "RayJob")["spec"]["runtimeEnvYAML"]
    )
    assert runtime_env == {"working_dir": CODE_URI}


def test_float8_is_on_where_the_gpu_has_fp8_tensor_cores_and_refused_where_it_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def switches_of(s: Any) -> set[str]:
        return parsed_entrypoint(next(o for o in render(s) if o["kind"] == "RayJob"))[2]

    # Unset: on for compiled layers on FP8 tensor cores at micro-batches of >= 16,384 tokens (the
    # smallest measured to pay), so p5's H100s at 8 x 2048 train in float8 and dev's L4s at 1 x 2048
    # in bf16. Explicit either way in the entrypoint: the training CLI's own default never decides.
    p5_big = {"micro_batch_size": 8, "global_batch_size": 128}
    assert "--float8" in switches_of(variant("prod", gpu_nodes=P5_NODES, job=p5_big))
    assert "--no-float8" in switches_of(variant("prod", gpu_nodes=P5_NODES, job={**p5_big, "compile": False}))
    assert "--no-float8" in switches_of(variant("prod", gpu_nodes=P5_NODES))  # 1 x 2048
    assert "--no-float8" in switches_of(variant("dev"))
    assert "--float8" in switches_of(variant("dev", job={"float8": True}))  # L4: FP8 tensor cores
    assert "--no-float8" in switches_of(variant("dev", gpu_nodes={"instance_type": "g5.48xlarge"}))
    with pytest.raises(ValueError, match=r"g5\.48xlarge's A10G GPUs have no FP8.*job\.float8 unset.*false"):
        variant("dev", job={"float8": True}, gpu_nodes={"instance_type": "g5.48xlarge"})
    # torchao reaches the pods in the code asset; without it there, float8 needs an image that has it.
    from config.settings import root

    dev = variant("dev", job={"float8": True}).model_dump(mode="json")
    custom = {
        **dev,
        "workload": {**dev["workload"], "image": "111122223333.dkr.ecr.us-west-2.amazonaws.com/ray:t"},
    }
    no_torchao = dataclasses.replace(
        root.IMAGE, job_packages={k: v for k, v in root.IMAGE.job_packages.items() if k != "torchao"}
    )
    monkeypatch.setattr(root, "IMAGE", no_torchao)
    with pytest.raises(ValueError, match=r"is true, but .* has no torchao.*job\.float8: false"):
        Settings.model_validate(dev)
    assert "--float8" in switches_of(Settings.model_validate(custom))


def test_tokens_are_embedded_not_parsed_and_not_hashed() -> None:
    s = settings_of("dev")
    first = render(s, code_uri="${Token[TOKEN.101]}", checkpoint_uri="${Token[TOKEN.102]}")
    second = render(s, code_uri="${Token[TOKEN.731]}", checkpoint_uri="${Token[TOKEN.732]}")
    job1 = next(o for o in first if o["kind"] == "RayJob")
    job2 = next(o for o in second if o["kind"] == "RayJob")
    assert job1["metadata"]["name"] == job2["metadata"]["name"]
    assert yaml.safe_load(job1["spec"]["runtimeEnvYAML"])["working_dir"] == "${Token[TOKEN.101]}"
    assert parsed_entrypoint(job1)[1]["--storage-path"] == "${Token[TOKEN.102]}"


@pytest.mark.parametrize("name", ALL)
def test_runtime_env_ships_the_code_and_installs_nothing(name: str) -> None:
    # liger-kernel travels inside the code asset (stacks/code_asset.py): no pip, conda or uv
    # runtime_env, so nothing is downloaded and no virtualenv is copied when a job starts.
    runtime_env = yaml.safe_load(the(name, "RayJob")["spec"]["runtimeEnvYAML"])
    assert runtime_env == {"working_dir": CODE_URI}


@pytest.mark.parametrize("name", ALL)
def test_job_lifecycle(name: str) -> None:
    s = settings_of(name)
    spec = the(name, "RayJob")["spec"]
    assert spec["submissionMode"] == "K8sJobMode"
    assert spec["activeDeadlineSeconds"] == s.job.active_deadline_seconds
    # Start-up (GPU nodes from zero, image pull) has its own, shorter budget inside the deadline.
    assert spec["preRunningDeadlineSeconds"] == s.job.start_timeout_seconds < spec["activeDeadlineSeconds"]
    assert spec["backoffLimit"] == s.job.backoff_limit
    submitter = spec["submitterPodTemplate"]
    assert submitter["spec"]["nodeSelector"] == {"role": "system"}
    assert submitter["metadata"]["labels"][pods.COMPONENT] == pods.SUBMITTER
    # Neither mode uses shutdownAfterJobFinishes or its TTL: an own cluster goes by deletion rules
    # (tests/test_job_deletion.py), which KubeRay refuses beside them; a standing one never goes.
    assert "shutdownAfterJobFinishes" not in spec
    assert "ttlSecondsAfterFinished" not in spec
    if s.job.cluster == "own":
        assert spec["deletionStrategy"]["deletionRules"]
        assert "clusterSelector" not in spec
        assert "upgradeStrategy" not in spec["rayClusterSpec"]
        assert not objects(name, "RayCluster")
    else:
        assert "deletionStrategy" not in spec
        assert "rayClusterSpec" not in spec
        cluster = the(name, "RayCluster")
        assert spec["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
        assert cluster["spec"]["upgradeStrategy"] == {"type": "Recreate"}


def test_standing_cluster_and_job_copy_are_the_same_spec() -> None:
    standing = dict(the("standing", "RayCluster")["spec"])
    assert standing.pop("upgradeStrategy") == {"type": "Recreate"}
    assert standing == the("dev", "RayJob")["spec"]["rayClusterSpec"]


@pytest.mark.parametrize("name", ALL)
def test_rayjob_name_is_a_short_dns1035_label(name: str) -> None:
    job_name = the(name, "RayJob")["metadata"]["name"]
    assert len(job_name) <= 47
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", job_name)


def name_of(s: Settings, code_hash: str = CODE_HASH) -> str:
    return wl.rayjob_name(s, code_hash=code_hash)


@pytest.mark.parametrize(
    "changes",
    [
        {"job": {"steps": 400}},
        {"job": {"run_name": "another-run"}},
        {"job": {"backoff_limit": 2}},
        {"job": {"sharding": "hsdp"}},
        {"workload": {"shm_size_gib": 16}},
        {"workload": {"worker_env": {"NCCL_DEBUG": "TRACE"}}},
        {"workload": {"image_digest": "sha256:" + "0" * 64}},
        # Another image with its own Ray (for config/image.toml's image, ray_version must be its Ray).
        {"workload": {"image": "example.com/ray:2.58.1", "ray_version": "2.58.1"}},
        {"gpu_nodes": {"instance_type": "g6e.12xlarge"}},
    ],
    ids=lambda c: ",".join(f"{k}.{next(iter(v))}" for k, v in c.items()),
)
def test_a_changed_job_gets_a_new_name(changes: dict[str, Any]) -> None:
    assert name_of(variant("dev", **changes)) != name_of(settings_of("dev"))


def test_changed_code_gets_a_new_name() -> None:
    assert name_of(settings_of("dev"), "ffff0000") != name_of(settings_of("dev"))


@pytest.mark.parametrize(
    "changes",
    [
        {"tags": {"project": "ray-train-efa", "cost-centre": "ml"}},
        {"system_nodes": {"max_size": 3}},
        {"storage": {"removal_policy": "retain"}},
        {"cluster": {"public_access_cidrs": ["198.51.100.0/24"]}},
        {"gpu_nodes": {"max_size": 4, "root_volume_gib": 400}},
        {"addons": {"nvidia_device_plugin": "0.20.1"}},
    ],
    ids=",".join,
)
def test_an_unrelated_change_keeps_the_name(changes: dict[str, Any]) -> None:
    assert name_of(variant("dev", **changes)) == name_of(settings_of("dev"))


# --- Network policies -----------------------------------------------------------------------------


def _selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return True
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", "extend the evaluator for other operators"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def _peer_matches(peer: dict[str, Any], policy_ns: str, ns: str, labels: dict[str, str]) -> bool:
    if "ipBlock" in peer:
        return False  # pods are addressed by selectors here
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": ns}):
            return False
    elif ns != policy_ns:
        return False
    return _selects(peer.get("podSelector"), labels)


def ingress_allowed(
    policies: list[dict[str, Any]],
    target: dict[str, str],
    source_ns: str,
    source: dict[str, str],
    port: int,
) -> bool:
    """NetworkPolicy ingress semantics, for the selector features the chart uses."""
    ns = policies[0]["metadata"]["namespace"]
    applying = [
        p
        for p in policies
        if "Ingress" in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], target)
    ]
    if not applying:
        return True
    for policy in applying:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(p["port"] == port for p in ports):
                continue
            peers = rule.get("from")
            if peers is None or any(_peer_matches(peer, ns, source_ns, source) for peer in peers):
                return True
    return False


def labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "ray-train", pods.COMPONENT: component}


@pytest.mark.parametrize("name", ALL)
def test_head_ports_are_reached_only_by_ray_pods_submitter_and_operator(name: str) -> None:
    policies = objects(name, "NetworkPolicy")
    ns = settings_of(name).workload.namespace
    head = {**labels(pods.HEAD), "ray.io/node-type": "head"}
    for port in (6379, 8265, 10001):
        assert ingress_allowed(policies, head, ns, labels(pods.WORKER), port)
        assert not ingress_allowed(policies, head, "default", {}, port)
        assert not ingress_allowed(policies, head, ns, {"app": "something-else"}, port)
        assert not ingress_allowed(policies, head, "kube-system", labels(pods.WORKER), port)
        expected = port == 8265
        assert ingress_allowed(policies, head, ns, labels(pods.SUBMITTER), port) is expected
        assert ingress_allowed(policies, head, KUBERAY_NAMESPACE, {}, port) is expected
    # Workers accept Ray traffic from Ray pods only; the submitter accepts nothing.
    assert ingress_allowed(policies, labels(pods.WORKER), ns, labels(pods.HEAD), 12345)
    assert not ingress_allowed(policies, labels(pods.WORKER), ns, labels(pods.SUBMITTER), 12345)
    assert not ingress_allowed(policies, labels(pods.SUBMITTER), ns, labels(pods.HEAD), 8265)


@pytest.mark.parametrize("name", ALL)
def test_default_deny_dns_and_https_egress(name: str) -> None:
    s = settings_of(name)
    policies = {p["metadata"]["name"]: p["spec"] for p in objects(name, "NetworkPolicy")}
    assert policies["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    (dns,) = policies["allow-dns"]["egress"]
    assert dns["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
    egress = policies["ray-nodes"]["egress"]
    https = [r for r in egress if r.get("ports") == [{"port": 443, "protocol": "TCP"}]]
    (rule,) = https
    block = rule["to"][0]["ipBlock"]
    assert block["cidr"] == "0.0.0.0/0"
    vpc = ipaddress.ip_network(s.vpc.cidr)
    excluded = [ipaddress.ip_network(c) for c in block["except"]]
    assert any(vpc.subnet_of(e) for e in excluded)  # type: ignore[arg-type]
    assert (
        ipaddress.ip_network("169.254.169.254/32").subnet_of(ipaddress.ip_network("169.254.0.0/16"))
        and ipaddress.ip_network("169.254.0.0/16") in excluded
    )
    # Every egress rule without ports is to Ray pods only.
    for r in egress:
        if "ports" not in r:
            assert all("podSelector" in peer and "ipBlock" not in peer for peer in r["to"])
    submitter_egress = policies["job-submitter"]["egress"]
    assert submitter_egress[0]["ports"] == [{"port": 8265, "protocol": "TCP"}]


S3_CIDRS = ["52.218.128.0/17", "3.5.76.0/22"]  # shaped like a region's S3 prefix-list entries


def _https_rule(settings: Settings) -> dict[str, Any]:
    ray_nodes = next(
        o for o in render(settings) if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "ray-nodes"
    )
    (rule,) = [r for r in ray_nodes["spec"]["egress"] if r.get("ports") == [{"port": 443, "protocol": "TCP"}]]
    return rule


def test_https_egress_is_s3_only_when_no_model_hub_is_needed() -> None:
    narrow = variant("dev", workload={"s3_cidrs": S3_CIDRS}, job={"model": "s3://models-bucket/qwen2.5-1.5b"})
    assert narrow.job.model_from_hub is False
    assert [peer["ipBlock"] for peer in _https_rule(narrow)["to"]] == [{"cidr": c} for c in S3_CIDRS]


@pytest.mark.parametrize(
    "changes",
    [
        # Config and tokenizer (and weights) from the hub: the hub's addresses are not known.
        {"workload": {"s3_cidrs": S3_CIDRS}},
        # No S3 ranges given: public addresses (S3 through the gateway endpoint is one of them).
        {"job": {"model": "s3://models-bucket/qwen2.5-1.5b"}},
    ],
)
def test_https_egress_stays_public_where_it_must(changes: dict[str, Any]) -> None:
    (peer,) = _https_rule(variant("dev", **changes))["to"]
    assert peer["ipBlock"]["cidr"] == "0.0.0.0/0" and "10.0.0.0/8" in peer["ipBlock"]["except"]


@pytest.mark.parametrize("bad", ["10.0.0.0/8", "52.218.128.1/17", "0.0.0.0/0", "s3"])
def test_s3_cidrs_must_be_public_network_ranges(bad: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="s3_cidrs"):
        variant("dev", workload={"s3_cidrs": [bad]})


def test_vpc_outside_private_ranges_is_excluded_too() -> None:
    assert "100.64.0.0/16" in network_policy._private_ranges("100.64.0.0/16")
    assert "10.16.0.0/16" not in network_policy._private_ranges("10.16.0.0/16")


# --- Review output --------------------------------------------------------------------------------


def test_render_manifests_writes_one_file_per_object(tmp_path: Path) -> None:
    s = settings_of("dev")
    stale = tmp_path / "Old.thing.k8s.yaml"
    stale.write_text("kind: Old\n")
    files = wl.render_manifests(
        s, tmp_path, code_uri=CODE_URI, code_hash=CODE_HASH, checkpoint_uri=CHECKPOINT_URI
    )
    assert not stale.exists()
    docs = [yaml.safe_load(f.read_text()) for f in files]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(
        (o["kind"], o["metadata"]["name"]) for o in rendered("dev")
    )
    assert all(f.parent == tmp_path for f in files)


# --- Pod Identity: a pod admitted before its association took effect is replaced -----------------


def _quantity_equal(resources: dict[str, Any]) -> bool:
    return resources.get("requests") == resources.get("limits") and {"cpu", "memory"} <= set(
        resources["limits"]
    )


@pytest.mark.parametrize("name", ALL)
def test_ray_pods_fail_without_pod_identity_credentials_and_are_replaced(name: str) -> None:
    for role, pod in {"head": head_pod(name), "worker": worker_group(name)["template"]["spec"]}.items():
        (init,) = pod["initContainers"]
        assert init["name"] == POD_IDENTITY_CHECK, role
        # Pulled for the Ray container anyway; the same reference, digest included.
        assert init["image"] == pod["containers"][0]["image"], role
        # A Failed pod (restartPolicy Never) is what KubeRay deletes and creates again.
        assert pod["restartPolicy"] == "Never", role
        # Guaranteed QoS is kept: every container has requests == limits.
        assert _quantity_equal(init["resources"]), role
        assert init["securityContext"]["capabilities"]["drop"] == ["ALL"], role


def _run_check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (init,) = head_pod("dev")["initContainers"]
    return subprocess.run(init["command"], env=env, capture_output=True, text=True, check=False, timeout=30)


def test_the_check_passes_only_with_what_the_webhook_injects(tmp_path: Path) -> None:
    """The init container's own command, run with and without the webhook's variables."""
    token = tmp_path / "eks-pod-identity-token"
    token.write_text("token")
    injected = {
        "PATH": "/usr/bin:/bin",
        POD_IDENTITY_ENV[0]: "http://169.254.170.23/v1/credentials",
        POD_IDENTITY_ENV[1]: str(token),
    }
    assert _run_check(injected).returncode == 0
    missing = _run_check({"PATH": "/usr/bin:/bin"})
    assert missing.returncode == 1 and "no EKS Pod Identity credentials" in missing.stderr
    token.write_text("")
    assert _run_check(injected).returncode == 1, "an empty token file is not credentials"

"""The workload chart's RayJob: its entrypoint carries the job's settings and the CLI reads them
back, its lifecycle, and its name (a changed job or code is a new RayJob). The variants rendered:
tests/chart_render.py."""

from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Any

import pytest
import yaml

from config.checkpointing import checkpoint_interval
from config.settings import Settings
from k8s import chart as wl
from k8s import pods
from tests.chart_render import (
    ALL,
    CHECKPOINT_URI,
    CODE_HASH,
    CODE_URI,
    P5_NODES,
    objects,
    render,
    settings_of,
    the,
    variant,
)

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
    rayjob = the(name, "RayJob")
    command, flags, switches = parsed_entrypoint(rayjob)
    assert command == ["python", "-m", "training"]
    job = s.job
    job_name = rayjob["metadata"]["name"]
    assert flags == {
        # A deployed job's own run, and its name: KubeRay's retries of it resume that run.
        "--run-name": f"{job.run_name}-{job_name.rsplit('-', 1)[1]}",
        "--job-id": job_name,
        "--storage-path": CHECKPOINT_URI,
        "--num-workers": str(s.job.nodes * s.gpu_nodes.instance.gpus),
        "--address": "auto",
        "--max-failures": str(job.max_failures),
        "--checkpoint-every": str(checkpoint_interval(s).steps),
        "--keep-checkpoints": str(job.keep_checkpoints),
        "--model": job.model,
        "--init": job.init.value,
        **({"--shape": job.shape} if job.shape else {}),
        # The dimensions synthesis planned for: the worker checks the model it loads against them.
        "--planned-dims": job.model_plan.dims.signature(),
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
        # CloudWatch step metrics where the environment turns them on (training/reporting/emf.py).
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
        # LoRA's settings as the training CLI reads them (training/model/lora_spec.py LoraSpec.as_args).
        **(
            dict(zip(job.lora_spec.as_args()[::2], job.lora_spec.as_args()[1::2], strict=True))
            if job.lora
            else {}
        ),
    }
    assert switches == {
        *(["--export-merged"] if job.export_merged else []),
        "--compile" if job.compile else "--no-compile",
        "--liger" if job.liger else "--no-liger",
        "--float8" if job.float8_on(s.gpu_nodes.instance) else "--no-float8",
        "--export" if job.export else "--no-export",
        *(["--activation-checkpointing"] if job.activation_checkpointing else []),
    }


def test_lora_job_passes_its_settings_and_the_cli_reads_them_back() -> None:
    from training.model.lora_spec import LoraSpec
    from training.options.train import parse_args

    lora = {"rank": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
    s = variant("dev", job={"model": "Qwen/Qwen2.5-7B", "lora": lora, "export_merged": True})
    _, flags, switches = parsed_entrypoint(next(o for o in render(s) if o["kind"] == "RayJob"))
    assert (flags["--lora-rank"], flags["--lora-alpha"], flags["--lora-dropout"]) == ("8", "16", "0.05")
    assert flags["--lora-targets"] == "q_proj,v_proj" and "--export-merged" in switches
    argv = ["--model", "Qwen/Qwen2.5-7B", "--global-batch-size", "8", "--num-workers", "8"]
    argv += [w for k, v in flags.items() if k.startswith("--lora") for w in (k, v)] + ["--export-merged"]
    opts = parse_args(argv)
    assert opts.lora == LoraSpec(8, 16, 0.05, ("q_proj", "v_proj")) and opts.export_merged


def test_a_redeployed_job_trains_a_new_run_and_resumes_only_when_asked() -> None:
    """Issue 41: dev's smoke job deployed again (a changed job: a new RayJob) must not find the last
    one's checkpoint at step job.steps and train nothing on two GPU nodes: each RayJob trains a run
    of its own, labelled with it; with job.resume every deploy continues job.run_name."""
    first, second = (
        the("dev", "RayJob"),
        next(o for o in render(variant("dev", job={"steps": 60})) if o["kind"] == "RayJob"),
    )
    runs = [parsed_entrypoint(j)[1]["--run-name"] for j in (first, second)]
    assert runs[0] != runs[1] and all(r.startswith("dev-smoke-") for r in runs)
    assert [j["metadata"]["labels"]["ray-train/run-name"] for j in (first, second)] == runs
    assert "--resume" not in parsed_entrypoint(first)[2]
    resumed = next(o for o in render(variant("dev", job={"resume": True})) if o["kind"] == "RayJob")
    _, flags, switches = parsed_entrypoint(resumed)
    assert flags["--run-name"] == "dev-smoke" and "--resume" in switches
    assert flags["--job-id"] == resumed["metadata"]["name"]


def test_entrypoint_switches_and_quoting() -> None:
    s = variant(
        "dev",
        # One node: a path inside the container is refused for several (config/settings/job_rules.py).
        job={
            "compile": True,
            "liger": True,
            "activation_checkpointing": True,
            "data": "/data/a&b;c",
            "nodes": 1,
        },
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
    # prod's job as a full fine-tune of the 1.5B model (its LoRA base is never converted to float8).
    full = {"model": "Qwen/Qwen2.5-1.5B", "lora": None}
    p5_big = {**full, "micro_batch_size": 8, "global_batch_size": 128}
    assert "--float8" in switches_of(variant("prod", gpu_nodes=P5_NODES, job=p5_big))
    assert "--no-float8" in switches_of(variant("prod", gpu_nodes=P5_NODES, job={**p5_big, "compile": False}))
    assert "--no-float8" in switches_of(variant("prod", gpu_nodes=P5_NODES, job=full))  # 1 x 2048
    lora_big = {"micro_batch_size": 8, "global_batch_size": 128}  # prod's LoRA job: never float8
    assert "--no-float8" in switches_of(variant("prod", gpu_nodes=P5_NODES, job=lora_big))
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
    # An own cluster is queued by Kueue and goes when the job ends (tests/test_job_deletion.py);
    # a standing one never goes. Neither uses deletion rules (Kueue needs shutdownAfterJobFinishes).
    assert "deletionStrategy" not in spec
    if s.job.cluster == "own":
        assert spec["shutdownAfterJobFinishes"] is True and spec["suspend"] is True
        assert "clusterSelector" not in spec
        assert "upgradeStrategy" not in spec["rayClusterSpec"]
        assert not objects(name, "RayCluster")
    else:
        assert "shutdownAfterJobFinishes" not in spec
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
        # Up to 4 queued jobs at once then: their heads need 4 system nodes (config/settings/queueing.py).
        {"gpu_nodes": {"max_size": 4, "root_volume_gib": 400}, "system_nodes": {"max_size": 4}},
        {"addons": {"nvidia_device_plugin": "0.20.1"}},
    ],
    ids=",".join,
)
def test_an_unrelated_change_keeps_the_name(changes: dict[str, Any]) -> None:
    assert name_of(variant("dev", **changes)) == name_of(settings_of("dev"))

"""Settings validation: each bad value stops with one message naming the file, field and what is valid."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from config import loader
from config.catalogue import CATALOGUE
from config.loader import SettingsError, environment_names, environments_dir, load_settings, parse_settings

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "config/environments/dev.yaml"


def dev_data() -> dict:
    return YAML(typ="safe", pure=True).load((environments_dir() / "dev.yaml").read_text())


def parse(data: dict):
    import json

    # JSON is YAML, and quotes every string exactly.
    return parse_settings(json.dumps(data), name="dev", source=SOURCE)


def error_of(data: dict) -> str:
    with pytest.raises(SettingsError) as info:
        parse(data)
    message = str(info.value)
    assert message.startswith(SOURCE), message
    assert "Traceback" not in message
    return message


def test_shipped_environments_are_valid():
    """The shipped examples, by name, as shipped (tests/environment_copies.py)."""
    assert {"dev", "prod"} <= set(environment_names())
    for name in ["dev", "prod", "example"]:
        settings = load_settings(name)
        assert settings.name == name
        assert settings.gpu_nodes.availability_zone in settings.vpc.availability_zones


@pytest.mark.parametrize("name", loader.environment_names(loader.ENVIRONMENTS_DIR))
def test_every_environment_of_the_checkout_is_valid(name):
    """Every file of config/environments/ as the checkout has it (a dev.yaml edited as README step 1
    says, a user's own files), by the rules that hold for any environment: it loads from its own
    folder (the checks against the other files included: one cluster per name, one pipeline), its
    GPU zone is one of its zones, in its region, and a pipeline it hosts finds what it deploys."""
    from stacks.app_builder import pipeline_environments

    settings = loader.load_settings(name, loader.ENVIRONMENTS_DIR)
    assert settings.gpu_nodes.availability_zone in settings.vpc.availability_zones
    assert all(zone.startswith(settings.region) for zone in settings.vpc.availability_zones)
    if settings.pipeline is not None and settings.pipeline.enabled:
        assert set(pipeline_environments(settings, loader.ENVIRONMENTS_DIR)) == set(
            settings.pipeline.environments
        )


@pytest.mark.parametrize(
    ("mutate", "field", "hint"),
    [
        (
            lambda d: d["gpu_nodes"].update(instance_type="g6.12xlarg"),
            "gpu_nodes.instance_type",
            "g6.12xlarge",
        ),
        (
            lambda d: d["gpu_nodes"].update(instance_type="g6.xlarge"),
            "gpu_nodes.instance_type",
            "EFA GPU types",
        ),
        (
            lambda d: d["gpu_nodes"].update(availability_zone="us-west-2d"),
            "gpu_nodes.availability_zone",
            "us-west-2a",
        ),
        (
            lambda d: d["vpc"].update(availability_zones=["us-east-1a", "us-east-1b"]),
            "vpc.availability_zones",
            "not in region",
        ),
        (
            lambda d: d["gpu_nodes"].update(min_size=3, max_size=2),
            "gpu_nodes.min_size",
            "greater than max_size",
        ),
        (
            lambda d: d["cluster"].update(kubernetes_version="1.29"),
            "cluster.kubernetes_version",
            "1.34, 1.35, 1.36",
        ),
        (
            lambda d: d["cluster"].update(admin_principal_arns=["arn:aws:iam::12:role/x"]),
            "cluster.admin_principal_arns",
            "IAM role or user ARN",
        ),
        (
            lambda d: d["cluster"].update(public_access_cidrs=["10.0.0.300/8"]),
            "cluster.public_access_cidrs[0]",
            "CIDR",
        ),
        (lambda d: d["vpc"].update(cidr="10.0.0.1/16"), "vpc.cidr", "CIDR"),
        (lambda d: d.update(unknown_field=1), "unknown_field", "unknown field"),
        (lambda d: d["gpu_nodes"].update(efa_interfaces=2), "gpu_nodes.efa_interfaces", "unknown field"),
        (lambda d: d.update(account="1234"), "account", "12-digit"),
        (lambda d: d.update(region="uswest2"), "region", "region name"),
        (
            lambda d: d["gpu_nodes"].update(capacity_reservation_id="cr-1"),
            "gpu_nodes.capacity_reservation_id",
            "cr-",
        ),
        (
            lambda d: d["gpu_nodes"].update(capacity_reservation_id="cr-0123456789abcdef0"),
            "gpu_nodes.placement_group",
            "must be false",
        ),
        (
            lambda d: d["gpu_nodes"].update(capacity_type="CAPACITY_BLOCK"),
            "gpu_nodes.capacity_reservation_id",
            "CAPACITY_BLOCK",
        ),
        (lambda d: d["gpu_nodes"].update(capacity_type="RESERVED"), "gpu_nodes.capacity_type", "ON_DEMAND"),
        (lambda d: d["gpu_nodes"].update(root_volume_gib=100), "gpu_nodes.root_volume_gib", "200"),
        (lambda d: d["system_nodes"].update(root_volume_gib=50), "system_nodes.root_volume_gib", "100"),
        (
            lambda d: d.setdefault("workload", {}).update(head_shm_size_gib=8),
            "workload.head_shm_size_gib",
            "half of head_memory_mib",
        ),
        (
            lambda d: d.setdefault("workload", {}).update(worker_env={"NCCL_DEBUG": "WARN"}),
            "workload.worker_env",
            "NCCL_DEBUG=WARN: the gate needs INFO",
        ),
        (
            lambda d: d.setdefault("workload", {}).update(worker_env={"NCCL_DEBUG_SUBSYS": "INIT,COLL"}),
            "workload.worker_env",
            "missing NET",
        ),
        (
            lambda d: d["system_nodes"].update(instance_type="g6.12xlarge"),
            "system_nodes.instance_type",
            "GPU type",
        ),
        (lambda d: d["vpc"].update(nat_gateways=3), "vpc.nat_gateways", "availability zones"),
        (lambda d: d["cluster"].update(endpoint_access="private"), "cluster", "must be empty"),
        (
            lambda d: (
                d["addons"].update(kuberay_operator="latest")
                if "addons" in d
                else d.update(addons={"kuberay_operator": "latest"})
            ),
            "addons.kuberay_operator",
            "pinned chart version",
        ),
        (
            lambda d: d["gpu_nodes"].update(
                capacity_type="SPOT", capacity_reservation_id="cr-0123456789abcdef0", placement_group=False
            ),
            "gpu_nodes.capacity_reservation_id",
            "cannot be used with capacity_type SPOT",
        ),
        (
            lambda d: d["vpc"].update(availability_zones=["us-west-2a", "us-west-2b", "us-west-2a"]),
            "vpc.availability_zones",
            "availability zones repeat",
        ),
        (lambda d: d["vpc"].update(cidr="fd00:10::/56"), "vpc.cidr", "only IPv4 CIDR blocks"),
        (
            lambda d: d["cluster"].update(public_access_cidrs=["2001:db8::/32"]),
            "cluster.public_access_cidrs[0]",
            "only IPv4 CIDR blocks",
        ),
        (
            lambda d: d.setdefault("addons", {}).update(node_monitoring_agent="1.7.0"),
            "addons.node_monitoring_agent",
            "not a pinned EKS add-on version like v1.7.0-eksbuild.1",
        ),
        (
            lambda d: d.setdefault("addons", {}).update(cloudwatch_observability="v6.4.0"),
            "addons.cloudwatch_observability",
            "not a pinned EKS add-on version",
        ),
        (
            lambda d: d["job"].update(data="s3:/bucket/corpus"),
            "job.data",
            "looks like a URI but is not scheme://",
        ),
        (lambda d: d["job"].update(data="s3://Bad_Bucket/x"), "job.data", "is not an S3 bucket name"),
        (lambda d: d["tags"].update(team="x" * 257), "tags", "tag 'team': value longer than 256"),
        (lambda d: d["tags"].update({"aws:owner": "me"}), "tags", "not a valid AWS tag key"),
        (
            lambda d: d.setdefault("registry", {}).update(cache_prefix="Team_A"),
            "registry.cache_prefix",
            "is not an ECR repository prefix",
        ),
        (
            lambda d: d.setdefault("registry", {}).update(cache_prefix="a" * 25),
            "registry.cache_prefix",
            "characters; at most",
        ),
    ],
)
def test_bad_values_name_the_field_and_what_is_valid(mutate, field, hint):
    data = dev_data()
    mutate(data)
    message = error_of(data)
    (line,) = message.splitlines()  # one problem, one line: "FILE: FIELD: what is valid"
    assert f": {field}: " in line, message
    assert hint in message, message


def test_missing_required_field():
    data = dev_data()
    del data["gpu_nodes"]["availability_zone"]
    assert "gpu_nodes.availability_zone: required field is missing" in error_of(data)


def test_name_in_file_is_rejected():
    data = dev_data()
    data["name"] = "other"
    assert "name: not allowed" in error_of(data)


def test_not_yaml_and_not_a_mapping():
    with pytest.raises(SettingsError, match="not valid YAML") as info:
        parse_settings("a: [1, 2", name="dev", source=SOURCE)
    # One line, where the parser stopped (ruamel's own text is three and names "<unicode string>").
    assert str(info.value) == (
        f"{SOURCE}: not valid YAML: line 1, column 9: expected ',' or ']', but got '<stream end>' "
        "(while parsing a flow sequence)"
    )
    with pytest.raises(SettingsError, match="expected a mapping"):
        parse_settings("- 1\n- 2\n", name="dev", source=SOURCE)


def test_unknown_environment_lists_known_ones():
    known = environment_names()
    assert {"dev", "prod"} <= set(known)
    with pytest.raises(SettingsError, match=f"known environments: {', '.join(known)}$"):
        load_settings("staging")


# ------------------------------------------------------------------ properties

FAST = hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.text(min_size=1, max_size=20).filter(lambda s: s.strip() not in CATALOGUE))
def test_any_unknown_instance_type_is_rejected(name):
    data = dev_data()
    data["gpu_nodes"]["instance_type"] = name
    assert "gpu_nodes.instance_type" in error_of(data)


@FAST
@given(st.sampled_from(sorted(CATALOGUE)))
def test_gpu_types_pass_only_with_gpus_and_efa(name):
    data = dev_data()
    data["gpu_nodes"]["instance_type"] = name
    itype = CATALOGUE[name]
    if itype.gpus and itype.efa:
        assert parse(data).gpu_nodes.instance.name == name
    else:
        assert "gpu_nodes.instance_type" in error_of(data)


@FAST
# Job node counts whose GPU count divides the default global batch (the job cross-checks that).
@given(st.integers(0, 20), st.sampled_from([0, 1, 2, 4]), st.integers(1, 20))
def test_sizes_valid_iff_ordered(min_size, nodes, max_size):
    data = dev_data()
    # Sizes alone: without dev's teams, whose quotas must fit max_size (tests/test_settings_teams.py).
    data["cluster"]["job_submitter_principals"] = [
        a for t in data.pop("teams").values() for a in t["submitters"]
    ]
    data["gpu_nodes"].update(min_size=min_size, max_size=max_size)
    # Room for every job's Ray head (one per GPU node at most: tests/test_settings_queueing.py).
    data["system_nodes"]["max_size"] = 20
    data["job"] = {**data.get("job", {}), "nodes": nodes}
    # The group scales between min and max; a job needs at least one node, at most max.
    if min_size <= max_size and 1 <= nodes <= max_size:
        s = parse(data)
        assert (s.gpu_nodes.min_size, s.gpu_nodes.max_size, s.job.nodes) == (min_size, max_size, nodes)
    else:
        assert "gpu_nodes" in error_of(data) or "job.nodes" in error_of(data)


@FAST
@given(st.sampled_from(["us-west-2", "us-east-1", "eu-west-1"]), st.sampled_from("abcdef"))
def test_gpu_az_must_be_a_vpc_az(region, zone):
    data = dev_data()
    data["gpu_nodes"]["availability_zone"] = f"{region}{zone}"
    if f"{region}{zone}" in data["vpc"]["availability_zones"]:
        parse(data)
    else:
        assert "gpu_nodes.availability_zone" in error_of(data)


@FAST
@given(st.ip_addresses(v=4), st.integers(0, 32))
def test_cidrs_must_be_network_addresses(address, prefix):
    import ipaddress

    data = dev_data()
    cidr = f"{address}/{prefix}"
    data["cluster"]["public_access_cidrs"] = [cidr]
    data["cluster"]["public_access_from_anywhere"] = True  # 0.0.0.0/0 is a network address too
    not_public = (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
    )
    try:
        net = ipaddress.IPv4Network(cidr, strict=True)
    except ValueError:
        assert "cluster.public_access_cidrs[0]" in error_of(data)
    else:
        if any(net.subnet_of(ipaddress.IPv4Network(n)) for n in not_public):  # test_settings_network.py
            assert "is a private range" in error_of(data)
        else:
            assert parse(data).cluster.public_access_cidrs == [cidr]


# ------------------------------------------------------------------ command line


def run_app(env: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    import json
    import os

    environ = dict(os.environ, CDK_CONTEXT_JSON=json.dumps({"env": env}), CDK_OUTDIR=str(cwd / "out"))
    return subprocess.run(
        [sys.executable, str(ROOT / "app.py")],
        capture_output=True,
        text=True,
        env=environ,
        cwd=ROOT,
        check=False,
    )


def test_app_with_unknown_environment_fails_cleanly(tmp_path):
    result = run_app("staging", tmp_path)
    assert result.returncode == 1
    assert "no such environment file for env='staging'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list((tmp_path / "out").glob("*.template.json")) if (tmp_path / "out").exists() else True


def test_synth_all_with_a_bad_file_writes_nothing(tmp_path, monkeypatch):
    from stacks import synth_all

    envs = tmp_path / "environments"
    envs.mkdir()
    (envs / "dev.yaml").write_text((environments_dir() / "dev.yaml").read_text())
    (envs / "broken.yaml").write_text(
        (environments_dir() / "dev.yaml").read_text().replace("g6.12xlarge", "g9.huge")
    )
    out = tmp_path / "cdk.out"
    assert synth_all.main(["--out", str(out), "--config-dir", str(envs)]) == 1
    assert not out.exists()

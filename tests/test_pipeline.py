"""Pipeline (prod hosts it): stage order, prod gates, post-deploy verification, and stage stacks that are
the standalone stacks (same names and resources), from the session's synthesis."""

from __future__ import annotations

import json
import re

import pytest

from config.loader import SettingsError, parse_settings

HOST = "prod"


def _pipeline(synthesized) -> dict:
    t = synthesized[HOST].template("Pipeline")
    (pipeline,) = [r for r in t["Resources"].values() if r["Type"] == "AWS::CodePipeline::Pipeline"]
    return pipeline["Properties"]


def _buildspec(synthesized, action: dict) -> str:
    t = synthesized[HOST].template("Pipeline")
    project = action["Configuration"]["ProjectName"]["Ref"]
    return t["Resources"][project]["Properties"]["Source"]["BuildSpec"]


def _stage(synthesized, name: str) -> list[dict]:
    (stage,) = [s for s in _pipeline(synthesized)["Stages"] if s["Name"] == name]
    return stage["Actions"]


def test_environments_deploy_in_settings_order(synthesized):
    pipeline = synthesized[HOST].settings.pipeline
    names = [s["Name"] for s in _pipeline(synthesized)["Stages"]]
    assert names[:3] == ["Source", "Build", "UpdatePipeline"]
    assert [n for n in names if n.startswith("Deploy-")] == [f"Deploy-{e}" for e in pipeline.environments]
    source = _stage(synthesized, "Source")[0]
    assert source["Configuration"]["ConnectionArn"] == pipeline.connection_arn
    assert source["Configuration"]["FullRepositoryId"] == pipeline.repository


def test_synth_runs_the_tests_and_the_synthesis(synthesized):
    (synth,) = _stage(synthesized, "Build")
    spec = json.loads(_buildspec(synthesized, synth))
    assert spec["phases"]["build"]["commands"] == ["make test", "make synth"]
    assert spec["artifacts"]["base-directory"] == f"cdk.out/{HOST}"
    assert spec["phases"]["install"]["runtime-versions"] == {"python": "3.11", "nodejs": "20"}


def _by_order(actions: list[dict]) -> dict[str, int]:
    return {a["Name"]: a["RunOrder"] for a in actions}


def test_prod_waits_for_approval_after_each_change_set_and_flags_broadening(synthesized):
    actions = _stage(synthesized, "Deploy-prod")
    order = _by_order(actions)
    manual = [a["Name"] for a in actions if a["ActionTypeId"]["Provider"] == "Manual"]
    assert "CheckBroadening.Confirm" in manual
    assert order["CheckBroadening.Check"] < order["CheckBroadening.Confirm"]
    for stack in ("Network", "Cluster", "Workload", "PipelineAccess"):
        name = f"RayTrain-prod-{stack}"
        approve = f"{name}.Approve-{name}"
        assert approve in manual
        assert order[f"{name}.Prepare"] < order[approve] < order[f"{name}.Deploy"]
        assert order["CheckBroadening.Confirm"] < order[f"{name}.Prepare"]


def test_dev_deploys_without_approval(synthesized):
    actions = _stage(synthesized, "Deploy-dev")
    assert not [a for a in actions if a["ActionTypeId"]["Provider"] == "Manual"]


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_verify_runs_after_the_stage_with_the_environment_role(synthesized, env):
    actions = _stage(synthesized, f"Deploy-{env}")
    order = _by_order(actions)
    verify = next(a for a in actions if a["Name"] == f"Verify-{env}")
    assert order[f"Verify-{env}"] == max(order.values())
    spec = json.loads(_buildspec(synthesized, verify))
    commands = spec["phases"]["build"]["commands"]
    s = synthesized[env].settings
    role = f"arn:aws:iam::{s.account}:role/RayTrain-{env}-pipeline-verify"
    assert f"aws configure set profile.target.role_arn {role}" in commands
    assert f"aws eks update-kubeconfig --region {s.region} --name {s.cluster.name}" in commands
    assert f".venv/bin/raytrain verify --env {env}" in commands
    smoke = any("rayjob" in c for c in commands)
    assert smoke == (env in synthesized[HOST].settings.pipeline.smoke_job)


def test_smoke_waits_for_the_rayjob_this_deploy_applied(synthesized):
    """The RayJob's name hashes its spec and code; the smoke step must name the one the stage's
    Workload stack applies."""
    verify = next(a for a in _stage(synthesized, "Deploy-dev") if a["Name"] == "Verify-dev")
    commands = json.loads(_buildspec(synthesized, verify))["phases"]["build"]["commands"]
    (script,) = [c for c in commands if "get rayjob" in c]
    workload = _stage_templates(synthesized, "dev")["RayTrain-dev-Workload"]
    manifests = [
        r["Properties"]["Manifest"]
        for r in workload["Resources"].values()
        if r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"
    ]
    text = json.dumps(manifests)
    names = set(re.findall(r"\b(rj-[a-z0-9-]*-[0-9a-f]{10})\b", text))
    (name,) = names
    assert f"get rayjob {name} " in script
    assert "SUCCEEDED/*) break" in script and "FAILED/*|STOPPED/*|*/Failed)" in script


def _stage_templates(synthesized, env: str) -> dict[str, dict]:
    (assembly,) = synthesized[HOST].directory.glob(f"assembly-*-Deploy-{env}")
    manifest = json.loads((assembly / "manifest.json").read_text())
    return {
        a["displayName"].rsplit("/", 1)[-1]: json.loads(
            (assembly / a["properties"]["templateFile"]).read_text()
        )
        | {"_stackName": a["properties"].get("stackName")}
        for a in manifest["artifacts"].values()
        if a["type"] == "aws:cloudformation:stack"
    }


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_stage_stacks_are_the_standalone_stacks(synthesized, env):
    stage = _stage_templates(synthesized, env)
    for suffix in ("Network", "Cluster", "Workload"):
        name = f"RayTrain-{env}-{suffix}"
        copy = stage[name]
        assert copy["_stackName"] == name  # the pipeline updates the stacks a manual deploy made
        template = synthesized[env].template(suffix)
        # Same exports: the other stacks import them by name.
        assert copy.get("Outputs") == template.get("Outputs"), name
        standalone = template["Resources"]
        assert {k: r["Type"] for k, r in copy["Resources"].items()} == {
            k: r["Type"] for k, r in standalone.items()
        }
        for logical_id, resource in standalone.items():
            # Known, in-place-only differences: CDK derives the kubectl prune label and the provider
            # framework's description from the construct path, which inside a Stage is longer.
            assert _path_neutral(copy["Resources"][logical_id]) == _path_neutral(resource), logical_id


def _path_neutral(resource: dict) -> str:
    text = json.dumps(resource, sort_keys=True)
    # Asset hashes (and the RayJob name made from the code's) differ when training/ changed between
    # the two syntheses of this shared tree; CDK hashes the same files the same way.
    text = re.sub(r"[0-9a-f]{64}", "<asset-hash>", text)
    text = re.sub(r"(rj-[a-z0-9-]*)-[0-9a-f]{10}", r"\1-<hash>", text)
    text = re.sub(r"aws\.cdk\.eks/prune-c8[0-9a-f]{40}", "<prune-label>", text)
    return re.sub(r"\(RayTrain-[a-z0-9-]+-Pipeline/Deploy-[a-z0-9-]+/", "(", text)


def test_pipeline_access_gives_the_steps_role_read_only_cluster_access(synthesized):
    access = _stage_templates(synthesized, "dev")["RayTrain-dev-PipelineAccess"]
    resources = access["Resources"]
    (role,) = [r for r in resources.values() if r["Type"] == "AWS::IAM::Role"]
    (entry,) = [r for r in resources.values() if r["Type"] == "AWS::EKS::AccessEntry"]
    assert role["Properties"]["RoleName"] == "RayTrain-dev-pipeline-verify"
    principal = role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]["AWS"]
    host = synthesized[HOST].settings
    assert principal == f"arn:aws:iam::{host.account}:role/RayTrain-{HOST}-pipeline-steps"
    assert entry["Properties"]["ClusterName"] == synthesized["dev"].settings.cluster.name
    (policy,) = entry["Properties"]["AccessPolicies"]
    assert policy["AccessScope"] == {"Type": "cluster"}
    assert "AmazonEKSAdminViewPolicy" in json.dumps(policy["PolicyArn"])


def test_standalone_environments_have_no_pipeline(synthesized):
    assert not (synthesized["dev"].directory / "RayTrain-dev-Pipeline.template.json").exists()
    assert (synthesized[HOST].directory / f"RayTrain-{HOST}-Pipeline.template.json").exists()


PIPELINE_BASE = """
account: "111122223333"
region: us-west-2
vpc: {availability_zones: [us-west-2a, us-west-2b]}
cluster:
  name: c
  kubernetes_version: "1.35"
  endpoint_access: private
  admin_principal_arns: [arn:aws:iam::111122223333:role/Admin]
gpu_nodes: {availability_zone: us-west-2b}
pipeline:
"""


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("  environments: [dev]\n", "pipeline.codecommit_repository: give exactly one source"),
        (
            "  environments: [dev]\n  codecommit_repository: r\n  repository: o/r\n",
            "pipeline.connection_arn: connection_arn and repository go together",
        ),
        (
            "  environments: [dev]\n  codecommit_repository: r\n",
            "pipeline.manual_approval: ['prod'] not in environments",
        ),
        ("  environments: [dev, dev]\n  codecommit_repository: r\n", "environments repeat"),
        (
            "  environments: [dev]\n  codecommit_repository: r\n  manual_approval: []\n  smoke_job: [qa]\n",
            "pipeline.smoke_job: ['qa'] not in environments",
        ),
        (
            "  environments: [dev]\n  connection_arn: arn:aws:s3:::x\n  repository: o/r\n"
            "  manual_approval: []\n",
            "not a connection ARN",
        ),
    ],
)
def test_pipeline_settings_errors_name_the_field(section, message):
    with pytest.raises(SettingsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_settings(PIPELINE_BASE + section, name="x", source="x.yaml")


@pytest.mark.parametrize(
    ("states", "rc"),
    [
        (["/Initializing", "RUNNING/Running", "SUCCEEDED/Complete"], 0),
        (["RUNNING/Running", "FAILED/Failed"], 1),
        (["/Failed"], 1),  # failed before Ray ran it (e.g. deadline while the cluster started)
        ([], 1),  # no such RayJob: kubectl fails
    ],
)
def test_smoke_script_passes_only_on_success(tmp_path, monkeypatch, states, rc):
    import subprocess

    from config.loader import load_settings
    from stacks.pipeline import steps

    monkeypatch.setattr(steps, "SMOKE_POLL_SECONDS", 0)
    script = steps.smoke_commands(load_settings("dev"), code_hash="0" * 64)[-1]
    # A kubectl that answers the `-o jsonpath` polls from the list (repeating its last state, as a
    # job that stays put would), and fails like a missing RayJob when the list is empty.
    (tmp_path / "states").write_text("".join(f"{s}\n" for s in states))
    kubectl = tmp_path / "kubectl"
    kubectl.write_text(
        "#!/bin/bash\n"
        'case "$*" in *jsonpath*) ;; *) echo "yaml of the job"; exit 0;; esac\n'
        f'[ -s {tmp_path}/states ] || {{ echo "NotFound" >&2; exit 1; }}\n'
        f"line=$(head -n1 {tmp_path}/states)\n"
        f'[ "$(wc -l < {tmp_path}/states)" -gt 1 ] && sed -i 1d {tmp_path}/states\n'
        'printf "%s" "$line"\n'
    )
    kubectl.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    result = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == rc, result.stdout + result.stderr

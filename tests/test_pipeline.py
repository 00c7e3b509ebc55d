"""Pipeline (prod hosts it): stage order, prod gates, post-deploy verification, and stage stacks that are
the standalone stacks (same names and resources), from the session's synthesis."""

from __future__ import annotations

import json
import re

import pytest

from config.loader import SettingsError, parse_settings
from stacks.pipeline.steps import bootstrap_lookup_role_arn

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
    assert spec["phases"]["install"]["runtime-versions"] == {"python": "3.11", "nodejs": "22"}


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
def test_verify_step_starts_the_in_vpc_build_and_runs_no_kubectl_itself(synthesized, env):
    """The pipeline's step (pipeline account, no VPC) only drives the environment's in-VPC build."""
    actions = _stage(synthesized, f"Deploy-{env}")
    order = _by_order(actions)
    verify = next(a for a in actions if a["Name"] == f"Verify-{env}")
    assert order[f"Verify-{env}"] == max(order.values())
    commands = json.loads(_buildspec(synthesized, verify))["phases"]["build"]["commands"]
    assert commands == [f".venv/bin/raytrain pipeline-verify --env {env} --source ."]
    t = synthesized[HOST].template("Pipeline")
    project = t["Resources"][verify["Configuration"]["ProjectName"]["Ref"]]["Properties"]
    assert "VpcConfig" not in project
    text = json.dumps(project)
    assert "kubectl" not in text and "update-kubeconfig" not in text


def test_steps_role_may_assume_only_the_starter_and_lookup_roles(synthesized):
    t = synthesized[HOST].template("Pipeline")
    name = f"RayTrain-{HOST}-pipeline-steps"
    (role_id,) = [
        k for k, r in t["Resources"].items()
        if r["Type"] == "AWS::IAM::Role" and r["Properties"].get("RoleName") == name
    ]  # fmt: skip
    assumed = [
        arn
        for r in t["Resources"].values()
        if r["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in r["Properties"]["Roles"]
        for st in r["Properties"]["PolicyDocument"]["Statement"]
        if st["Action"] == "sts:AssumeRole"
        for arn in ([st["Resource"]] if isinstance(st["Resource"], str) else st["Resource"])
    ]
    envs = synthesized[HOST].settings.pipeline.environments
    starters = [synthesized[e].settings.verify_build.starter_role_arn for e in envs]
    lookups = [bootstrap_lookup_role_arn(synthesized[e].settings) for e in envs]
    # dev and prod share the placeholder account and region, so one lookup role (IAM merges them).
    assert sorted(assumed) == sorted(set(starters + lookups))


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_preflight_is_each_stages_first_step(synthesized, env):
    """`raytrain preflight` as the bootstrap's read-only lookup role runs before anything of the
    stage: before the permission-broadening check, the change sets and the deploys."""
    actions = _stage(synthesized, f"Deploy-{env}")
    order = _by_order(actions)
    preflight = next(a for a in actions if a["Name"] == f"Preflight-{env}")
    assert [n for n, o in order.items() if o == min(order.values())] == [f"Preflight-{env}"]
    settings = synthesized[env].settings
    commands = json.loads(_buildspec(synthesized, preflight))["phases"]["build"]["commands"]
    role = (
        f"arn:aws:iam::{settings.account}:role/cdk-hnb659fds-lookup-role-{settings.account}-{settings.region}"
    )
    assert commands == [f".venv/bin/raytrain preflight --env {env} --role-arn {role}"]


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_in_vpc_build_runs_the_checks_with_the_environment_settings(synthesized, env):
    access = _stage_templates(synthesized, env)[f"RayTrain-{env}-PipelineAccess"]
    spec = json.loads(_project(access)["Source"]["BuildSpec"])
    assert spec["phases"]["install"]["commands"] == ["make setup-cdk"]
    commands = spec["phases"]["build"]["commands"]
    s = synthesized[env].settings
    assert commands[:2] == [
        f"aws eks update-kubeconfig --region {s.region} --name {s.cluster.name}",
        f".venv/bin/raytrain verify --env {env}",
    ]
    # No role to assume: the build's own role has the access entry.
    assert not [c for c in commands if "profile" in c or "role_arn" in c]
    smoke = any("rayjob" in c for c in commands)
    assert smoke == (env in synthesized[HOST].settings.pipeline.smoke_job)


def _project(access: dict) -> dict:
    (project,) = [r for r in access["Resources"].values() if r["Type"] == "AWS::CodeBuild::Project"]
    return dict(project["Properties"])


def test_smoke_waits_for_the_rayjob_this_deploy_applied(synthesized):
    """The RayJob's name hashes its spec and code; the in-VPC build must name the one the stage's
    Workload stack applies."""
    templates = _stage_templates(synthesized, "dev")
    commands = json.loads(_project(templates["RayTrain-dev-PipelineAccess"])["Source"]["BuildSpec"])
    (script,) = [c for c in commands["phases"]["build"]["commands"] if "get rayjob" in c]
    workload = templates["RayTrain-dev-Workload"]
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


def _by_type(template: dict, kind: str) -> dict[str, dict]:
    return {k: r for k, r in template["Resources"].items() if r["Type"] == kind}


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_verify_project_runs_in_the_private_subnets_with_its_own_group(synthesized, env):
    stage = _stage_templates(synthesized, env)
    access = stage[f"RayTrain-{env}-PipelineAccess"]
    network = stage[f"RayTrain-{env}-Network"]
    vpc = _project(access)["VpcConfig"]
    private = {
        k for k, r in _by_type(network, "AWS::EC2::Subnet").items()
        if {"Key": "aws-cdk:subnet-type", "Value": "Private"} in r["Properties"]["Tags"]
    }  # fmt: skip
    assert len(private) == len(synthesized[env].settings.vpc.availability_zones)
    imported = {json.dumps(i) for i in vpc["Subnets"]}
    assert all(any(f"Ref{k}" in i for k in private) for i in imported), imported
    assert len(imported) == len(private)
    assert "RefVpc" in json.dumps(vpc["VpcId"])
    (sg_id,) = _by_type(access, "AWS::EC2::SecurityGroup")
    assert vpc["SecurityGroupIds"] == [{"Fn::GetAtt": [sg_id, "GroupId"]}]
    egress = _by_type(access, "AWS::EC2::SecurityGroup")[sg_id]["Properties"]["SecurityGroupEgress"]
    assert [(e["IpProtocol"], e["FromPort"], e["ToPort"]) for e in egress] == [("tcp", 443, 443)]


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_cluster_security_group_admits_the_verify_build_on_443(synthesized, env):
    stage = _stage_templates(synthesized, env)
    access = stage[f"RayTrain-{env}-PipelineAccess"]
    cluster = stage[f"RayTrain-{env}-Cluster"]
    (sg_id,) = _by_type(access, "AWS::EC2::SecurityGroup")
    (rule,) = _by_type(access, "AWS::EC2::SecurityGroupIngress").values()
    p = rule["Properties"]
    assert (p["IpProtocol"], p["FromPort"], p["ToPort"]) == ("tcp", 443, 443)
    assert p["SourceSecurityGroupId"] == {"Fn::GetAtt": [sg_id, "GroupId"]}
    # The group it adds to is the one on the control plane's interfaces, exported by name.
    (export,) = [
        o
        for o in cluster["Outputs"].values()
        if o.get("Export", {}).get("Name") == p["GroupId"]["Fn::ImportValue"]
    ]
    (eks,) = _by_type(cluster, "AWS::EKS::Cluster").values()
    assert eks["Properties"]["ResourcesVpcConfig"]["SecurityGroupIds"] == [export["Value"]]
    # The project is created after the rule and its access entry (its first build can connect).
    (project,) = _by_type(access, "AWS::CodeBuild::Project").values()
    (rule_id,) = _by_type(access, "AWS::EC2::SecurityGroupIngress")
    (entry_id,) = _by_type(access, "AWS::EKS::AccessEntry")
    assert {rule_id, entry_id} <= set(project["DependsOn"])


def test_verify_build_role_has_read_only_cluster_access(synthesized):
    access = _stage_templates(synthesized, "dev")["RayTrain-dev-PipelineAccess"]
    (project,) = _by_type(access, "AWS::CodeBuild::Project").values()
    role_id = project["Properties"]["ServiceRole"]["Fn::GetAtt"][0]
    (entry,) = _by_type(access, "AWS::EKS::AccessEntry").values()
    assert entry["Properties"]["PrincipalArn"] == {"Fn::GetAtt": [role_id, "Arn"]}
    assert entry["Properties"]["ClusterName"] == synthesized["dev"].settings.cluster.name
    (policy,) = entry["Properties"]["AccessPolicies"]
    assert policy["AccessScope"] == {"Type": "cluster"}
    assert "AmazonEKSAdminViewPolicy" in json.dumps(policy["PolicyArn"])


def test_starter_role_is_scoped_to_the_one_project_object_and_log_group(synthesized):
    access = _stage_templates(synthesized, "dev")["RayTrain-dev-PipelineAccess"]
    names = synthesized["dev"].settings.verify_build
    roles = {
        k: r
        for k, r in _by_type(access, "AWS::IAM::Role").items()
        if r["Properties"].get("RoleName") == names.starter_role
    }
    ((role_id, role),) = roles.items()
    principal = role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]["AWS"]
    host = synthesized[HOST].settings
    assert principal == f"arn:aws:iam::{host.account}:role/RayTrain-{HOST}-pipeline-steps"
    (doc,) = [
        r["Properties"]["PolicyDocument"] for r in _by_type(access, "AWS::IAM::Policy").values()
        if {"Ref": role_id} in r["Properties"]["Roles"]
    ]  # fmt: skip
    grants = {json.dumps(st["Action"]): st["Resource"] for st in doc["Statement"] if st["Effect"] == "Allow"}
    (project_id,) = _by_type(access, "AWS::CodeBuild::Project")
    (bucket_id,) = [
        k
        for k, r in _by_type(access, "AWS::S3::Bucket").items()
        if r["Properties"].get("BucketName") == names.bucket
    ]
    (key_id,) = [k for k in _by_type(access, "AWS::KMS::Key") if k.startswith("SourceKey")]
    assert grants == {
        '"s3:PutObject"': {"Fn::Join": ["", [{"Fn::GetAtt": [bucket_id, "Arn"]}, f"/{names.SOURCE_KEY}"]]},
        '"kms:GenerateDataKey"': {"Fn::GetAtt": [key_id, "Arn"]},
        '["codebuild:BatchGetBuilds", "codebuild:StartBuild", "codebuild:StopBuild"]': {
            "Fn::GetAtt": [project_id, "Arn"]
        },
        '"logs:GetLogEvents"': (
            f"arn:aws:logs:us-west-2:111122223333:log-group:{names.log_group}:log-stream:*"
        ),
    }
    # The project reads that object, by the name the driver uses.
    source = _project(access)["Source"]
    assert source["Type"] == "S3"
    assert source["Location"] == {"Fn::Join": ["", [{"Ref": bucket_id}, f"/{names.SOURCE_KEY}"]]}
    bucket = _by_type(access, "AWS::S3::Bucket")[bucket_id]["Properties"]
    assert bucket["VersioningConfiguration"] == {"Status": "Enabled"}


@pytest.mark.parametrize("access", ["private", "public_and_private"])
def test_every_endpoint_mode_lets_the_in_vpc_build_reach_the_private_endpoint(access):
    """Private access is on in both modes the settings allow (no public-only mode exists), so the
    build reaches the API server from the VPC and public_access_cidrs need not list the pipeline."""
    from config.settings import EndpointAccess

    assert {m.value for m in EndpointAccess} == {"private", "public_and_private"}
    cidrs = "" if access == "private" else "\n  public_access_cidrs: [198.51.100.0/24]"
    text = PIPELINE_BASE.replace("endpoint_access: private", f"endpoint_access: {access}{cidrs}").split(
        "pipeline:"
    )[0]
    settings = parse_settings(text, name="x", source="x.yaml")
    assert settings.cluster.endpoint_access.value == access


def test_public_only_endpoint_is_refused_naming_the_field():
    text = PIPELINE_BASE.replace("endpoint_access: private", "endpoint_access: public").split("pipeline:")[0]
    with pytest.raises(SettingsError, match=r"cluster\.endpoint_access"):
        parse_settings(text, name="x", source="x.yaml")


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_cluster_endpoint_has_private_access(synthesized, env):
    (eks,) = _by_type(synthesized[env].template("Cluster"), "AWS::EKS::Cluster").values()
    assert eks["Properties"]["ResourcesVpcConfig"]["EndpointPrivateAccess"] is True


def test_cdk_nag_gates_the_pipeline_access_stack(tmp_path):
    """The pipeline builds its stages itself (no validation plugin runs on them there), so the
    stage is synthesized alone here, with the AwsSolutions pack: its acknowledgements cover every
    finding, and a new one fails."""
    from aws_cdk import aws_sqs as sqs

    from config.loader import load_settings
    from stacks.environment import new_app
    from stacks.pipeline.stage import EnvironmentStage

    settings = load_settings("dev")
    app = new_app(settings, outdir=str(tmp_path / "ok"))
    EnvironmentStage(
        app,
        "Deploy-dev",
        settings=settings,
        pipeline_principal="arn:aws:iam::111122223333:role/p",
        smoke=True,
    )
    app.synth()
    app = new_app(settings, outdir=str(tmp_path / "bad"))
    stage = EnvironmentStage(
        app,
        "Deploy-dev",
        settings=settings,
        pipeline_principal="arn:aws:iam::111122223333:role/p",
        smoke=True,
    )
    sqs.Queue(stage.access, "UnencryptedQueueWithoutDlq")
    with pytest.raises(RuntimeError, match="AwsSolutions-SQS4"):
        app.synth()


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


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_pipeline_access_is_deletable_and_leaves_nothing_behind(synthesized, env):
    # Destroy deletes it first (it imports the Cluster stack's export): never termination-protected,
    # and its named bucket, log group and keys go with it, or the next deploy would collide with them.
    (assembly,) = synthesized[HOST].directory.glob(f"assembly-*-Deploy-{env}")
    manifest = json.loads((assembly / "manifest.json").read_text())
    (artifact,) = [
        a for a in manifest["artifacts"].values()
        if a["type"] == "aws:cloudformation:stack" and a["displayName"].endswith("-PipelineAccess")
    ]  # fmt: skip
    assert not artifact["properties"].get("terminationProtection")
    access = _stage_templates(synthesized, env)[f"RayTrain-{env}-PipelineAccess"]
    kept = {
        k: r["Type"]
        for k, r in access["Resources"].items()
        if r["Type"] in ("AWS::S3::Bucket", "AWS::Logs::LogGroup", "AWS::KMS::Key")
        and r.get("DeletionPolicy", "Delete") != "Delete"
    }
    assert kept == {}

"""Workload stack: checkpoint bucket, code asset, Pod Identity and the chart applied to the cluster."""

from __future__ import annotations

import json
import shutil

import pytest

from config.locations import checkpoint_prefix
from stacks.workload_stack import checkpoint_bucket_name

ENVS = ["dev", "prod", "p5"]


def of_type(template: dict, type_name: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_name}


def checkpoint_bucket(template: dict) -> dict:
    (bucket,) = [b for b in of_type(template, "AWS::S3::Bucket").values() if "BucketName" in b["Properties"]]
    return bucket


@pytest.mark.parametrize("env", ENVS)
def test_checkpoint_bucket_is_private_versioned_encrypted_and_tls_only(synthesized, env):
    s = synthesized[env].settings
    t = synthesized[env].template("Workload")
    bucket = checkpoint_bucket(t)
    props = bucket["Properties"]
    assert props["BucketName"] == checkpoint_bucket_name(s)
    assert props["VersioningConfiguration"] == {"Status": "Enabled"}
    assert props["PublicAccessBlockConfiguration"] == {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    }
    sse = props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    assert sse["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    assert "LoggingConfiguration" in props
    policies = [p for p in of_type(t, "AWS::S3::BucketPolicy").values()]
    tls_denies = [
        st
        for p in policies
        for st in p["Properties"]["PolicyDocument"]["Statement"]
        if st["Effect"] == "Deny"
        and st.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport") == "false"
    ]
    assert len(tls_denies) >= 2  # the checkpoint bucket and its access-log bucket


def test_retention_per_environment(synthesized):
    dev = synthesized["dev"].template("Workload")
    prod = synthesized["prod"].template("Workload")
    assert checkpoint_bucket(dev)["DeletionPolicy"] == "Delete"
    assert of_type(dev, "Custom::S3AutoDeleteObjects"), "dev empties its buckets on destroy"
    assert checkpoint_bucket(prod)["DeletionPolicy"] == "Retain"
    assert not of_type(prod, "Custom::S3AutoDeleteObjects")
    (key,) = of_type(prod, "AWS::KMS::Key").values()
    assert key["DeletionPolicy"] == "Retain" and key["Properties"]["EnableKeyRotation"] is True


@pytest.mark.parametrize("env", ENVS)
def test_pod_identity_role_reads_code_and_writes_only_the_checkpoint_prefix(synthesized, env):
    s = synthesized[env].settings
    t = synthesized[env].template("Workload")
    associations = list(of_type(t, "AWS::EKS::PodIdentityAssociation").values())
    # One per team: its namespace's service account gets its own role.
    assert sorted(a["Properties"]["Namespace"] for a in associations) == sorted(
        x.namespace for x in s.team_list
    )
    roles = {a["Properties"]["RoleArn"]["Fn::GetAtt"][0] for a in associations}
    assert len(roles) == len(associations)
    for association in associations:
        team = next(x for x in s.team_list if x.namespace == association["Properties"]["Namespace"])
        _check_pod_role(t, association, checkpoint_prefix(s.for_team(team.name)))


def _check_pod_role(t: dict, association: dict, prefix: str) -> None:
    assert association["Properties"]["ServiceAccount"] == "ray-train"
    role_id = association["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    trust = t["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    actions = {a for st in trust for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])}
    assert actions == {"sts:AssumeRole", "sts:TagSession"}
    assert all(st["Principal"] == {"Service": "pods.eks.amazonaws.com"} for st in trust)
    (policy,) = [
        p for p in of_type(t, "AWS::IAM::Policy").values() if {"Ref": role_id} in p["Properties"]["Roles"]
    ]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    text = json.dumps(statements)
    assert '"s3:*"' not in text and '"*"' not in text
    writes = [st for st in statements if "s3:PutObject" in json.dumps(st["Action"])]
    assert len(writes) == 1 and f"/{prefix}/*" in json.dumps(writes[0]["Resource"])
    # Nothing of another team's: the only checkpoint objects it may touch are under its prefix.
    objects = [r for st in statements for r in json.dumps(st["Resource"]).split('"') if "/checkpoints" in r]
    assert objects
    assert all(f"/{prefix}/" in r for r in objects), objects
    code_reads = [st for st in statements if st["Action"] == "s3:GetObject"]
    assert any(".zip" in json.dumps(st["Resource"]) for st in code_reads)


@pytest.mark.parametrize("env", ENVS)
def test_chart_applied_to_the_cluster_after_pod_identity(synthesized, env):
    t = synthesized[env].template("Workload")
    manifests = of_type(t, "Custom::AWSCDK-EKS-KubernetesResource").values()
    body = json.dumps([m["Properties"]["Manifest"] for m in manifests])
    for kind in ("NetworkPolicy", "ServiceAccount", "ConfigMap"):
        assert f'\\"kind\\":\\"{kind}\\"' in body, kind
    # job.deploy: dev's deploy starts its smoke job, prod's starts none.
    deploys = synthesized[env].settings.job.deploy
    if env in ("dev", "prod"):
        assert deploys is (env == "dev")
    assert ('\\"kind\\":\\"RayJob\\"' in body) is deploys
    assert '\\"kind\\":\\"Namespace\\"' not in body  # owned by the cluster stack
    association = next(iter(of_type(t, "AWS::EKS::PodIdentityAssociation")))
    assert all(association in m.get("DependsOn", []) for m in manifests)


@pytest.mark.parametrize("env", ENVS)
def test_destroy_order_workload_before_cluster_before_network(synthesized, env):
    manifest = json.loads((synthesized[env].directory / "manifest.json").read_text())
    artifacts = manifest["artifacts"]
    assert f"RayTrain-{env}-Cluster" in artifacts[f"RayTrain-{env}-Workload"]["dependencies"]
    assert f"RayTrain-{env}-Network" in artifacts[f"RayTrain-{env}-Cluster"]["dependencies"]


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_manifests_rendered_for_review(synthesized, env):
    folder = synthesized[env].directory / "manifests"
    names = sorted(p.name for p in folder.glob("*.k8s.yaml"))
    assert any(n.startswith("RayJob.") for n in names)
    s = synthesized[env].settings
    # One default-deny per team namespace (<Kind>.<namespace>.<name> with several teams).
    for team in s.team_list:
        assert f"NetworkPolicy.{team.namespace}.default-deny.k8s.yaml" in names
    rayjob = next(folder.glob("RayJob.*")).read_text()
    assert f"s3://{checkpoint_bucket_name(s)}/checkpoints-{s.deploy_team.name}" in rayjob
    assert "${Token" not in rayjob


def test_code_asset_unpacks_into_a_working_dir_with_the_training_package(synthesized, tmp_path):
    """Unpack the asset zip with Ray's own function, as Ray does for an s3:// working_dir."""
    from ray._private.runtime_env.packaging import unzip_package

    directory = synthesized["dev"].directory
    assets = json.loads((directory / "RayTrain-dev-Workload.assets.json").read_text())["files"]
    (staged,) = [
        directory / a["source"]["path"]
        for a in assets.values()
        if a["source"].get("packaging") == "zip"
        and list((directory / a["source"]["path"]).rglob("__main__.py"))
    ]
    # CDK zips the staged folder's contents at publish time; do the same.
    archive = shutil.make_archive(str(tmp_path / "code"), "zip", staged)
    unzip_package(archive, str(tmp_path / "working_dir"), remove_top_level_directory=True, unlink_zip=False)
    assert (tmp_path / "working_dir" / "training" / "__main__.py").is_file()
    assert not list((tmp_path / "working_dir").rglob("__pycache__"))


def _manifests(template: dict) -> dict[str, dict]:
    return of_type(template, "Custom::AWSCDK-EKS-KubernetesResource")


def _objects(resource: dict) -> list[dict]:
    """The Kubernetes objects of a manifest resource; CloudFormation tokens become TOKEN."""
    manifest = resource["Properties"]["Manifest"]
    if isinstance(manifest, dict):  # Fn::Join of JSON text and tokens inside its strings
        manifest = "".join(p if isinstance(p, str) else "TOKEN" for p in manifest["Fn::Join"][1])
    return list(json.loads(manifest))


@pytest.mark.parametrize("env", ENVS)
def test_rayjobs_sit_in_a_manifest_resource_named_after_them(synthesized, env):
    """A new RayJob name gives a new logical ID: CloudFormation creates the new resource and
    deletes the old one (kubectl delete of the old RayJob) instead of leaving it running."""
    import hashlib

    t = synthesized[env].template("Workload")
    manifests = _manifests(t)
    job_ids = [
        k
        for k, v in manifests.items()
        if '\\"kind\\":\\"RayJob\\"' in json.dumps(v["Properties"]["Manifest"])
    ]
    if not synthesized[env].settings.job.deploy:
        assert job_ids == []
        return
    assert len(job_ids) == 1, job_ids
    (job_id,) = job_ids
    body = json.dumps(manifests[job_id]["Properties"]["Manifest"])
    names = sorted(o["metadata"]["name"] for o in _objects(manifests[job_id]) if o["kind"] == "RayJob")
    assert names and all(o["kind"] == "RayJob" for o in _objects(manifests[job_id]))
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:12]
    assert job_id.startswith(f"RayJob{digest}")
    for kind in ("ServiceAccount", "NetworkPolicy"):
        assert f'\\"kind\\":\\"{kind}\\"' not in body, f"{kind} would be deleted with the old job"
    # Created after, deleted before, its service account, network policies and Pod Identity.
    others = [k for k in manifests if k != job_id]
    association = next(iter(of_type(t, "AWS::EKS::PodIdentityAssociation")))
    assert set(others) | {association} <= set(manifests[job_id]["DependsOn"])


def test_a_new_job_spec_gives_a_new_job_resource(synthesized, tmp_path):
    """Same environment, another training setting: the job resource's logical ID changes, the
    service account / network policy resource keeps its own."""
    from config.loader import load_settings
    from stacks.synth_all import synthesize

    base = synthesized["dev"]
    settings = load_settings("dev")
    changed = settings.model_copy(
        update={"job": settings.job.model_copy(update={"steps": settings.job.steps + 1})}
    )
    synthesize(changed, tmp_path)
    before = set(_manifests(base.template("Workload")))
    after = set(
        _manifests(json.loads((tmp_path / "dev" / "RayTrain-dev-Workload.template.json").read_text()))
    )
    (old_job,) = [k for k in before if k.startswith("RayJob")]
    (new_job,) = [k for k in after if k.startswith("RayJob")]
    assert old_job != new_job
    assert before - {old_job} == after - {new_job}


@pytest.mark.parametrize("env", ENVS)
def test_destroy_removes_rayjobs_while_the_operator_runs(synthesized, env):
    """Workload (RayJobs) is deleted before Cluster (KubeRay operator, Ray namespace)."""
    manifest = json.loads((synthesized[env].directory / "manifest.json").read_text())
    deps = manifest["artifacts"][f"RayTrain-{env}-Workload"]["dependencies"]
    assert f"RayTrain-{env}-Cluster" in deps
    cluster = synthesized[env].template("Cluster")
    charts = {v["Properties"]["Release"] for v in of_type(cluster, "Custom::AWSCDK-EKS-HelmChart").values()}
    assert "kuberay-operator" in charts


@pytest.mark.parametrize("env", ENVS)
def test_job_submitters_get_a_namespaced_group_and_can_write_their_kubeconfig(synthesized, env):
    """cluster.job_submitter_principals: one STANDARD access entry each, no access policy (no
    cluster-wide grant), mapped to the group the Ray namespace's Role is bound to (k8s/rbac.py);
    the submitter policy lets them call eks:DescribeCluster (aws eks update-kubeconfig) on this
    cluster only."""
    s = synthesized[env].settings
    t = synthesized[env].template("Workload")
    entries = [
        r["Properties"]
        for r in of_type(t, "AWS::EKS::AccessEntry").values()
        if isinstance(r["Properties"]["PrincipalArn"], str)
    ]
    group_of = {arn: team.submitter_group for team in s.team_list for arn in team.submitters}
    assert sorted(e["PrincipalArn"] for e in entries) == sorted(group_of)
    assert group_of  # the shipped environments name some
    for entry in entries:
        assert entry["Type"] == "STANDARD"
        # Each team's submitters in its own group (bound in its own namespace only: test_submitter_rbac).
        assert entry["KubernetesGroups"] == [group_of[entry["PrincipalArn"]]]
        assert not entry.get("AccessPolicies")
    (policy,) = [
        r["Properties"]["PolicyDocument"]
        for r in of_type(t, "AWS::IAM::ManagedPolicy").values()
        if "job-submitter" in r["Properties"]["ManagedPolicyName"]
    ]
    (describe,) = [st for st in policy["Statement"] if st["Action"] == "eks:DescribeCluster"]
    assert describe["Resource"] == (f"arn:aws:eks:{s.region}:{s.account}:cluster/{s.cluster.name}")


@pytest.mark.parametrize("env", ENVS)
def test_submitted_jobs_are_drained_before_the_manifests_go(synthesized, env):
    """The drain resource depends on the chart's manifest (jobs anchor, Roles) and on its own
    access entry, so a destroy deletes it (deleting the submitted RayJobs and waiting) first; its
    function runs beside CDK's kubectl provider: in the cluster's VPC, with the kubectl layer."""
    t = synthesized[env].template("Workload")
    drains = of_type(t, "Custom::RayJobDrain")
    # One per team namespace, served by one function.
    s = synthesized[env].settings
    assert sorted(d["Properties"]["Namespace"] for d in drains.values()) == sorted(
        x.namespace for x in s.team_list
    )
    assert len({json.dumps(d["Properties"]["ServiceToken"]) for d in drains.values()}) == 1
    drain_id = next(k for k, d in drains.items() if d["Properties"]["Namespace"] == s.deploy_team.namespace)
    drain = t["Resources"][drain_id]
    manifests = of_type(t, "Custom::AWSCDK-EKS-KubernetesResource")
    (chart_id,) = [
        k for k, r in manifests.items() if "ray-train-jobs" in json.dumps(r["Properties"]["Manifest"])
    ]
    (entry_id,) = [
        k for k, r in of_type(t, "AWS::EKS::AccessEntry").items()
        if r["Properties"].get("KubernetesGroups") == ["ray-train:job-drainer"]
    ]  # fmt: skip
    assert {chart_id, entry_id} <= set(drain["DependsOn"])
    assert drain["Properties"]["Selector"] == "app.kubernetes.io/part-of=ray-train,ray-train/origin=submitted"
    function = t["Resources"][drain["Properties"]["ServiceToken"]["Fn::GetAtt"][0]]["Properties"]
    assert function["VpcConfig"]["SubnetIds"] and function["VpcConfig"]["SecurityGroupIds"]
    assert len(function["Layers"]) == 2  # kubectl, AWS CLI

"""Change review: replacement detection from CloudFormation's resource schemas, and the committed
logical IDs of the critical resources (a refactor must not silently replace a cluster)."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest

from raytrain import review

FIXTURE = Path(__file__).parent / "fixtures" / "logical_ids.json"
REGION = "us-west-2"


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_critical_logical_ids_are_stable(synthesized, env):
    expected = json.loads(FIXTURE.read_text())[env]
    found = {
        stack: critical
        for stack, template in synthesized[env].templates().items()
        if (critical := review.critical_resources(template))
    }
    assert found == expected, (
        "A critical resource's logical ID changed: CloudFormation would create a new one and delete "
        "the old (a new VPC, cluster, node group or bucket). If that is intended, review it with "
        f"`make review ENV={env}` and update {FIXTURE.relative_to(FIXTURE.parents[2])}."
    )


def _template() -> dict:
    return {
        "Resources": {
            "Vpc": {"Type": "AWS::EC2::VPC", "Properties": {"CidrBlock": "10.0.0.0/16"}},
            "Subnet": {
                "Type": "AWS::EC2::Subnet",
                "Properties": {"VpcId": {"Ref": "Vpc"}, "CidrBlock": "10.0.0.0/19"},
            },
            "Group": {
                "Type": "AWS::EKS::Nodegroup",
                "Properties": {
                    "ClusterName": "c",
                    "AmiType": "AL2023_x86_64_NVIDIA",
                    "NodeRole": "arn:aws:iam::111122223333:role/n",
                    "Subnets": [{"Ref": "Subnet"}],
                    "ScalingConfig": {"MinSize": 0, "DesiredSize": 2, "MaxSize": 2},
                },
            },
            "Checkpoints1234": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "ckpt"}},
            "Logs": {"Type": "AWS::S3::Bucket", "Properties": {"BucketName": "logs"}},
            "Chart": {"Type": "Custom::AWSCDK-EKS-HelmChart", "Properties": {"Version": "1.0.0"}},
        }
    }


def _changes(old: dict, new: dict) -> dict[str, review.Change]:
    return {c.logical_id: c for c in review.compare_templates("S", old, new, REGION).changes}


def test_update_in_place_is_not_a_replacement():
    old, new = _template(), _template()
    new["Resources"]["Group"]["Properties"]["ScalingConfig"]["DesiredSize"] = 3
    changes = _changes(old, new)
    assert changes["Group"].action == "modified" and changes["Group"].critical
    assert set(changes) == {"Group"}


def test_a_scaling_change_says_to_deploy_it_between_jobs():
    old, new = _template(), _template()
    new["Resources"]["Group"]["Properties"]["ScalingConfig"]["MaxSize"] = 4
    group = _changes(old, new)["Group"]
    assert group.action == "modified" and review.SCALING_NOTE in group.details
    # Other node group changes carry no such note.
    new = _template()
    new["Resources"]["Group"]["Properties"]["Labels"] = {"a": "b"}
    assert review.SCALING_NOTE not in _changes(old, new)["Group"].details


def test_create_only_property_replaces_and_the_schema_decides():
    old, new = _template(), _template()
    new["Resources"]["Group"]["Properties"]["AmiType"] = "AL2023_x86_64_STANDARD"
    new["Resources"]["Checkpoints1234"]["Properties"]["BucketName"] = "ckpt-2"
    new["Resources"]["Logs"]["Properties"]["BucketName"] = "logs-2"
    changes = _changes(old, new)
    assert changes["Group"].action == "replaced" and "AmiType" in changes["Group"].details[0]
    assert changes["Checkpoints1234"].action == "replaced" and changes["Checkpoints1234"].critical
    # Replaced too, but not a critical resource (only the checkpoint bucket is).
    assert changes["Logs"].action == "replaced" and not changes["Logs"].critical


def test_replacement_propagates_through_create_only_references():
    old, new = _template(), _template()
    new["Resources"]["Vpc"]["Properties"]["CidrBlock"] = "10.1.0.0/16"
    changes = _changes(old, new)
    # The subnet's VpcId (create-only) is a Ref to the replaced VPC; the node group's Subnets too.
    assert {k for k, c in changes.items() if c.action == "replaced"} == {"Vpc", "Subnet", "Group"}


def test_logical_id_change_of_a_critical_resource_is_a_replacement():
    old, new = _template(), _template()
    new["Resources"]["GroupRenamed"] = new["Resources"].pop("Group")
    changes = _changes(old, new)
    assert changes["Group"].action == "replaced" and "GroupRenamed" in changes["Group"].details[0]
    assert changes["GroupRenamed"].action == "added"


def test_resources_without_a_schema_are_reported_as_unknown():
    old, new = _template(), _template()
    new["Resources"]["Chart"]["Properties"]["Version"] = "1.1.0"
    (change,) = _changes(old, new).values()
    assert change.action == "modified" and "replacement unknown" in change.details[0]


def _assembly(directory: Path, stacks: dict[str, dict]) -> Path:
    directory.mkdir(parents=True)
    artifacts = {}
    for name, template in stacks.items():
        (directory / f"{name}.template.json").write_text(json.dumps(template))
        artifacts[name] = {
            "type": "aws:cloudformation:stack",
            "displayName": name,
            "properties": {"templateFile": f"{name}.template.json"},
        }
    (directory / "manifest.json").write_text(json.dumps({"artifacts": artifacts}))
    return directory


def test_command_exit_status_gates_critical_replacements(tmp_path, capsys):
    base = _assembly(tmp_path / "base" / "dev", {"RayTrain-dev-Cluster": _template()})
    same = _assembly(tmp_path / "same", {"RayTrain-dev-Cluster": _template()})
    changed = copy.deepcopy(_template())
    changed["Resources"]["Group"]["Properties"]["AmiType"] = "AL2023_ARM_64_STANDARD"
    current = _assembly(tmp_path / "current", {"RayTrain-dev-Cluster": changed})

    def run(base_arg: Path, current_dir: Path) -> int:
        args = argparse.Namespace(env="dev", base=str(base_arg), current=current_dir, json=True)
        return review.run(args)

    # A cdk.out folder holding <env>/ works as the base, as does the assembly folder itself.
    assert run(tmp_path / "base", same) == review.EXIT_OK
    assert run(base, current) == review.EXIT_REPLACES
    capsys.readouterr()


def test_json_output_lists_changes(tmp_path, capsys):
    base = _assembly(tmp_path / "b", {"S": _template()})
    changed = _template()
    changed["Resources"]["Group"]["Properties"]["AmiType"] = "AL2023_ARM_64_STANDARD"
    current = _assembly(tmp_path / "c", {"S": changed})
    args = argparse.Namespace(env="dev", base=str(base), current=current, json=True)
    assert review.run(args) == review.EXIT_REPLACES
    (stack,) = json.loads(capsys.readouterr().out)
    assert stack["stack"] == "S"
    assert [(c["logical_id"], c["action"], c["critical"]) for c in stack["changes"]] == [
        ("Group", "replaced", True)
    ]


def test_a_new_environment_reviews_as_all_new(tmp_path, capsys, monkeypatch):
    """`make review ENV=new` before the environment file is committed: the base ref has no
    config/environments/new.yaml, so nothing is deployed from it: every resource is added, exit 0."""
    import subprocess

    repo = tmp_path / "repo"
    (repo / "config" / "environments").mkdir(parents=True)
    (repo / "config" / "environments" / "other.yaml").write_text("name: other\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    monkeypatch.setattr(review, "ROOT", repo)
    current = _assembly(tmp_path / "current", {"RayTrain-dev-Cluster": _template()})
    args = argparse.Namespace(env="dev", base="HEAD", current=current, json=True)
    assert review.run(args) == review.EXIT_OK
    out, err = capsys.readouterr()
    (stack,) = json.loads(out)
    assert stack["changes"] and {c["action"] for c in stack["changes"]} == {"added"}
    assert "does not exist at HEAD" in err and "every resource below is new" in err

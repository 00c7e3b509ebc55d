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


def test_replacement_propagates_through_a_get_att_reference():
    """A create-only property that takes another resource's attribute (Fn::GetAtt) is replaced with
    it: a node group whose node role is replaced is replaced too."""
    old, new = _template(), _template()
    for t in (old, new):
        t["Resources"]["NodeRole"] = {"Type": "AWS::IAM::Role", "Properties": {"RoleName": "nodes"}}
        t["Resources"]["Group"]["Properties"]["NodeRole"] = {"Fn::GetAtt": ["NodeRole", "Arn"]}
    new["Resources"]["NodeRole"]["Properties"]["RoleName"] = "nodes-2"
    changes = _changes(old, new)
    assert changes["NodeRole"].action == "replaced"
    assert changes["Group"].action == "replaced" and changes["Group"].critical
    assert changes["Group"].details == ["NodeRole references a replaced resource"]


def test_logical_id_change_of_a_critical_resource_is_a_replacement():
    old, new = _template(), _template()
    new["Resources"]["GroupRenamed"] = new["Resources"].pop("Group")
    changes = _changes(old, new)
    assert changes["Group"].action == "replaced" and "GroupRenamed" in changes["Group"].details[0]
    assert changes["GroupRenamed"].action == "added"


def _workload_template() -> dict:
    """The two resources between a redeploy and the submitted jobs, and a manifest of RayJobs."""
    from config.names import JOBS_ANCHOR

    anchor = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": JOBS_ANCHOR, "namespace": "ray"}}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r"}}
    job = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj-a-1", "namespace": "ray"}}
    manifest = "Custom::AWSCDK-EKS-KubernetesResource"
    return {
        "Resources": {
            "RayWorkload1703B9BC": {"Type": manifest, "Properties": {"Manifest": json.dumps([role, anchor])}},
            "RayJobaaaa": {"Type": manifest, "Properties": {"Manifest": json.dumps([job])}},
            "SubmittedJobDrain990558B0": {"Type": "Custom::RayJobDrain", "Properties": {"Namespace": "ray"}},
        }
    }


@pytest.mark.parametrize("logical_id", ["RayWorkload1703B9BC", "SubmittedJobDrain990558B0"])
def test_renaming_the_jobs_anchor_manifest_or_the_drain_is_a_critical_replacement(logical_id):
    """A new logical ID: CloudFormation deletes the old resource after creating the new one; for the
    anchor's manifest that is `kubectl delete -f` on the anchor (every submitted job goes with it)."""
    old, new = _workload_template(), _workload_template()
    new["Resources"][f"Renamed{logical_id}"] = new["Resources"].pop(logical_id)
    review_ = review.compare_templates("S", old, new, REGION)
    assert [c.logical_id for c in review_.critical_replacements] == [logical_id]
    assert f"Renamed{logical_id}" in review_.critical_replacements[0].details[0]
    # Removed outright: critical too.
    del new["Resources"][f"Renamed{logical_id}"]
    (change,) = review.compare_templates("S", old, new, REGION).critical_replacements
    assert (change.logical_id, change.action) == (logical_id, "removed")


def test_a_new_rayjob_manifest_is_not_critical_nor_a_twin_of_the_anchors():
    """A RayJob manifest's ID carries its spec's hash: a new one replacing the old is the design
    (stacks/workload_stack.py), and it is not the renamed anchor manifest either."""
    old, new = _workload_template(), _workload_template()
    new["Resources"]["RayJobbbbb"] = new["Resources"].pop("RayJobaaaa")
    assert review.compare_templates("S", old, new, REGION).critical_replacements == []
    del new["Resources"]["RayWorkload1703B9BC"]
    (change,) = review.compare_templates("S", old, new, REGION).critical_replacements
    assert (change.logical_id, change.action, change.details) == ("RayWorkload1703B9BC", "removed", [])


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


# A repository of its own for the default path (`--base HEAD`, no --current): its stacks.synth_all
# writes the committed template.json as stack S's assembly, the way the real one writes cdk.out/<env>.
_FAKE_SYNTH = """
import argparse, json, pathlib
p = argparse.ArgumentParser(); p.add_argument("env"); p.add_argument("--out", type=pathlib.Path)
a = p.parse_args()
root = pathlib.Path(__file__).resolve().parents[1]
out = a.out / a.env
out.mkdir(parents=True)
(out / "S.template.json").write_text((root / "template.json").read_text())
(out / "manifest.json").write_text(json.dumps({"artifacts": {"S": {
    "type": "aws:cloudformation:stack", "properties": {"templateFile": "S.template.json"}}}}))
"""


def _repo(root: Path, synth: str) -> Path:
    """A git repository whose HEAD has stacks.synth_all (`synth`) and template.json."""
    import subprocess

    repo = root / "repo"
    (repo / "stacks").mkdir(parents=True)
    (repo / "config" / "environments").mkdir(parents=True)
    (repo / "config" / "environments" / "dev.yaml").write_text("name: dev\n")  # dev exists at HEAD
    (repo / "stacks" / "__init__.py").write_text("")
    (repo / "stacks" / "synth_all.py").write_text(synth)
    (repo / "template.json").write_text(json.dumps(_template()))

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
    return repo


def test_a_base_that_does_not_synthesize_is_one_message_and_exit_2(tmp_path, monkeypatch, capsys):
    from rich.console import Console

    repo = _repo(tmp_path, "import sys\nsys.exit('stack Network: bad setting')\n")
    monkeypatch.setattr(review, "ROOT", repo)
    args = argparse.Namespace(env="dev", base="HEAD", current=tmp_path / "unused", json=False)
    console = Console(record=True, width=200)
    assert review.run(args, console) == review.EXIT_UNUSABLE
    text = console.export_text()
    assert "error: synthesis of env=dev at HEAD failed:" in text and "stack Network: bad setting" in text


def test_default_review_against_head_shows_a_removed_critical_resource_in_the_table(tmp_path, monkeypatch):
    import subprocess
    import sys

    from rich.console import Console

    repo = _repo(tmp_path, _FAKE_SYNTH)
    # The working tree drops the checkpoint bucket outright (no twin: a removal, not a rename).
    current = _template()
    del current["Resources"]["Checkpoints1234"]
    (repo / "template.json").write_text(json.dumps(current))
    monkeypatch.setattr(review, "ROOT", repo)

    def synthesize_current(env: str, out: Path) -> Path:
        # The working tree's synthesis, by the same script the base ran at HEAD.
        command = [sys.executable, "-m", "stacks.synth_all", env, "--out", str(out)]
        subprocess.run(command, cwd=repo, check=True)
        return out / env

    monkeypatch.setattr(review, "synthesize_current", synthesize_current)

    parser = argparse.ArgumentParser()
    review.register(parser.add_subparsers())
    args = parser.parse_args(["review", "--env", "dev"])
    assert (args.base, args.current, args.json) == ("HEAD", None, False)
    console = Console(record=True, width=200)
    assert review.run(args, console) == review.EXIT_REPLACES
    text = console.export_text()
    row = next(line for line in text.splitlines() if "Checkpoints1234" in line and "│" in line)
    assert [cell.strip() for cell in row.split("│")[1:-1]] == [
        "S",
        "Checkpoints1234",
        "AWS::S3::Bucket",
        "removed",
        "yes",
        "",
    ]
    assert "S: 0 added, 1 removed, 0 modified, 0 replaced" in text
    assert "1 critical resource(s) would be replaced or removed: Checkpoints1234" in text
    # Nothing of the temporary worktree is left registered in the repository.
    listed = subprocess.run(
        ["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True, check=True
    )
    assert len(listed.stdout.splitlines()) == 1

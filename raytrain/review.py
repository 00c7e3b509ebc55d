"""`raytrain review --env NAME [--base REF|DIR]`: what a deploy would change, fully offline.

Compares this working tree's synthesis of one environment with a previous one — a git ref (synthesized
in a temporary worktree) or a saved cloud assembly folder (`cdk.out/<env>` or a copy) — and lists, per
stack, the resources added, removed and modified. For the resources whose replacement would hurt (VPC,
subnets, EKS cluster, node groups, launch templates, the checkpoint bucket, KMS keys, and the two
that stand between a redeploy and the submitted jobs: the manifest holding the jobs anchor and the
job drain) it says whether
the change replaces them: a changed property that CloudFormation's resource schema lists in
`createOnlyProperties` (the schemas cfn-lint ships), a referenced resource that is itself replaced, or
a changed logical ID (CloudFormation creates the new ID and deletes the old).

Exit status: 0 no critical resource is replaced or removed, 1 one is (a review gate), 2 cannot compare.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from config.loader import env_argument
from config.names import JOB_DRAIN_RESOURCE_TYPE, JOBS_ANCHOR

ROOT = Path(__file__).resolve().parents[1]
EXIT_OK, EXIT_REPLACES, EXIT_UNUSABLE = 0, 1, 2

# Types whose replacement loses state or capacity. Buckets count when they are the checkpoint bucket.
CRITICAL_TYPES = {
    "AWS::EC2::VPC",
    "AWS::EC2::Subnet",
    "AWS::EKS::Cluster",
    "AWS::EKS::Nodegroup",
    "AWS::EC2::LaunchTemplate",
    "AWS::KMS::Key",
}
CHECKPOINT_BUCKET_ID_PREFIX = "Checkpoints"
MANIFEST_TYPE = "Custom::AWSCDK-EKS-KubernetesResource"  # aws_eks_v2.KubernetesManifest


def holds_jobs_anchor(resource: dict[str, Any]) -> bool:
    """A manifest resource that applies the jobs anchor ConfigMap (k8s/chart.py). Replaced (a new
    logical ID) or removed, CloudFormation deletes the old one after the new exists and CDK's
    kubectl handler runs `kubectl delete -f` on its manifest: the anchor goes, and the garbage
    collector takes every submitted RayJob it owns."""
    manifest = resource.get("Properties", {}).get("Manifest")
    if resource.get("Type") != MANIFEST_TYPE or not isinstance(manifest, str):
        return False
    try:
        objects = json.loads(manifest)
    except ValueError:
        return False
    return any(
        isinstance(o, dict)
        and o.get("kind") == "ConfigMap"
        and o.get("metadata", {}).get("name") == JOBS_ANCHOR
        for o in (objects if isinstance(objects, list) else [objects])
    )


# A node group's ScalingConfig goes to EKS's UpdateNodegroupConfig. The template's DesiredSize is
# pinned to MinSize, and EKS says of desiredSize: "Whenever this parameter changes, the number of
# worker nodes in the node group is updated to the specified size" (EKS API reference,
# NodegroupScalingConfig). Neither it nor the CloudFormation reference says whether an unchanged
# DesiredSize is sent again with a new MinSize/MaxSize; if it is, the group goes back to MinSize
# while the Cluster Autoscaler runs a job on it. Between jobs the GPU group is at MinSize anyway.
SCALING_NOTE = (
    "ScalingConfig changes: deploy it between jobs (the update may set the running size back to "
    "MinSize, ending a running job's nodes)"
)


class ReviewError(Exception):
    """The comparison cannot be made; `str()` is the message for the user."""


def is_critical(logical_id: str, resource: dict[str, Any]) -> bool:
    kind = resource.get("Type", "")
    if kind == "AWS::S3::Bucket":
        return logical_id.startswith(CHECKPOINT_BUCKET_ID_PREFIX)
    if kind == MANIFEST_TYPE:
        return holds_jobs_anchor(resource)
    # The drain: removed, a destroy no longer waits for the submitted jobs.
    return kind in CRITICAL_TYPES or kind == JOB_DRAIN_RESOURCE_TYPE


def critical_resources(template: dict[str, Any]) -> dict[str, str]:
    """logical ID -> type of the template's critical resources."""
    return {
        logical_id: resource["Type"]
        for logical_id, resource in template.get("Resources", {}).items()
        if is_critical(logical_id, resource)
    }


# ---------------------------------------------------------------- schemas


def create_only_paths(region: str, resource_type: str) -> list[list[str]] | None:
    """JSON-pointer paths (below Properties) whose change replaces the resource; None when there
    is no schema (custom resources)."""
    from cfnlint.schema import PROVIDER_SCHEMA_MANAGER, ResourceNotFoundError

    if resource_type.startswith("Custom::") or resource_type == "AWS::CloudFormation::CustomResource":
        return None  # the provider decides; CloudFormation only sends it an update
    try:
        schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema(region, resource_type).schema
    except ResourceNotFoundError:
        return None
    paths = []
    for pointer in schema.get("createOnlyProperties", []):
        parts = pointer.split("/")[1:]
        if parts and parts[0] == "properties":
            paths.append(parts[1:])
    return paths


def _at(value: Any, path: list[str]) -> Any:
    for part in path:
        if part == "*":  # list items: compare the whole list
            return value
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _references(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        if "Ref" in value and isinstance(value["Ref"], str):
            yield value["Ref"]
        if "Fn::GetAtt" in value:
            target = value["Fn::GetAtt"]
            yield target[0] if isinstance(target, list) else str(target).split(".")[0]
        for item in value.values():
            yield from _references(item)
    elif isinstance(value, list):
        for item in value:
            yield from _references(item)


# ---------------------------------------------------------------- comparison


@dataclass
class Change:
    logical_id: str
    type: str
    action: str  # added, removed, modified, replaced
    critical: bool
    details: list[str] = field(default_factory=list)


@dataclass
class StackReview:
    stack: str
    changes: list[Change] = field(default_factory=list)

    @property
    def critical_replacements(self) -> list[Change]:
        return [c for c in self.changes if c.critical and c.action in ("replaced", "removed")]


def _changed_properties(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [k for k in keys if old.get(k) != new.get(k)]


def _classify(
    old_res: dict[str, Any], new_res: dict[str, Any], region: str
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Resources in both templates that changed: (replaced, modified), logical ID -> details."""
    replaced: dict[str, list[str]] = {}
    modified: dict[str, list[str]] = {}
    for logical_id in sorted(set(old_res) & set(new_res)):
        before, after = old_res[logical_id], new_res[logical_id]
        if before.get("Type") != after.get("Type"):
            replaced[logical_id] = [f"type {before.get('Type')} -> {after.get('Type')}"]
            continue
        props_before, props_after = before.get("Properties", {}), after.get("Properties", {})
        changed = _changed_properties(props_before, props_after)
        details = [
            f"{key} changed"
            for key in ("DeletionPolicy", "UpdateReplacePolicy", "DependsOn", "Condition")
            if before.get(key) != after.get(key)
        ]
        if not changed and not details:
            continue
        paths = create_only_paths(region, after["Type"])
        forcing = [
            "/".join(path) for path in paths or [] if _at(props_before, path) != _at(props_after, path)
        ]
        if forcing:
            replaced[logical_id] = [f"{p} (create-only)" for p in forcing]
        else:
            note = "" if paths is not None else " (no resource schema: replacement unknown)"
            modified[logical_id] = [f"properties: {', '.join(changed)}{note}"] if changed else []
            modified[logical_id] += details
            if after["Type"] == "AWS::EKS::Nodegroup" and "ScalingConfig" in changed:
                modified[logical_id].append(SCALING_NOTE)
    # A create-only property that references a replaced resource changes too, at deploy time.
    grew = True
    while grew:
        grew = False
        for logical_id in sorted(set(old_res) & set(new_res) - set(replaced)):
            resource = new_res[logical_id]
            props = resource.get("Properties", {})
            hit = [
                "/".join(path)
                for path in create_only_paths(region, resource["Type"]) or []
                if set(_references(_at(props, path))) & set(replaced)
            ]
            if hit:
                replaced[logical_id] = [f"{p} references a replaced resource" for p in hit]
                modified.pop(logical_id, None)
                grew = True
    return replaced, modified


def compare_templates(stack: str, old: dict[str, Any], new: dict[str, Any], region: str) -> StackReview:
    review = StackReview(stack)
    old_res, new_res = old.get("Resources", {}), new.get("Resources", {})
    replaced, modified = _classify(old_res, new_res, region)
    for logical_id in sorted(set(new_res) - set(old_res)):
        resource = new_res[logical_id]
        review.changes.append(
            Change(logical_id, resource["Type"], "added", is_critical(logical_id, resource))
        )
    removed = sorted(set(old_res) - set(new_res))
    # Only a critical resource added can be a renamed critical one (a manifest of RayJobs is not
    # the renamed jobs anchor's).
    added_types = {
        new_res[i]["Type"]: i for i in sorted(set(new_res) - set(old_res)) if is_critical(i, new_res[i])
    }
    for logical_id in removed:
        resource = old_res[logical_id]
        change = Change(logical_id, resource["Type"], "removed", is_critical(logical_id, resource))
        twin = added_types.get(resource["Type"]) if change.critical else None
        if twin is not None:
            # CloudFormation cannot rename: a new ID is a new resource, the old one is deleted.
            change.action = "replaced"
            change.details.append(f"logical ID changed? new {resource['Type']} {twin} added")
        review.changes.append(change)
    for logical_id, details in replaced.items():
        resource = new_res[logical_id]
        review.changes.append(
            Change(logical_id, resource["Type"], "replaced", is_critical(logical_id, resource), details)
        )
    for logical_id, details in modified.items():
        resource = new_res[logical_id]
        review.changes.append(
            Change(logical_id, resource["Type"], "modified", is_critical(logical_id, resource), details)
        )
    order = {"replaced": 0, "removed": 1, "added": 2, "modified": 3}
    review.changes.sort(key=lambda c: (not c.critical, order[c.action], c.logical_id))
    return review


def templates(directory: Path) -> dict[str, dict[str, Any]]:
    """Stack name -> template of a cloud assembly folder (top-level stacks only)."""
    manifest = directory / "manifest.json"
    found: dict[str, dict[str, Any]] = {}
    if manifest.is_file():
        for artifact_id, artifact in json.loads(manifest.read_text())["artifacts"].items():
            if artifact.get("type") != "aws:cloudformation:stack":
                continue
            props = artifact["properties"]
            name = props.get("stackName", artifact.get("displayName", artifact_id))
            path = directory / props["templateFile"]
            if name and path.is_file():
                found[name] = json.loads(path.read_text())
        return found
    for path in sorted(directory.glob("*.template.json")):
        found[path.name.removesuffix(".template.json")] = json.loads(path.read_text())
    return found


def compare_assemblies(old_dir: Path | None, new_dir: Path, region: str) -> list[StackReview]:
    """`old_dir` None: nothing before (an environment new at the base): every resource is added."""
    old, new = (templates(old_dir) if old_dir else {}), templates(new_dir)
    if not new:
        raise ReviewError(f"{new_dir}: no CloudFormation templates")
    reviews = []
    for stack in sorted(set(old) | set(new)):
        reviews.append(compare_templates(stack, old.get(stack, {}), new.get(stack, {}), region))
    return reviews


# ---------------------------------------------------------------- synthesis


def synthesize_current(env: str, out: Path) -> Path:
    from config.loader import load_settings
    from stacks.synth_all import synthesize

    synthesize(load_settings(env), out)
    return out / env


def synthesize_ref(env: str, ref: str, out: Path, *, repo: Path | None = None) -> Path | None:
    """Synthesize `env` as of git `ref` of `repo` (default: this checkout), in a temporary
    worktree, with this interpreter; None when the environment does not exist there (no
    config/environments/<env>.yaml at `ref`)."""
    repo = repo or ROOT
    git = shutil.which("git")
    if git is None:
        raise ReviewError("git is not installed; pass a saved cdk.out folder as --base")
    if ref.startswith("-"):
        raise ReviewError(f"{ref!r} is not a git ref")
    worktree = out / "worktree"
    # Arguments go to git as a list (no shell); the ref cannot be read as an option (checked above).
    run = subprocess.run(  # noqa: S603
        [git, "-C", str(repo), "worktree", "add", "--detach", str(worktree), ref],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode:
        raise ReviewError(f"git worktree add {ref}: {run.stderr.strip()}")
    try:
        if not (worktree / "config" / "environments" / f"{env}.yaml").is_file():
            return None
        env_vars = {**os.environ, "PYTHONPATH": str(worktree)}
        synth = subprocess.run(  # noqa: S603 (this interpreter, fixed arguments)
            [sys.executable, "-m", "stacks.synth_all", env, "--out", str(out / "base")],
            cwd=worktree,
            env=env_vars,
            capture_output=True,
            text=True,
            check=False,
        )
        if synth.returncode:
            raise ReviewError(f"synthesis of env={env} at {ref} failed:\n{synth.stderr[-3000:]}")
    finally:
        subprocess.run(  # noqa: S603
            [git, "-C", str(repo), "worktree", "remove", "--force", str(worktree)],
            capture_output=True,
            check=False,
        )
    return out / "base" / env


def resolve_base(env: str, base: str, scratch: Path) -> Path | None:
    path = Path(base)
    if path.is_dir():
        # A cdk.out folder holding <env>/, or the environment's assembly itself.
        return path / env if (path / env / "manifest.json").is_file() else path
    return synthesize_ref(env, base, scratch)


# ---------------------------------------------------------------- output


def render(reviews: list[StackReview], title: str) -> Table:
    table = Table(title=title)
    for column in ("stack", "resource", "type", "change", "critical", "why"):
        table.add_column(column)
    styles = {"replaced": "bold red", "removed": "red", "added": "green", "modified": "yellow"}
    for review in reviews:
        for change in review.changes:
            style = styles[change.action] if change.critical or change.action != "modified" else ""
            table.add_row(
                review.stack,
                change.logical_id,
                change.type,
                f"[{style}]{change.action}[/]" if style else change.action,
                "yes" if change.critical else "",
                "; ".join(change.details),
            )
    return table


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "review",
        help="offline change review against a git ref or a saved cdk.out, with a replacement guard",
        description=(__doc__ or "").split("\n\n", 1)[0],
    )
    env_argument(parser)
    parser.add_argument(
        "--base",
        default="HEAD",
        help="git ref to synthesize, or a saved cdk.out folder (default: HEAD, the last commit)",
    )
    parser.add_argument("--current", type=Path, help="compare this assembly folder instead of synthesizing")
    parser.add_argument("--json", action="store_true", help="print the changes as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, console: Console | None = None) -> int:
    from config.loader import SettingsError, load_settings

    # Errors on stderr from the command line; a caller's console (tests) takes both.
    err = console or Console(stderr=True, soft_wrap=True)
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    try:
        settings = load_settings(args.env)
    except SettingsError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_UNUSABLE
    scratch = Path(tempfile.mkdtemp(prefix="raytrain-review-"))
    try:
        base_dir = resolve_base(args.env, args.base, scratch)
        current = args.current or synthesize_current(args.env, scratch / "current")
        reviews = compare_assemblies(base_dir, current, settings.region)
    except ReviewError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_UNUSABLE
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if base_dir is None:
        err.print(
            f"env={args.env} does not exist at {args.base} (no config/environments/{args.env}.yaml "
            "there): nothing is deployed from it, every resource below is new"
        )
    blocking = [c for r in reviews for c in r.critical_replacements]
    if args.json:
        print(
            json.dumps(
                [{"stack": r.stack, "changes": [c.__dict__ for c in r.changes]} for r in reviews], indent=2
            )
        )
    else:
        console.print(
            render(
                reviews, f"env={args.env}: {args.base} -> {'working tree' if not args.current else current}"
            )
        )
        for review in reviews:
            counts = {
                a: sum(c.action == a for c in review.changes)
                for a in ("added", "removed", "modified", "replaced")
            }
            console.print(f"{review.stack}: " + ", ".join(f"{n} {a}" for a, n in counts.items()))
        if blocking:
            console.print(
                f"[bold red]{len(blocking)} critical resource(s) would be replaced or removed:[/] "
                + ", ".join(c.logical_id for c in blocking)
            )
        else:
            console.print("[green]no critical resource is replaced or removed[/]")
    return EXIT_REPLACES if blocking else EXIT_OK

"""Environment files for the tests, written into folders of their own, never into config/environments/.

- The shipped examples as shipped (`write_examples`): dev.yaml and prod.yaml with the fields README
  step 1 asks a user to change (account, region and zones, the principals, the CIDRs, the pipeline's
  source) at the values the examples ship with, and every other file of the checkout as it is. The
  test suite reads its environments from there (tests/conftest.py sets RAYTRAIN_CONFIG_DIR), so the
  tests that check dev and prod by name pass on a checkout whose dev.yaml was edited as step 1 says,
  and a user's own files are tested beside them by the rules that hold for any environment.
- A user's own environment (`copy_environment`): a shipped file copied to a new name and edited.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from config.loader import ENVIRONMENTS_DIR

# What README step 1 changes, as the examples ship it (documentation placeholders: 111122223333,
# the RFC 5737 ranges; config/placeholders.py knows them as such).
_PLACEHOLDER_ACCOUNT = "111122223333"
EXAMPLE_FIELDS: dict[str, dict[str, Any]] = {
    "dev": {
        "account": _PLACEHOLDER_ACCOUNT,
        "region": "us-west-2",
        "vpc.availability_zones": ["us-west-2a", "us-west-2b"],
        "gpu_nodes.availability_zone": "us-west-2b",
        "cluster.public_access_cidrs": ["203.0.113.0/24"],
        "cluster.admin_principal_arns": [f"arn:aws:iam::{_PLACEHOLDER_ACCOUNT}:role/Admin"],
        "teams.research.submitters": [f"arn:aws:iam::{_PLACEHOLDER_ACCOUNT}:role/MLEngineer"],
        "teams.applied.submitters": [f"arn:aws:iam::{_PLACEHOLDER_ACCOUNT}:role/AppliedML"],
    },
    "prod": {
        "account": _PLACEHOLDER_ACCOUNT,
        "region": "us-west-2",
        "vpc.availability_zones": ["us-west-2a", "us-west-2b", "us-west-2c"],
        "gpu_nodes.availability_zone": "us-west-2c",
        "cluster.public_access_cidrs": ["198.51.100.0/24"],
        "cluster.admin_principal_arns": [f"arn:aws:iam::{_PLACEHOLDER_ACCOUNT}:role/PlatformAdmin"],
        "teams.llm.submitters": [f"arn:aws:iam::{_PLACEHOLDER_ACCOUNT}:role/MLEngineer"],
        "teams.evaluation.submitters": [f"arn:aws:iam::{_PLACEHOLDER_ACCOUNT}:role/EvalEngineer"],
        "pipeline.connection_arn": f"arn:aws:codeconnections:us-west-2:{_PLACEHOLDER_ACCOUNT}:connection/"
        "00000000-0000-4000-8000-000000000000",
        "pipeline.repository": "example-org/ray-train-efa-eks",
    },
}


def write_examples(target: Path) -> Path:
    """`target` holding the shipped examples as shipped (EXAMPLE_FIELDS over the checkout's dev.yaml
    and prod.yaml, everything else in them as the checkout has it), example.yaml, and every other
    environment file of config/environments/ unchanged."""
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(ENVIRONMENTS_DIR.glob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        if path.stem in EXAMPLE_FIELDS:
            text = example_text(path.stem)
        (target / path.name).write_text(text, encoding="utf-8")
    return target


def example_text(name: str) -> str:
    """The shipped example `name` (dev, prod) as shipped: what write_examples writes for it; the
    checkout's text unchanged (byte for byte) where it still holds those values."""
    text = (ENVIRONMENTS_DIR / f"{name}.yaml").read_text(encoding="utf-8")
    yaml = _yaml()
    data = yaml.load(text)
    if not _set(data, EXAMPLE_FIELDS[name]):
        return text
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def _set(data: Any, fields: dict[str, Any]) -> bool:
    """Set the dotted fields that differ (lists in flow style, strings quoted as the examples
    quote the account); whether any did."""
    changed = False
    for dotted, value in fields.items():
        *path, last = dotted.split(".")
        node = data
        for part in path:
            if part not in node:
                break
            node = node[part]
        else:
            current = node.get(last)
            if (list(current) if isinstance(current, list) else current) == value:
                continue
            if isinstance(value, list):
                seq = CommentedSeq(value)
                seq.fa.set_flow_style()
                node[last] = seq
            else:
                node[last] = DoubleQuotedScalarString(value) if value.isdigit() else value
            changed = True
    return changed


def _yaml() -> YAML:
    yaml = YAML()  # round trip: the comments stay, as in a file a user edited
    yaml.preserve_quotes = True
    return yaml


def copy_environment(
    source: str,
    target_dir: Path,
    name: str,
    *,
    region: str,
    account: str | None = None,
    rename: dict[str, str] | None = None,
    edit: dict[str, Any] | None = None,
) -> Path:
    """config/environments/`source`.yaml as `target_dir`/`name`.yaml in `region`: its zones follow
    (same letters), its cluster, run and tag names take `name`, `account` replaces the account in
    every ARN, `rename` maps environment names the pipeline section lists, and `edit` sets dotted
    fields last (`{"gpu_nodes.instance_type": "p5en.48xlarge"}`)."""
    yaml = _yaml()
    data = yaml.load((ENVIRONMENTS_DIR / f"{source}.yaml").read_text(encoding="utf-8"))
    old_region, old_account = data["region"], str(data["account"])
    account = account or old_account
    data["region"] = region
    data["account"] = account
    vpc = data["vpc"]
    vpc["availability_zones"] = [region + zone.removeprefix(old_region) for zone in vpc["availability_zones"]]
    gpu = data["gpu_nodes"]
    gpu["availability_zone"] = region + gpu["availability_zone"].removeprefix(old_region)
    data["cluster"]["name"] = f"ray-train-{name}"
    for key in ("admin_principal_arns", "job_submitter_principals"):
        if key in data["cluster"]:
            data["cluster"][key] = [arn.replace(old_account, account) for arn in data["cluster"][key] or []]
    for team in (data.get("teams") or {}).values():
        team["submitters"] = [arn.replace(old_account, account) for arn in team.get("submitters") or []]
    if "job" in data and data["job"].get("run_name"):
        data["job"]["run_name"] = f"{name}-{data['job']['run_name']}"
    if "tags" in data:
        data["tags"]["environment"] = name
    pipeline = data.get("pipeline")
    if pipeline:
        names = {source: name, **(rename or {})}
        for key in ("environments", "manual_approval", "smoke_job"):
            if key in pipeline:
                pipeline[key] = [names.get(n, n) for n in pipeline[key]]
        if "connection_arn" in pipeline:
            # A connection lives in the pipeline's region and account.
            parts = pipeline["connection_arn"].split(":")
            parts[3], parts[4] = region, account
            pipeline["connection_arn"] = ":".join(parts)
    for dotted, value in (edit or {}).items():
        *path, last = dotted.split(".")
        node = data
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    target_dir.mkdir(parents=True, exist_ok=True)
    out = io.StringIO()
    yaml.dump(data, out)
    path = target_dir / f"{name}.yaml"
    path.write_text(out.getvalue(), encoding="utf-8")
    return path

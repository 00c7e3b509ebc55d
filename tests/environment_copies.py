"""A user's own environments, made the way README step 1 says: a shipped file copied to a new name
and edited (region, zones, account, cluster name, the pipeline's environment names), written into
a folder of its own (`--config-dir`), never into config/environments/."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from config.loader import ENVIRONMENTS_DIR


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
        data["cluster"][key] = [arn.replace(old_account, account) for arn in data["cluster"].get(key) or []]
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

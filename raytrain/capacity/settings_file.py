"""`--write`: record the region and GPU zone in the environment's file, keeping comments and layout,
only if the result validates; written atomically."""

from __future__ import annotations

import contextlib
import os
import tempfile
from io import StringIO
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq


def _yaml() -> YAML:
    yaml = YAML()  # round-trip: keeps comments, key order, quoting and flow style
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096  # never re-wrap long lines
    return yaml


def vpc_zones(current: list[str], gpu_zone: str, region_zones: list[str]) -> list[str]:
    """The VPC's zones after pinning `gpu_zone`.

    - It is already one of them: unchanged.
    - Same region: it is appended (no zone the VPC has is taken away from other workloads).
    - New region: as many zones as before, the GPU zone plus the region's first others in name
      order, sorted.
    """
    if gpu_zone in current:
        return list(current)
    region = gpu_zone[:-1]
    if current and all(az[:-1] == region for az in current):
        return [*current, gpu_zone]
    others = [z for z in sorted(region_zones) if z != gpu_zone]
    return sorted([gpu_zone, *others[: max(len(current), 2) - 1]])


def updated_text(
    text: str,
    *,
    region: str,
    gpu_zone: str,
    region_zones: list[str],
    reservation_id: str | None,
) -> tuple[str, list[str]]:
    """The settings file with the new placement, and a line per change."""
    yaml = _yaml()
    data = yaml.load(text)
    changes: list[str] = []

    def put(mapping: CommentedMap, key: str, value: Any, label: str, after: str | None = None) -> None:
        if key in mapping and mapping[key] == value:
            return
        old = mapping.get(key, "(unset)")
        if key in mapping or after is None or after not in mapping:
            mapping[key] = value
        else:
            mapping.insert(list(mapping).index(after) + 1, key, value)
        changes.append(f"{label}: {old} -> {value}")

    put(data, "region", region, "region")
    vpc = data["vpc"]
    new_azs = vpc_zones(list(vpc["availability_zones"]), gpu_zone, region_zones)
    if list(vpc["availability_zones"]) != new_azs:
        changes.append(f"vpc.availability_zones: {list(vpc['availability_zones'])} -> {new_azs}")
        seq = vpc["availability_zones"]
        if isinstance(seq, CommentedSeq):
            # In place, so the list keeps its flow/block style and comments.
            del seq[:]
            seq.extend(new_azs)
        else:
            vpc["availability_zones"] = new_azs
    gpu = data["gpu_nodes"]
    put(gpu, "availability_zone", gpu_zone, "gpu_nodes.availability_zone")
    if reservation_id:
        put(
            gpu,
            "capacity_reservation_id",
            reservation_id,
            "gpu_nodes.capacity_reservation_id",
            after="capacity_type",
        )
        # A reservation made outside a cluster placement group causes capacity errors.
        put(
            gpu,
            "placement_group",
            False,
            "gpu_nodes.placement_group",
            after="capacity_reservation_id",
        )
    out = StringIO()
    yaml.dump(data, out)
    return out.getvalue(), changes


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` in one step: readers see the old file or the new one, never a part."""
    mode = path.stat().st_mode & 0o777
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise

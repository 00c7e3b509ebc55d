"""What every check group shares: the result record and small readers of Kubernetes objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ZONE_LABEL = "topology.kubernetes.io/zone"

PASS, FAIL, WARN, INFO = "PASS", "FAIL", "WARN", "INFO"


@dataclass
class Check:
    name: str
    subject: str
    result: str
    detail: str


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", "?"))


def _condition(obj: dict[str, Any], kind: str) -> str | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def _quantity(value: Any) -> int:
    """Extended resources (GPUs, EFA) are whole numbers; absent means 0."""
    try:
        return int(str(value)) if value is not None else 0
    except ValueError:
        return 0


def _selector(ds: dict[str, Any]) -> str:
    match = ((ds.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(match.items()))


def _find_daemonset(daemonsets: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The plugin's own DaemonSet, by name or app label (not the chart's MPS/GFD helpers)."""
    found = [
        ds
        for ds in daemonsets
        if (name in _name(ds) or name in _labels(ds).get("app.kubernetes.io/name", ""))
        and not any(x in _name(ds) for x in ("mps", "feature-discovery"))
    ]
    return min(found, key=lambda ds: len(_name(ds))) if found else None


def _pod_ready(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and _condition(pod, "Ready") == "True"


def _condition_detail(obj: dict[str, Any], kind: str) -> str:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            why = ": ".join(str(cond[k]) for k in ("reason", "message") if cond.get(k))
            return f"{kind}={cond.get('status')}" + (f" ({why})" if why else "")
    return f"{kind} not reported"

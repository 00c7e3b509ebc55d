"""Kueue's CRDs as its chart renders them (tests/fixtures/charts/kueue-<version>, the real `helm
template` of the kubectl layer), and a check of an object against its v1beta2 schema and CEL rules:
what the API server would refuse. Rendered once per session."""

from __future__ import annotations

import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from cdk_constructs import kueue
from config.loader import load_settings
from tests.chart_render import cel_errors
from tests.helm_charts import Release, layer_helm, render

VERSION = "v1beta2"


def kueue_release(values: dict[str, Any] | None = None) -> Release:
    version = load_settings("dev").addons.kueue
    return Release(
        kueue.CHART, version, kueue.RELEASE, kueue.NAMESPACE, values or kueue.kueue_values(version)
    )


@cache
def rendered_chart(kubernetes_version: str = "1.35") -> tuple[dict[str, Any], ...]:
    work = Path(tempfile.mkdtemp(prefix="kueue-chart-"))
    helm = layer_helm(kubernetes_version, work)
    return tuple(render(helm, kueue_release(), work, kubernetes_version=kubernetes_version))


def _re2_patterns(node: Any) -> Any:
    # Kubernetes evaluates `pattern` with Go's RE2, which takes a flag group after `^`
    # ("^(?i)[a-z]..."); Python's re needs global flags first. Same language, moved flag.
    if isinstance(node, dict):
        return {
            k: (v.replace("^(?i)", "(?i)^") if k == "pattern" and isinstance(v, str) else _re2_patterns(v))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_re2_patterns(v) for v in node]
    return node


@cache
def crds() -> dict[str, dict[str, Any]]:
    """Every CRD the chart installs, by kind."""
    return {
        d["spec"]["names"]["kind"]: d for d in rendered_chart() if d["kind"] == "CustomResourceDefinition"
    }


@cache
def schema(kind: str) -> dict[str, Any]:
    (version,) = [v for v in crds()[kind]["spec"]["versions"] if v["name"] == VERSION]
    assert version["served"], f"{kind} {VERSION} is not served"
    return _re2_patterns(version["schema"]["openAPIV3Schema"])  # type: ignore[no-any-return]


def kueue_errors(obj: dict[str, Any]) -> list[str]:
    """What the API server's CRD validation would refuse in `obj` (schema and CEL rules)."""
    assert obj["apiVersion"] == f"kueue.x-k8s.io/{VERSION}", obj["apiVersion"]
    s = schema(obj["kind"])
    errors = [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(s).iter_errors(obj)
    ]
    return errors + cel_errors(s, obj)

"""Every Helm values key we set exists in the chart's own values file for the pinned version."""

from __future__ import annotations

import re
from typing import Any

import pytest
from ruamel.yaml import YAML

from cdk_constructs.addons import (
    KUBERAY_FEATURE_GATES,
    efa_device_plugin_values,
    kuberay_operator_values,
    nvidia_device_plugin_values,
    values_file,
)
from config.catalogue import CATALOGUE
from config.loader import environment_names, load_settings


def key_paths(values: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for key, value in values.items():
        path = (*prefix, key)
        if isinstance(value, dict) and value:
            paths.extend(key_paths(value, path))
        else:
            paths.append(path)
    return paths


def declared(chart_values_text: str, path: tuple[str, ...]) -> bool:
    data = YAML(typ="safe", pure=True).load(chart_values_text)
    node: Any = data
    for key in path:
        if node == {}:
            return True  # a free-form map in the chart (nodeSelector: {}): our keys are data
        if isinstance(node, dict) and key in node:
            node = node[key]
            continue
        # A documented, commented-out key counts ("# watchNamespace:").
        return re.search(rf"^\s*#\s*{re.escape(key)}:", chart_values_text, re.MULTILINE) is not None
    return True


CASES = [
    (
        "nvidia-device-plugin",
        lambda s: s.addons.nvidia_device_plugin,
        lambda s: nvidia_device_plugin_values(),
    ),
    ("aws-efa-k8s-device-plugin", lambda s: s.addons.efa_device_plugin, lambda s: efa_device_plugin_values()),
    (
        "kuberay-operator",
        lambda s: s.addons.kuberay_operator,
        lambda s: kuberay_operator_values(s.workload.namespace),
    ),
]


@pytest.mark.parametrize("env", environment_names())
@pytest.mark.parametrize(("chart", "version_of", "values_of"), CASES, ids=[c[0] for c in CASES])
def test_values_keys_exist_in_chart(env, chart, version_of, values_of):
    settings = load_settings(env)
    path = values_file(chart, version_of(settings))
    assert path.is_file(), f"add the chart's values.yaml for {chart} {version_of(settings)} as {path}"
    text = path.read_text()
    for key_path in key_paths(values_of(settings)):
        assert declared(text, key_path), f"{chart}: {'.'.join(key_path)} is not a key of {path.name}"


def test_declared_detects_unknown_keys():
    text = values_file("kuberay-operator", "1.7.0").read_text()
    assert declared(text, ("watchNamespace",))  # commented-out, documented
    assert declared(text, ("singleNamespaceInstall",))
    assert not declared(text, ("watchNamespaces",))
    assert not declared(text, ("image", "digest"))


@pytest.mark.parametrize("env", environment_names())
def test_gpu_type_is_on_efa_plugin_allowlist(env):
    """The EFA device plugin only runs on instance types in its allowlist."""
    settings = load_settings(env)
    values = YAML(typ="safe", pure=True).load(
        values_file("aws-efa-k8s-device-plugin", settings.addons.efa_device_plugin)
    )
    allowlist = values["supportedInstanceLabels"]["values"]
    assert settings.gpu_nodes.instance_type in allowlist
    # And every EFA type of the catalogue, so switching types never silently loses the plugin.
    for itype in (t for t in CATALOGUE.values() if t.efa):
        assert itype.name in allowlist, itype.name


def test_mofed_off_and_gpu_taint_tolerated():
    nvidia = nvidia_device_plugin_values()
    assert nvidia["mofedEnabled"] is False
    for values in (nvidia, efa_device_plugin_values()):
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values[
            "tolerations"
        ]
    kuberay = kuberay_operator_values("ray")
    assert kuberay["nodeSelector"] == {"role": "system"}
    assert kuberay["watchNamespace"] == ["ray"] and kuberay["singleNamespaceInstall"] is True


def test_kuberay_operator_runs_with_the_rayjob_deletion_policy_gate_on():
    """The RayJob's deletionStrategy (k8s/job.py) needs the gate; it is pinned on, by a name the
    pinned chart's own featureGates list knows (a misspelt gate would be an operator start error)."""
    gates = {g["name"]: g["enabled"] for g in kuberay_operator_values("ray")["featureGates"]}
    assert gates["RayJobDeletionPolicy"] is True
    assert gates == KUBERAY_FEATURE_GATES
    for env in environment_names():
        version = load_settings(env).addons.kuberay_operator
        chart = YAML(typ="safe", pure=True).load(values_file("kuberay-operator", version))
        known = {g["name"] for g in chart["featureGates"]}
        assert set(gates) <= known, f"kuberay-operator {version}: unknown gates {set(gates) - known}"

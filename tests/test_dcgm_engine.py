"""One DCGM host engine per GPU node (cdk_constructs/dcgm_engine.py), link by link: the synthesized
template, the real charts (`helm template`), the DcgmExporter CRD, the kubectl the handler runs,
the operator's rule for `spec.args`, and what `raytrain verify` then reads from the exporter pod."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from ruamel.yaml import YAML

from cdk_constructs import dcgm_engine as de
from config.loader import load_settings
from config.names import (
    CLOUDWATCH_NAMESPACE,
    DCGM_ENGINE_PORT,
    DCGM_EXPORTER_IMAGE,
    DCGM_REMOTE_ENGINE_ENV,
    DCGM_SERVER,
    NODE_MONITORING_AGENT,
    NODE_MONITORING_NAMESPACE,
    dcgm_engine_address,
)
from raytrain.verify.nodes import remote_engine
from tests.helm_charts import (
    chart_fixture,
    chart_values_yaml,
    cloudwatch_release,
    layer_helm,
    layer_kubectl,
    nma_release,
    render,
)

PATCH = "Custom::AWSCDK-EKS-KubernetesPatch"
MANIFEST = "Custom::AWSCDK-EKS-KubernetesResource"


def _resources(template: dict[str, Any], rtype: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == rtype}


def _engine_parts(template: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(our Service manifest, our DcgmExporter patch resource) of a Cluster template, if present."""
    service = None
    for resource in _resources(template, MANIFEST).values():
        for doc in json.loads(resource["Properties"]["Manifest"]):
            if (
                doc["kind"] == "Service"
                and doc["metadata"]["name"] == de.engine_service()["metadata"]["name"]
            ):
                service = doc
    patches = [
        r
        for r in _resources(template, PATCH).values()
        if r["Properties"]["ResourceName"] == de.DCGM_EXPORTER_RESOURCE
    ]
    assert len(patches) <= 1
    return service, (patches[0] if patches else None)


def _logical_id(template: dict[str, Any], rtype: str, **props: str) -> str:
    (found,) = [
        k
        for k, v in _resources(template, rtype).items()
        if all(v["Properties"].get(p) == want for p, want in props.items())
    ]
    return found


@pytest.fixture(scope="module")
def prod(synthesized: dict[str, Any]) -> Any:
    return synthesized["prod"]


def test_prod_points_the_exporter_at_dcgm_server(prod: Any) -> None:
    """Node monitoring and metrics both on: the Service and the patch, each after its add-on."""
    assert prod.settings.observability.node_monitoring and prod.settings.observability.metrics
    template = prod.template("Cluster")
    service, patch = _engine_parts(template)
    assert service is not None and patch is not None
    labels = {k: v for k, v in service["metadata"]["labels"].items() if not k.startswith("aws.cdk.eks/prune")}
    assert {**service, "metadata": {**service["metadata"], "labels": labels}} == de.engine_service()
    assert service["spec"]["internalTrafficPolicy"] == "Local"
    p = patch["Properties"]
    assert (p["ResourceNamespace"], p["PatchType"]) == (CLOUDWATCH_NAMESPACE, "merge")
    assert json.loads(p["ApplyPatchJson"]) == {
        "spec": {"args": {"remote-hostengine-info": dcgm_engine_address()}}
    }
    # The null survives into the template (a bare {} would leave the flag behind on delete).
    assert json.loads(p["RestorePatchJson"]) == {"spec": {"args": {"remote-hostengine-info": None}}}
    cloudwatch = _logical_id(template, "AWS::EKS::Addon", AddonName="amazon-cloudwatch-observability")
    monitoring = _logical_id(template, "AWS::EKS::Addon", AddonName=NODE_MONITORING_AGENT)
    assert cloudwatch in patch["DependsOn"]
    (service_id,) = [
        k
        for k, v in _resources(template, MANIFEST).items()
        if '"name":"dcgm-hostengine"' in v["Properties"]["Manifest"]
    ]
    assert service_id in patch["DependsOn"] and monitoring in template["Resources"][service_id]["DependsOn"]


def test_no_patch_without_both_engines(synthesized: dict[str, Any], tmp_path: Path) -> None:
    """dev (metrics off): the exporter is not deployed. Node monitoring off with metrics on: no
    dcgm-server, so the exporter keeps its embedded engine (its only one)."""
    from stacks.synth_all import synthesize
    from tests.conftest import Synthesized

    assert _engine_parts(synthesized["dev"].template("Cluster")) == (None, None)
    base = load_settings("prod")
    variant = base.model_copy(
        update={"observability": base.observability.model_copy(update={"node_monitoring": False})}
    )
    synthesize(variant, tmp_path)
    template = Synthesized(variant, tmp_path / variant.name).template("Cluster")
    assert _engine_parts(template) == (None, None)
    assert _resources(template, "AWS::EKS::Addon")  # the CloudWatch add-on is still there


def test_the_exporters_own_engine_is_a_setting(tmp_path: Path) -> None:
    """observability.dcgm_engine `exporter`: both add-ons, and the exporter left with its embedded
    engine (no Service, no patch), so a crash of it cannot take auto-repair's engine down."""
    from stacks.synth_all import synthesize
    from tests.conftest import Synthesized

    base = load_settings("prod")
    assert base.observability.dcgm_engine == "shared"
    variant = base.model_copy(
        update={"observability": base.observability.model_copy(update={"dcgm_engine": "exporter"})}
    )
    synthesize(variant, tmp_path)
    template = Synthesized(variant, tmp_path / variant.name).template("Cluster")
    assert _engine_parts(template) == (None, None)
    addons = {r["Properties"]["AddonName"] for r in _resources(template, "AWS::EKS::Addon").values()}
    assert {"eks-node-monitoring-agent", "amazon-cloudwatch-observability"} <= addons


@pytest.fixture(scope="module")
def rendered(prod: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """prod's two add-on charts, rendered by the layer's Helm with the values EKS gets."""
    work = tmp_path_factory.mktemp("dcgm")
    settings, template = prod.settings, prod.template("Cluster")
    helm = layer_helm(settings.cluster.kubernetes_version, work)
    out = {}
    for release in (nma_release(template, settings), cloudwatch_release(template, settings)):
        out[release.chart] = render(
            helm, release, work, kubernetes_version=settings.cluster.kubernetes_version
        )
    return out


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_the_service_selects_dcgm_server_on_its_port(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """The Service's selector and port are what the node monitoring chart gives `dcgm-server`, and
    its nv-hostengine listens on every address of the pod (`-b ALL`), not only loopback."""
    ds = _one(rendered[NODE_MONITORING_AGENT], "DaemonSet", DCGM_SERVER)
    assert (
        ds["metadata"]["namespace"]
        == NODE_MONITORING_NAMESPACE
        == de.engine_service()["metadata"]["namespace"]
    )
    pod = ds["spec"]["template"]
    selector = de.engine_service()["spec"]["selector"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["/usr/bin/nv-hostengine"] and container["args"] == ["-n", "-b", "ALL"]
    assert {p["containerPort"] for p in container["ports"]} == {DCGM_ENGINE_PORT}
    assert de.engine_service()["spec"]["ports"][0]["targetPort"] == DCGM_ENGINE_PORT


def _kubectl_patch(kubectl: Path, obj: dict[str, Any], patch: str, work: Path) -> dict[str, Any]:
    """What the kubectl handler runs (`kubectl patch NAME -n NS -p PATCH --type merge`), on a local
    copy of the resource: the real kubectl's merge-patch semantics, no API server."""
    src = work / "resource.json"
    src.write_text(json.dumps(obj))
    out = subprocess.run(
        [str(kubectl), "patch", "--local", "-f", str(src), "-p", patch, "--type", "merge", "-o", "json",
         "--kubeconfig", "/dev/null", "--server", "http://127.0.0.1:9"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


# The operator release whose container.go operator_container() follows.
OPERATOR_RULE_VERSION = "3.6.0"


def test_the_operator_rule_is_the_pinned_add_ons() -> None:
    """The add-on's chart runs the operator release whose rule is transcribed below: a bump of
    the add-on to another operator fails here until container.go is read again."""
    settings = load_settings("prod")
    values = YAML(typ="safe", pure=True).load(
        chart_values_yaml(
            "amazon-cloudwatch-observability", settings.addons.cloudwatch_observability_chart
        ).read_text()
    )
    assert values["manager"]["image"]["repository"] == "cloudwatch-agent-operator"
    assert values["manager"]["image"]["tag"] == OPERATOR_RULE_VERSION


def operator_container(spec: dict[str, Any]) -> dict[str, Any]:
    """The exporter container the add-on's operator builds from a DcgmExporter spec: `spec.args`
    as sorted `--key=value`, web-config-file added when tlsConfig is set, `spec.env` plus the
    collectors file (aws/amazon-cloudwatch-agent-operator v3.6.0,
    internal/manifests/dcgmexporter/container.go and configmap.go)."""
    args = dict(spec.get("args") or {})
    if spec.get("tlsConfig"):
        args["web-config-file"] = "/etc/dcgm-exporter/web-config.yaml"
    env = [
        *(spec.get("env") or []),
        {"name": "DCGM_EXPORTER_COLLECTORS", "value": "/etc/dcgm-exporter/dcp-metrics-included.csv"},
    ]
    return {
        "name": "dcgm-exporter",
        "image": spec["image"],
        "args": sorted(f"--{k}={v}" for k, v in args.items()),
        "env": env,
    }


def test_the_patch_reaches_the_exporter_container(
    prod: Any, rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """The chart renders no `spec.args` (so EKS leaves the field to us); the handler's merge patch
    adds one key the CRD accepts; the operator turns it into the flag; verify reads it back.
    Restoring removes the key and the exporter is back on its own engine."""
    cr = _one(
        rendered["amazon-cloudwatch-observability"], "DcgmExporter", de.DCGM_EXPORTER_RESOURCE.split("/")[1]
    )
    assert "args" not in cr["spec"]
    assert not [e for e in cr["spec"]["env"] if e["name"] == DCGM_REMOTE_ENGINE_ENV]
    assert remote_engine(operator_container(cr["spec"])) is None  # as deployed by the add-on alone

    patch = prod.template("Cluster")["Resources"][
        _logical_id(prod.template("Cluster"), PATCH, ResourceName=de.DCGM_EXPORTER_RESOURCE)
    ]["Properties"]
    assert (
        de.DCGM_EXPORTER_RESOURCE.split("/")[0]
        == f"{_crd()['spec']['names']['plural']}.{_crd()['spec']['group']}"
    )
    kubectl = layer_kubectl(prod.settings.cluster.kubernetes_version, tmp_path)
    patched = _kubectl_patch(kubectl, cr, patch["ApplyPatchJson"], tmp_path)
    (version,) = [v for v in _crd()["spec"]["versions"] if v["name"] == cr["apiVersion"].split("/")[1]]
    jsonschema.Draft7Validator(version["schema"]["openAPIV3Schema"]["properties"]["spec"]).validate(
        patched["spec"]
    )
    container = operator_container(patched["spec"])
    assert f"--remote-hostengine-info={dcgm_engine_address()}" in container["args"]
    assert remote_engine(container) == dcgm_engine_address()
    assert {k: v for k, v in patched["spec"].items() if k != "args"} == cr["spec"]  # nothing else changed

    restored = _kubectl_patch(kubectl, patched, patch["RestorePatchJson"], tmp_path)
    assert remote_engine(operator_container(restored["spec"])) is None


def test_the_exporter_dials_the_synthesized_service_which_reaches_the_engine(
    prod: Any, rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Each pair checked against the other side's own value, not the function that made it: the
    host and port the exporter container dials (the template's patch, applied by kubectl, turned
    into the container by the operator's rule) name the template's Service and one of its ports;
    that port's targetPort is a port of the rendered dcgm-server container."""
    template = prod.template("Cluster")
    service, patch = _engine_parts(template)
    assert service is not None and patch is not None
    cr = _one(
        rendered["amazon-cloudwatch-observability"], "DcgmExporter", de.DCGM_EXPORTER_RESOURCE.split("/")[1]
    )
    kubectl = layer_kubectl(prod.settings.cluster.kubernetes_version, tmp_path)
    dialled = remote_engine(
        operator_container(
            _kubectl_patch(kubectl, cr, patch["Properties"]["ApplyPatchJson"], tmp_path)["spec"]
        )
    )
    assert dialled is not None
    host, port = dialled.rsplit(":", 1)
    name, namespace, *_ = host.split(".")
    assert (name, namespace) == (service["metadata"]["name"], service["metadata"]["namespace"])
    (service_port,) = [p for p in service["spec"]["ports"] if p["port"] == int(port)]
    engine = _one(rendered[NODE_MONITORING_AGENT], "DaemonSet", DCGM_SERVER)
    (container,) = engine["spec"]["template"]["spec"]["containers"]
    assert service_port["targetPort"] in {p["containerPort"] for p in container["ports"]}
    assert service_port.get("protocol", "TCP") == "TCP"


def _crd() -> dict[str, Any]:
    settings = load_settings("prod")
    chart = chart_fixture("amazon-cloudwatch-observability", settings.addons.cloudwatch_observability_chart)
    return dict(
        YAML(typ="safe", pure=True).load(
            (chart / "crds" / "cloudwatch.aws.amazon.com_dcgmexporters.yaml").read_text()
        )
    )


def pairing_problem(client: tuple[int, int, int], engine: tuple[int, int, int]) -> str | None:
    """Why the exporter's DCGM (a client) may not use this nv-hostengine, or None. Same
    major.minor (NVIDIA pairs each exporter with one DCGM release and warns that other pairings may
    fail: DCGM 4.7.1 against earlier versions does, per dcgm-exporter 4.9.0's notes), and the client
    not newer than the engine: the go-dcgm fixes in v1.4801.1 are all for newer clients on older
    engines (a 4.8 client on a 4.7.1 engine's diagnostics, a 4.8.0 client's device info from a
    4.6.1 engine)."""
    if client[:2] != engine[:2]:
        return f"DCGM {client} and {engine} differ in major.minor"
    if client > engine:
        return f"the exporter's DCGM {client} is newer than the engine's {engine}"
    return None


@pytest.mark.parametrize(
    ("client", "engine", "ok"),
    [((4, 6, 0), (4, 6, 1), True), ((4, 6, 1), (4, 6, 1), True), ((4, 6, 2), (4, 6, 1), False),
     ((4, 7, 0), (4, 6, 1), False), ((4, 5, 9), (4, 6, 1), False)],
)  # fmt: skip
def test_the_pairing_rule_at_its_boundaries(
    client: tuple[int, int, int], engine: tuple[int, int, int], ok: bool
) -> None:
    assert (pairing_problem(client, engine) is None) is ok


def test_exporter_and_engine_are_the_same_dcgm_release() -> None:
    """The exporter's DCGM (its image tag, <dcgm>-<exporter>-<variant>) and dcgm-server's
    nv-hostengine (the agent image's DCGM_VERSION), each read from its own source, pass
    `pairing_problem`. An add-on bump that splits them fails here."""
    settings = load_settings("prod")
    values = YAML(typ="safe", pure=True).load(
        chart_values_yaml(
            "amazon-cloudwatch-observability", settings.addons.cloudwatch_observability_chart
        ).read_text()
    )
    image = values["dcgmExporter"]["image"]
    assert image["repository"] == DCGM_EXPORTER_IMAGE
    exporter_dcgm = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)-\d+\.\d+\.\d+-\w+", image["tag"])
    dockerfile = (
        chart_fixture(NODE_MONITORING_AGENT, settings.addons.node_monitoring_agent_chart) / "Dockerfile"
    ).read_text()
    engine_dcgm = re.search(r"^ARG DCGM_VERSION=(\d+)\.(\d+)\.(\d+)-\d+$", dockerfile, re.MULTILINE)
    assert exporter_dcgm and engine_dcgm
    client = tuple(int(x) for x in exporter_dcgm.groups())
    engine = tuple(int(x) for x in engine_dcgm.groups())
    assert pairing_problem(client, engine) is None, (image["tag"], engine_dcgm.group(0))  # type: ignore[arg-type]

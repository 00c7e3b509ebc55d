"""Kueue: its pinned chart as the Cluster stack installs it (rendered by the real `helm template`),
and the teams' queues validated against the CRDs that chart installs (schema and CEL rules)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from ruamel.yaml import YAML

from cdk_constructs import kueue
from cdk_constructs.addons import values_file
from config import startup
from config.loader import environment_names, load_settings
from config.names import EFA_RESOURCE, GPU_RESOURCE
from config.settings import Settings
from k8s import kueue as queues
from tests import chart_render
from tests.helm_charts import helm_releases, layer_helm, render
from tests.kueue_crds import kueue_errors, rendered_chart
from tests.test_addons import declared, key_paths
from tests.test_cluster_autoscaler import gpu_nodegroup, resources

ENVS = environment_names()
TEAMS = {
    "research": {"submitters": ["arn:aws:iam::111122223333:role/Research"], "gpu_nodes": 1},
    "applied": {
        "submitters": ["arn:aws:iam::111122223333:role/Applied"],
        "gpu_nodes": 1,
        "borrowing_limit_nodes": 1,
        "lending_limit_nodes": 0,
        "default_priority": "low",
    },
}


def with_teams(base: str, **changes: Any) -> Settings:
    data = load_settings(base).model_dump(mode="json")
    data["cluster"]["job_submitter_principals"] = []
    data["teams"] = TEAMS
    for section, values in changes.items():
        data[section] = {**data[section], **values}
    return Settings.model_validate(data)


# Settings as unlike each other as the environments are: each shipped file, two teams on dev, an
# 8-GPU / 32-EFA type (p5), and a type without EFA.
VARIANTS = {
    **{env: (lambda e=env: load_settings(e)) for env in ENVS},
    "example": lambda: load_settings("example"),
    "two-teams": lambda: with_teams("dev"),
    "p5": lambda: chart_render.settings_of("p5"),
    "g5-no-efa": lambda: chart_render.settings_of("g5-no-efa"),
}


# --------------------------------------------------------------------------- the chart


def test_values_keys_exist_in_the_charts_values_file():
    version = load_settings("dev").addons.kueue
    text = values_file(kueue.CHART, version).read_text()
    for key_path in key_paths(kueue.kueue_values(version)):
        assert declared(text, key_path), ".".join(key_path)


@pytest.fixture(scope="module", params=ENVS)
def installed(request, synthesized, tmp_path_factory) -> tuple[Settings, list[dict[str, Any]]]:
    """The kueue release of a synthesized Cluster template, rendered with exactly its values."""
    synth = synthesized[request.param]
    settings = synth.settings
    release = helm_releases(synth.template("Cluster"))[kueue.CHART]
    assert (release.release, release.namespace) == (kueue.RELEASE, kueue.NAMESPACE)
    assert release.version == settings.addons.kueue
    work = tmp_path_factory.mktemp("kueue")
    version = settings.cluster.kubernetes_version
    return settings, render(layer_helm(version, work), release, work, kubernetes_version=version)


def test_the_template_installs_the_pinned_oci_chart_and_waits(synthesized):
    template = synthesized["dev"].template("Cluster")
    (chart,) = [
        r["Properties"]
        for r in resources(template, "Custom::AWSCDK-EKS-HelmChart").values()
        if r["Properties"]["Chart"] == kueue.CHART
    ]
    assert chart["Repository"] == "oci://registry.k8s.io/kueue/charts/kueue"
    assert chart["Version"] == "0.19.2"
    assert chart["Wait"] is True


def test_controller_on_system_nodes_with_its_image_through_the_cache(installed):
    settings, docs = installed
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "system"}
    (container,) = pod["containers"]
    image = settings.image_source.resolve(kueue.IMAGE)
    assert image != kueue.IMAGE  # the environment's own registry
    assert container["image"] == f"{image}:v{settings.addons.kueue}"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert deployment["spec"]["replicas"] == 2
    (pdb,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["minAvailable"] == 1
    # Ready only when the webhook listens (cmd/kueue/main.go): helm --wait waits on this probe.
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def manager_configuration(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (config_map,) = [
        d for d in docs if d["kind"] == "ConfigMap" and "controller_manager_config.yaml" in d.get("data", {})
    ]
    return YAML(typ="safe", pure=True).load(config_map["data"]["controller_manager_config.yaml"])  # type: ignore[no-any-return]


def test_manager_manages_only_rayjobs_and_waits_for_ready_pods(installed):
    _, docs = installed
    config = manager_configuration(docs)
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["integrations"]["frameworks"] == ["ray.io/rayjob"]
    # In the team namespaces (labelled by the Cluster stack) a RayJob without a queue is held
    # suspended; elsewhere nothing unlabelled is touched.
    assert config["manageJobsWithoutQueueName"] is True
    assert config["managedJobsNamespaceSelector"] == {"matchLabels": {"ray-train/queued": "true"}}
    ready = config["waitForPodsReady"]
    assert ready["timeout"] == f"{kueue.PODS_READY_TIMEOUT_SECONDS}s"
    assert ready["recoveryTimeout"] == ready["timeout"]
    assert ready["blockAdmission"] is False
    assert ready["requeuingStrategy"]["backoffBaseSeconds"] > 0
    assert "backoffLimitCount" not in ready["requeuingStrategy"]  # requeued for as long as it takes


def _minutes(duration: str) -> int:
    return int(duration[:-1]) if duration.endswith("m") else int(duration[:-1]) // 60


def test_kueues_ready_timeout_covers_the_autoscalers_node_wait_and_the_rest(installed, synthesized):
    """The rendered Kueue configuration's timeout is the sum of the start-up parts
    (config/startup.py), one of which is the autoscaler's --max-node-provision-time as the Cluster
    template sets it: Kueue never evicts a job whose nodes the autoscaler still waits for."""
    settings, docs = installed
    env = settings.name
    timeout = manager_configuration(docs)["waitForPodsReady"]["timeout"]
    assert timeout == f"{60 * sum(startup.START_PARTS.values())}s"
    autoscaler = helm_releases(synthesized[env].template("Cluster"))["cluster-autoscaler"]
    node_wait = _minutes(autoscaler.values["extraArgs"]["max-node-provision-time"])
    assert node_wait == startup.NODE_PROVISION_MINUTES
    others = startup.DEVICE_PLUGIN_MINUTES + startup.IMAGE_PULL_MINUTES + startup.RAY_READY_MINUTES
    assert int(timeout[:-1]) >= 60 * (node_wait + others)
    # Each part named and positive: a part dropped to 0 would hide behind the sum.
    assert all(minutes > 0 for minutes in startup.START_PARTS.values()) and len(startup.START_PARTS) == 4


def test_pods_ready_timeout_fits_inside_the_jobs_start_budget():
    # Kueue's eviction (requeue, not a failure) must come before KubeRay's preRunningDeadline fails
    # the attempt: the default budget and every shipped environment's.
    for env in [*ENVS, "example"]:
        assert load_settings(env).job.start_timeout_seconds > kueue.PODS_READY_TIMEOUT_SECONDS, env


def test_rayjob_webhooks_are_served(installed):
    _, docs = installed
    hooks = [
        h
        for d in docs
        if d["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for h in d["webhooks"]
    ]
    rayjob = [h for h in hooks if any("rayjobs" in r.get("resources", []) for r in h.get("rules", []))]
    assert {h["clientConfig"]["service"]["namespace"] for h in rayjob} == {kueue.NAMESPACE}
    assert len(rayjob) >= 2  # defaulting (suspend, queue) and validation


def test_the_chart_serves_v1beta2_for_every_kind_we_write():
    kinds = {d["kind"] for d in rendered_chart() if d["kind"] == "CustomResourceDefinition"}
    assert kinds
    for obj in queues.queue_objects(load_settings("dev")):
        assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta2"


def test_provisioning_requests_crd_comes_before_kueue_and_the_autoscaler(synthesized):
    template = synthesized["dev"].template("Cluster")
    manifests = resources(template, "Custom::AWSCDK-EKS-KubernetesResource")
    (crd_id,) = [
        k
        for k, r in manifests.items()
        if "provisioningrequests.autoscaling.x-k8s.io" in json.dumps(r["Properties"]["Manifest"])
    ]
    charts = resources(template, "Custom::AWSCDK-EKS-HelmChart")
    for name in (kueue.CHART, "cluster-autoscaler"):
        (chart,) = [r for r in charts.values() if r["Properties"]["Chart"] == name]
        assert crd_id in chart.get("DependsOn", []), name
    crd = YAML(typ="safe", pure=True).load(kueue.PROVISIONING_REQUEST_CRD)
    # Kueue v0.19.2 creates autoscaling.x-k8s.io/v1 requests (cmd/kueue/main.go imports
    # .../apis/provisioningrequest/autoscaling.x-k8s.io/v1): that version served and stored.
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert v1["served"] and v1["storage"] and crd["spec"]["group"] == "autoscaling.x-k8s.io"


def test_queues_are_applied_after_kueue_and_the_team_namespaces(synthesized):
    template = synthesized["dev"].template("Cluster")
    manifests = resources(template, "Custom::AWSCDK-EKS-KubernetesResource")
    (queues_id,) = [
        k for k, r in manifests.items() if "ClusterQueue" in json.dumps(r["Properties"]["Manifest"])
    ]
    depends = template["Resources"][queues_id]["DependsOn"]
    charts = resources(template, "Custom::AWSCDK-EKS-HelmChart")
    (kueue_id,) = [k for k, r in charts.items() if r["Properties"]["Chart"] == kueue.CHART]
    (ns_id,) = [k for k, r in manifests.items() if '"kind":"Namespace"' in r["Properties"]["Manifest"]]
    assert kueue_id in depends and ns_id in depends


# --------------------------------------------------------------------------- the queues


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_queue_object_passes_the_crds(variant):
    settings = VARIANTS[variant]()
    for obj in queues.queue_objects(settings):
        assert kueue_errors(obj) == [], (obj["kind"], obj["metadata"]["name"])


def test_the_crd_check_refuses_what_the_api_server_would():
    cq = queues.cluster_queue(with_teams("dev"), with_teams("dev").team_list[1])
    bad = copy.deepcopy(cq)
    del bad["spec"]["cohortName"]  # borrowingLimit without a cohort: a CEL rule
    assert any("borrowingLimit must be nil" in e for e in kueue_errors(bad))
    bad = copy.deepcopy(cq)
    bad["spec"]["resourceGroups"][0]["flavors"][1]["resources"].pop()  # a covered resource left out
    assert any("same number of resources" in e for e in kueue_errors(bad))
    bad = copy.deepcopy(cq)
    bad["spec"]["queueingStrategy"] = "Fastest"
    assert any("queueingStrategy" in e for e in kueue_errors(bad))
    flavor = copy.deepcopy(queues.resource_flavors(load_settings("dev"))[1])
    flavor["spec"]["nodeTaints"][0]["effect"] = "NoPlacement"
    assert kueue_errors(flavor)


@pytest.mark.parametrize("env", ENVS)
def test_flavors_name_the_labels_and_taint_the_node_groups_set(synthesized, env):
    settings = synthesized[env].settings
    template = synthesized[env].template("Cluster")
    _, group = gpu_nodegroup(template)
    system, gpu = queues.resource_flavors(settings)
    assert gpu["spec"]["nodeLabels"] == group["Properties"]["Labels"]
    taints = [
        {"key": t["Key"], "value": t["Value"], "effect": {"NO_SCHEDULE": "NoSchedule"}[t["Effect"]]}
        for t in group["Properties"]["Taints"]
    ]
    assert gpu["spec"]["nodeTaints"] == taints
    system_groups = [
        r
        for r in resources(template, "AWS::EKS::Nodegroup").values()
        if r["Properties"]["Labels"].get("role") == "system"
    ]
    (system_group,) = system_groups
    assert system["spec"]["nodeLabels"].items() <= system_group["Properties"]["Labels"].items()


def _millis(q: str) -> int:
    return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)


def _mib(q: str) -> int:
    units = {"Mi": 1, "Gi": 1024}
    return int(q[:-2]) * units[q[-2:]]


def _quota(cq: dict[str, Any], flavor: str, key: str = "nominalQuota") -> dict[str, Any]:
    (group,) = cq["spec"]["resourceGroups"]
    (found,) = [f for f in group["flavors"] if f["name"] == flavor]
    return {r["name"]: r.get(key) for r in found["resources"]}


@pytest.mark.parametrize("variant", ["dev", "prod", "p5", "g5-no-efa", "two-teams"])
def test_a_nodes_quota_admits_exactly_one_worker_and_the_head_fits_the_headroom(variant):
    """The quota in pod terms: the RayJob's own worker, head and submitter (as the chart renders
    them) against what one node of quota and one job's headroom give."""
    settings = VARIANTS[variant]()
    rayjob_settings = settings
    rendered = chart_render.render(rayjob_settings)
    (job,) = [o for o in rendered if o["kind"] == "RayJob"] or [None]
    if job is None:
        pytest.skip("no deployed job")
    spec = job["spec"]["rayClusterSpec"]
    (worker,) = spec["workerGroupSpecs"]
    requests = worker["template"]["spec"]["containers"][0]["resources"]["requests"]
    one_node = queues.node_resources(settings, 1)
    assert _millis(requests["cpu"]) == one_node["cpu"]
    assert _mib(requests["memory"]) == one_node["memory"]
    assert int(requests[GPU_RESOURCE]) == one_node[GPU_RESOURCE]
    assert (EFA_RESOURCE in requests) == settings.gpu_nodes.efa == (EFA_RESOURCE in one_node)
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    submitter = job["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["resources"]["requests"]
    headroom = queues.job_headroom(settings)
    assert _millis(head["cpu"]) + _millis(submitter["cpu"]) == headroom["cpu"]
    assert _mib(head["memory"]) + _mib(submitter["memory"]) == headroom["memory"]
    for team in settings.team_list:
        cq = queues.cluster_queue(settings, team)
        system = _quota(cq, queues.SYSTEM_FLAVOR)
        assert _millis(system["cpu"]) >= headroom["cpu"] and system[GPU_RESOURCE] == 0
        gpu = _quota(cq, queues.gpu_flavor_name(settings))
        assert gpu[GPU_RESOURCE] == team.gpu_nodes * settings.gpu_nodes.instance.gpus


def test_borrowing_and_lending_limits_follow_the_team():
    settings = with_teams("dev")
    research, applied = settings.team_list
    flavor = queues.gpu_flavor_name(settings)
    cq = queues.cluster_queue(settings, research)
    assert _quota(cq, flavor, "borrowingLimit")[GPU_RESOURCE] is None  # unset: any idle quota
    assert _quota(cq, flavor, "lendingLimit")[GPU_RESOURCE] is None
    cq = queues.cluster_queue(settings, applied)
    assert _quota(cq, flavor, "borrowingLimit")[GPU_RESOURCE] == 4  # one g6.12xlarge
    assert _quota(cq, flavor, "lendingLimit")[GPU_RESOURCE] == 0
    assert cq["spec"]["cohortName"] == queues.COHORT
    assert cq["spec"]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ray-applied"}
    (check,) = cq["spec"]["admissionChecksStrategy"]["admissionChecks"]
    assert check == {"name": queues.PROVISIONING_CHECK, "onFlavors": [flavor]}


def test_one_local_queue_per_team_in_its_namespace():
    settings = with_teams("dev")
    lqs = [o for o in queues.queue_objects(settings) if o["kind"] == "LocalQueue"]
    assert [(o["metadata"]["namespace"], o["spec"]["clusterQueue"]) for o in lqs] == [
        ("ray-research", "research"),
        ("ray-applied", "applied"),
    ]
    (implicit,) = [o for o in queues.queue_objects(load_settings("example")) if o["kind"] == "LocalQueue"]
    assert implicit["metadata"]["namespace"] == load_settings("example").workload.namespace


def test_provisioning_check_uses_the_class_that_scales_up():
    prc, check = queues.provisioning_check()
    assert prc["spec"]["provisioningClassName"] == "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    assert prc["spec"]["managedResources"] == [GPU_RESOURCE]
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/provisioning-request"


@pytest.mark.parametrize("env", ENVS)
def test_team_namespaces_are_the_ones_kueue_holds_unqueued_jobs_in(synthesized, env):
    """Every team namespace carries the label managedJobsNamespaceSelector selects, so a RayJob a
    submitter creates there without the queue label is suspended, not run around the quotas."""
    s = synthesized[env].settings
    template = synthesized[env].template("Cluster")
    manifests = resources(template, "Custom::AWSCDK-EKS-KubernetesResource")
    namespaces = [
        doc
        for r in manifests.values()
        if '"kind":"Namespace"' in r["Properties"]["Manifest"]
        for doc in json.loads(r["Properties"]["Manifest"])
    ]
    assert sorted(n["metadata"]["name"] for n in namespaces) == sorted(t.namespace for t in s.team_list)
    selector = kueue.manager_config()["managedJobsNamespaceSelector"]["matchLabels"]
    for namespace in namespaces:
        assert selector.items() <= namespace["metadata"]["labels"].items(), namespace["metadata"]["name"]

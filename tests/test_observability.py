"""Node health and repair, Container Insights, the step-metric path and the dashboard, on the
synthesized templates and manifests."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdk_constructs import observability as obs
from training.options.train import build_parser
from training.reporting import emf

# Fluent Bit's built-in `cri` parser (what `multiline.parser cri` applies to containerd's files).
CRI = re.compile(r"^(?P<time>[^ ]+) (?P<stream>stdout|stderr) (?P<p>[^ ]*) (?P<log>.*)$")


def _resources(template: dict[str, Any], rtype: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == rtype}


def _nodegroups(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    groups = _resources(template, "AWS::EKS::Nodegroup")
    return {v["Properties"]["Labels"]["role"]: v["Properties"] for v in groups.values()}


def _addons(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        v["Properties"]["AddonName"]: v["Properties"]
        for v in _resources(template, "AWS::EKS::Addon").values()
    }


@pytest.fixture(scope="module")
def prod(synthesized: dict[str, Any]) -> Any:
    return synthesized["prod"]


@pytest.fixture(scope="module")
def dev(synthesized: dict[str, Any]) -> Any:
    return synthesized["dev"]


# --- node health ----------------------------------------------------------------------------------


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_gpu_group_repairs_itself_one_node_at_a_time(synthesized: dict[str, Any], env: str) -> None:
    groups = _nodegroups(synthesized[env].template("Cluster"))
    assert groups["gpu-worker"]["NodeRepairConfig"] == {"Enabled": True, "MaxParallelNodesRepairedCount": 1}
    # The issue asks for the GPU group; the system group keeps EKS's default (off).
    assert "NodeRepairConfig" not in groups["system"]


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_node_monitoring_agent_is_on_by_default(synthesized: dict[str, Any], env: str) -> None:
    addons = _addons(synthesized[env].template("Cluster"))
    agent = addons[obs.NODE_MONITORING_ADDON]
    assert agent["PreserveOnDelete"] is False  # removed with the stack, not orphaned
    assert synthesized[env].settings.observability.node_monitoring


def _node_monitoring_schema(settings: Any) -> dict[str, Any]:
    from tests.helm_charts import chart_fixture

    chart = chart_fixture(obs.NODE_MONITORING_ADDON, settings.addons.node_monitoring_agent_chart)
    return json.loads((chart / "configuration.schema.json").read_text())


@pytest.mark.parametrize("env", ["dev", "prod"])
def test_node_monitoring_agent_is_pinned_and_its_configuration_fits_the_addons_schema(
    synthesized: dict[str, Any], env: str
) -> None:
    """EKS validates ConfigurationValues against the add-on version's schema (additionalProperties
    false throughout) and refuses the add-on otherwise: what we send must pass it here first."""
    import jsonschema

    settings = synthesized[env].settings
    agent = _addons(synthesized[env].template("Cluster"))[obs.NODE_MONITORING_ADDON]
    assert agent["AddonVersion"] == settings.addons.node_monitoring_agent == "v1.7.0-eksbuild.1"
    config = json.loads(agent["ConfigurationValues"])
    assert config == obs.node_monitoring_configuration()
    schema = _node_monitoring_schema(settings)
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(config)
    # The DCGM host engine tolerates the GPU group's taint (the chart's default is none).
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in config["dcgmAgent"][
        "tolerations"
    ]


def test_cloudwatch_addon_is_pinned_to_the_chart_the_tests_render(prod: Any) -> None:
    from tests.helm_charts import chart_fixture

    addons = prod.settings.addons
    agent = _addons(prod.template("Cluster"))[obs.CLOUDWATCH_ADDON]
    assert agent["AddonVersion"] == addons.cloudwatch_observability == "v6.4.0-eksbuild.1"
    assert (
        chart_fixture(obs.CLOUDWATCH_ADDON, addons.cloudwatch_observability_chart) / "values.yaml"
    ).is_file()


def test_node_monitoring_schema_refuses_what_eks_would_refuse() -> None:
    """The kept schema is strict: an unknown key (aws/eks-node-monitoring-agent#241's
    runtimeClassName) or a toleration list of strings fails, as the add-on API would."""
    import jsonschema

    from config.loader import load_settings

    validator = jsonschema.Draft7Validator(_node_monitoring_schema(load_settings("dev")))
    for bad in (
        {"dcgmAgent": {"runtimeClassName": "nvidia"}},
        {"dcgmAgent": {"tolerations": ["nvidia.com/gpu"]}},
        {"dcgmAgents": {"tolerations": []}},
    ):
        assert list(validator.iter_errors(bad)), bad


def test_node_monitoring_chart_is_the_one_the_addon_version_installs() -> None:
    """Add-on vX.Y.Z-eksbuild.N is the chart of tag vX.Y.Z: its values pin the agent image to the
    add-on version (SOURCE.md of the fixture)."""
    from ruamel.yaml import YAML

    from config.loader import load_settings
    from tests.helm_charts import chart_fixture

    addons = load_settings("dev").addons
    chart = chart_fixture(obs.NODE_MONITORING_ADDON, addons.node_monitoring_agent_chart)
    meta = YAML(typ="safe", pure=True).load((chart / "Chart.yaml").read_text())
    values = YAML(typ="safe", pure=True).load((chart / "values.yaml").read_text())
    assert meta["version"] == addons.node_monitoring_agent_chart == "1.7.0"
    assert values["nodeAgent"]["image"]["tag"] == addons.node_monitoring_agent
    # The chart's own default leaves DCGM off every tainted node: the configuration must say otherwise.
    assert values["dcgmAgent"]["tolerations"] == []


def test_switches_turn_node_health_off() -> None:
    from aws_cdk.assertions import Match, Template

    from config.loader import load_settings
    from stacks.app_builder import build_environment, new_app

    base = load_settings("dev")
    off = base.model_copy(
        update={
            "observability": base.observability.model_copy(
                update={"node_monitoring": False, "gpu_node_auto_repair": False}
            )
        }
    )
    stacks = build_environment(new_app(off), off, nag=False)
    template = Template.from_stack(stacks.cluster)
    template.resource_properties_count_is("AWS::EKS::Addon", {"AddonName": obs.NODE_MONITORING_ADDON}, 0)
    template.has_resource_properties(
        "AWS::EKS::Nodegroup",
        {"Labels": {"role": "gpu-worker"}, "NodeRepairConfig": {"Enabled": False}},
    )
    template.has_resource_properties(
        "AWS::EKS::Nodegroup",
        {"Labels": {"role": "gpu-worker"}, "NodeRepairConfig": Match.exact({"Enabled": False})},
    )


# --- Container Insights -----------------------------------------------------------------------------


def test_metrics_only_where_opted_in(dev: Any, prod: Any) -> None:
    assert not dev.settings.observability.metrics and prod.settings.observability.metrics
    dev_t, prod_t = dev.template("Cluster"), prod.template("Cluster")
    assert obs.CLOUDWATCH_ADDON not in _addons(dev_t)
    assert not _resources(dev_t, "AWS::CloudWatch::Dashboard")
    assert obs.CLOUDWATCH_ADDON in _addons(prod_t)
    (dash,) = _resources(prod_t, "AWS::CloudWatch::Dashboard").values()
    assert dash["Properties"]["DashboardName"] == prod.settings.stack_prefix


def test_cloudwatch_agent_gets_its_role_through_pod_identity(prod: Any) -> None:
    template = prod.template("Cluster")
    addon = _addons(template)[obs.CLOUDWATCH_ADDON]
    (assoc,) = addon["PodIdentityAssociations"]
    # The add-on's agent and Fluent Bit run as amazon-cloudwatch/cloudwatch-agent (EKS docs).
    assert assoc["ServiceAccount"] == "cloudwatch-agent"
    role_id = assoc["RoleArn"]["Fn::GetAtt"][0]
    role = template["Resources"][role_id]["Properties"]
    statements = role["AssumeRolePolicyDocument"]["Statement"]
    actions = sorted(
        a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    )
    assert actions == ["sts:AssumeRole", "sts:TagSession"]
    assert all(s["Principal"] == {"Service": "pods.eks.amazonaws.com"} for s in statements)
    (policy,) = role["ManagedPolicyArns"]
    assert "CloudWatchAgentServerPolicy" in json.dumps(policy)
    assert addon["PreserveOnDelete"] is False


def test_log_groups_exist_with_retention_and_removal_policy(prod: Any) -> None:
    template = prod.template("Cluster")
    groups = {
        v["Properties"]["LogGroupName"]: v for v in _resources(template, "AWS::Logs::LogGroup").values()
    }
    name = prod.settings.cluster.name
    for kind in (*obs.CONTAINER_INSIGHTS_LOG_KINDS, obs.METRICS_LOG_KIND):
        group = groups[f"/aws/containerinsights/{name}/{kind}"]
        assert group["Properties"]["RetentionInDays"] == prod.settings.observability.log_retention_days
        assert group["DeletionPolicy"] == "Retain"  # prod retains its logs (storage.removal_policy)
    addon_id = next(
        k
        for k, v in _resources(template, "AWS::EKS::Addon").items()
        if v["Properties"]["AddonName"] == obs.CLOUDWATCH_ADDON
    )
    depends = set(template["Resources"][addon_id].get("DependsOn", []))
    assert {
        k
        for k, v in _resources(template, "AWS::Logs::LogGroup").items()
        if "containerinsights" in v["Properties"]["LogGroupName"]
    } <= depends


# --- the step-metric path: loop -> container log -> Fluent Bit -> EMF log group ----------------------


def _fluent_bit_conf(prod: Any) -> dict[str, dict[str, list[str]]]:
    addon = _addons(prod.template("Cluster"))[obs.CLOUDWATCH_ADDON]
    config = json.loads(addon["ConfigurationValues"])
    text = config["containerLogs"]["fluentBit"]["config"]["extraFiles"][obs.METRICS_FLUENT_BIT_FILE]
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
        elif line.strip():
            key, value = line.split(None, 1)
            current.setdefault(key, []).append(value.strip())
    return sections


def test_fluent_bit_ships_only_the_loops_emf_lines_to_their_group(prod: Any) -> None:
    conf = _fluent_bit_conf(prod)
    ns = prod.settings.workload.namespace
    # Tails the Ray namespace's containers (kubelet: <pod>_<namespace>_<container>-<id>.log) only.
    (path,) = conf["INPUT"]["Path"]
    worker_log = f"/var/log/containers/rj-x-raycluster-abc-gpu-worker-1_{ns}_ray-worker-0123abcd.log"
    assert fnmatch.fnmatch(worker_log, path)
    assert not fnmatch.fnmatch("/var/log/containers/coredns-1_kube-system_coredns-99.log", path)
    # Not under the add-on's `application.*` kubernetes filter, which would nest the JSON.
    assert not conf["INPUT"]["Tag"][0].startswith("application.")

    (grep,) = conf["FILTER"]["Regex"]
    key, regex = grep.split(None, 1)
    assert key == "log"
    line = emf.emf_line(
        {"step": 3, "loss": 2.0, "tokens_per_s": 1000.0}, cluster="c", run_name="r", timestamp_ms=1
    )
    cri = f"2026-11-30T10:00:00.123456789Z stdout F {line}"
    record = CRI.match(cri)
    assert record is not None and re.search(regex, record["log"])
    for other in (
        "[train] step 3/200 | loss 2.0000 | 1,000 tok/s",
        # Ray's forwarded copy of a worker's stdout is not a whole EMF event: not sent.
        f"(RayTrainWorker pid=77, ip=10.0.1.5) {line}",
        '{"level": "info", "msg": "json but not EMF"}',
    ):
        assert not re.search(regex, other), other

    out = conf["OUTPUT"]
    assert out["log_key"] == ["log"] and out["log_format"] == ["json/emf"]
    assert out["log_group_name"] == [
        f"/aws/containerinsights/{prod.settings.cluster.name}/{obs.METRICS_LOG_KIND}"
    ]
    assert out["auto_create_group"] == ["false"]  # the group is the stack's, with retention
    assert conf["INPUT"]["Tag"] == conf["FILTER"]["Match"] == out["Match"]


def _entrypoint(synth: Any) -> list[str]:
    (rayjob,) = (synth.directory / "manifests").glob("RayJob.*.k8s.yaml")
    doc = yaml.safe_load(rayjob.read_text())
    argv = shlex.split(doc["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "training"]
    return argv[3:]


def test_rayjob_turns_step_metrics_on_with_the_clusters_name(dev: Any, prod: Any) -> None:
    # settings -> chart -> RayJob arguments -> the training CLI's parser (the image's packages,
    # such as liger-kernel, are checked by parse_args on the cluster, not here).
    parser = build_parser()
    assert parser.parse_args(_entrypoint(prod)).metrics_cluster == prod.settings.cluster.name
    assert parser.parse_args(_entrypoint(dev)).metrics_cluster is None


# --- the dashboard --------------------------------------------------------------------------------


def _dashboard_body(synth: Any) -> dict[str, Any]:
    (dash,) = _resources(synth.template("Cluster"), "AWS::CloudWatch::Dashboard").values()
    body = dash["Properties"]["DashboardBody"]
    if isinstance(body, dict):  # Fn::Join around the region token
        body = "".join(p if isinstance(p, str) else "us-west-2" for p in body["Fn::Join"][1])
    return json.loads(body)


def test_dashboard_plots_gpu_efa_nodes_and_the_jobs_metrics(prod: Any) -> None:
    body = _dashboard_body(prod)
    expressions = [
        m[0]["expression"]
        for w in body["widgets"]
        for m in (w.get("properties", {}).get("metrics") or [])
        if isinstance(m[0], dict) and "expression" in m[0]
    ]
    text = "\n".join(expressions)
    name = prod.settings.cluster.name
    # One line per node: the per-node dimension set of Container Insights' GPU and EFA metrics.
    per_node = "{ContainerInsights,ClusterName,InstanceId,NodeName}"
    for metric in (
        "node_gpu_utilization",
        "node_gpu_memory_utilization",
        "node_efa_rx_bytes",
        "node_efa_tx_bytes",
    ):
        assert f'{per_node} MetricName="{metric}" ClusterName="{name}"' in text, metric
    for metric in ("cluster_node_count", "cluster_failed_node_count"):
        assert f'MetricName="{metric}"' in text
    # The job's metrics: the names and dimensions the loop writes (training/reporting/emf.py), written once.
    schema = "{" + ",".join((emf.NAMESPACE, *emf.DIMENSIONS)) + "}"
    for metric in (emf.TOKENS_PER_SECOND, emf.MFU, emf.LOSS):
        assert f'{schema} MetricName="{metric}" ClusterName="{name}"' in text, metric
    logs = [w for w in body["widgets"] if w["type"] == "log"]
    assert logs and f"/aws/containerinsights/{name}/{obs.METRICS_LOG_KIND}" in logs[0]["properties"]["query"]


def test_dashboard_plots_exactly_the_step_metrics_the_loop_emits(prod: Any) -> None:
    body = _dashboard_body(prod)
    schema = re.escape("{" + ",".join((emf.NAMESPACE, *emf.DIMENSIONS)) + "}")
    graphs = {
        w["properties"]["title"]: [m[0] for m in w["properties"]["metrics"]]
        for w in body["widgets"]
        if w["type"] == "metric"
    }

    def job_metrics(series: list[dict[str, Any]]) -> list[str]:
        return [n for s in series for n in re.findall(schema + r' MetricName="(\w+)"', s["expression"])]

    # Every metric of training/reporting/emf.py has a graph, and no graph searches for a name it
    # does not write.
    plotted = [n for series in graphs.values() for n in job_metrics(series)]
    assert sorted(plotted) == sorted(emf.METRICS)
    # Training and held-out loss on one graph, each line labelled with its run and its kind.
    loss = graphs["Job: loss (training, held-out)"]
    assert job_metrics(loss) == [emf.LOSS, emf.EVAL_LOSS]
    run = f"${{PROP('Dim.{emf.RUN_DIMENSION}')}}"
    assert [s["label"] for s in loss] == [f"{run} training", f"{run} held-out"]
    assert job_metrics(graphs["Job: held-out perplexity"]) == [emf.EVAL_PERPLEXITY]
    assert job_metrics(graphs["Job: held-out token accuracy"]) == [emf.EVAL_ACCURACY]
    (accuracy,) = (
        w for w in body["widgets"] if w["properties"].get("title") == "Job: held-out token accuracy"
    )
    # The loop's fraction arrives in percent (emf.METRICS' scale), the axis says so.
    assert emf.METRICS[emf.EVAL_ACCURACY][1:] == ("Percent", 100.0)
    assert accuracy["properties"]["yAxis"]["left"]["label"] == "%"
    # The log queries list the held-out figures; one keeps to the steps that evaluated.
    queries = {
        w["properties"]["title"]: w["properties"]["query"] for w in body["widgets"] if w["type"] == "log"
    }
    for query in queries.values():
        for name in (emf.EVAL_LOSS, emf.EVAL_PERPLEXITY, emf.EVAL_ACCURACY):
            assert f", {name}" in query, (name, query)
    assert f"filter ispresent({emf.EVAL_LOSS})" in queries["Latest evaluations"]


# --- settings -------------------------------------------------------------------------------------


def test_observability_settings_errors_name_the_field() -> None:
    from config.loader import SettingsError, parse_settings

    base = (Path(__file__).resolve().parents[1] / "config" / "environments" / "dev.yaml").read_text()
    for bad, field in (
        ("observability:\n  metrics: sometimes\n", "observability.metrics"),
        ("observability:\n  log_retention_days: 31\n", "observability.log_retention_days"),
        ("observability:\n  dashbord: true\n", "observability.dashbord"),
        ("addons:\n  node_monitoring_agent: 1.7.0\n", "addons.node_monitoring_agent"),
        ("addons:\n  node_monitoring_agent: latest\n", "addons.node_monitoring_agent"),
        ("addons:\n  cloudwatch_observability: v6.4.0\n", "addons.cloudwatch_observability"),
    ):
        with pytest.raises(SettingsError) as info:
            parse_settings(base + bad, name="dev", source="config/environments/dev.yaml")
        message = str(info.value)
        assert message.startswith("config/environments/dev.yaml") and field in message, message

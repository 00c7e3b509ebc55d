"""What passes for the shipped examples passes for a user's own environments (issue 51): the shipped
files copied to new names, regions and accounts (tests/conftest.py `own_environments`: team-dev in
eu-north-1, outside the regions the pinned prices cover; team-prod hosting the pipeline in us-east-1
for team-dev; team-h200 on p5en.48xlarge; a file beside them that does not parse), each taken
through synthesis (`make synth`'s `python -m stacks.synth_all`), `raytrain plan`, `cost`, `preflight`
against the pretend account, and `job submit --dry-run`, all with `--config-dir`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import jsonschema
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from rich.console import Console
from ruamel.yaml import YAML

from config.loader import load_settings
from raytrain import cli
from raytrain import cost as cost_cmd
from raytrain import plan as plan_cmd
from raytrain.preflight import command as preflight
from raytrain.preflight.eks import pinned_addons
from tests.conftest import OWN_ENVIRONMENTS
from tests.preflight_account import Account, Registry, check_line, serve_registry, set_credentials

CRD = Path(__file__).resolve().parents[1] / "k8s" / "crds" / "ray.io_rayjobs.yaml"
OUTSIDE_PRICES = "team-dev"  # eu-north-1


@pytest.mark.parametrize("name", OWN_ENVIRONMENTS)
def test_each_synthesizes_in_its_own_account_and_region(own_synthesized, name):
    env = own_synthesized[name]
    manifest = json.loads((env.directory / "manifest.json").read_text())
    where = f"aws://{env.settings.account}/{env.settings.region}"
    for stack in ("Network", "Cluster", "Workload"):
        artifact = manifest["artifacts"][f"{env.settings.stack_prefix}-{stack}"]
        assert artifact["environment"] == where, (stack, artifact["environment"])
    assert list((env.directory / "manifests").glob("RayJob.*.k8s.yaml"))


def test_the_pipeline_deploys_the_other_region_from_its_own(own_synthesized):
    host, other = own_synthesized["team-prod"], own_synthesized["team-dev"]
    stages = json.loads((host.directory / "manifest.json").read_text())["artifacts"]
    nested = host.directory / f"assembly-{host.settings.stack_prefix}-Pipeline-Deploy-team-dev"
    inner = json.loads((nested / "manifest.json").read_text())["artifacts"]
    stacks = {
        a["displayName"].rsplit("/", 1)[-1]: a
        for a in inner.values()
        if a["type"] == "aws:cloudformation:stack"
    }
    for stack in ("Network", "Cluster", "Workload", "PipelineAccess"):
        assert stacks[f"{other.settings.stack_prefix}-{stack}"]["environment"] == (
            f"aws://{other.settings.account}/{other.settings.region}"
        )
    assert stages[f"{host.settings.stack_prefix}-Pipeline"]["environment"] == (
        f"aws://{host.settings.account}/{host.settings.region}"
    )


def _plan(own: Path, *argv: str) -> tuple[int, str]:
    console = Console(record=True, width=250)
    args = cli.build_parser().parse_args(["plan", "--config-dir", str(own), *argv])
    code = plan_cmd.run(args, console=console)
    return code, console.export_text()


@pytest.mark.parametrize("name", OWN_ENVIRONMENTS)
def test_plan_shows_the_fit_and_the_speed_and_prices_what_it_can(own_environments, name):
    code, out = _plan(own_environments, "--env", name)
    assert code == plan_cmd.EXIT_FITS, out
    assert "fits:" in out and "predicted step:" in out
    if name == OUTSIDE_PRICES:
        assert (
            "cost not priced" in out and "cost: not priced: no pinned prices for region 'eu-north-1'" in out
        )
    else:
        assert "per billion tokens" in out and "not priced" not in out
    gpu = load_settings(name, own_environments).gpu_nodes.instance
    assert f"no {gpu.gpu_model} step of this job on {gpu.name} has been measured" in " ".join(out.split())


def test_plan_json_outside_the_priced_regions_has_no_cost(own_environments, capsys):
    args = cli.build_parser().parse_args(
        ["plan", "--config-dir", str(own_environments), "--env", OUTSIDE_PRICES, "--json"]
    )
    assert plan_cmd.run(args) == plan_cmd.EXIT_FITS
    data = json.loads(capsys.readouterr().out)
    assert data["job_cost_usd"] is None and data["predicted"]["tokens_per_s"] > 0
    assert data["cost_notes"][0].startswith("not priced: no pinned prices for region 'eu-north-1'")


def test_plan_compare_outside_the_priced_regions(own_environments):
    code, out = _plan(own_environments, "--env", OUTSIDE_PRICES, "--compare", "qwen2.5-1.5b", "qwen2.5-7b")
    assert code == plan_cmd.EXIT_FITS, out
    assert "Traceback" not in out and "PriceError" not in out
    lines = [line for line in out.splitlines() if line.startswith("cost: not priced: no pinned prices")]
    assert len(lines) == 1, out
    assert "Qwen/Qwen2.5-1.5B" in out


class PriceList:
    """The AWS Price List Query API as botocore's Stubber answers it (the real client checks the
    request and the response against the service model): one Linux On-Demand rate per type."""

    def __init__(self, rates: dict[str, float]) -> None:
        self.client = boto3.client("pricing", region_name="us-east-1")
        self.stub = Stubber(self.client)
        for instance_type in sorted(rates):
            product = {
                "product": {"attributes": {"instanceType": instance_type}},
                "terms": {"OnDemand": {"T": {"priceDimensions": {"D": {
                    "unit": "Hrs", "pricePerUnit": {"USD": str(rates[instance_type])}}}}}},
            }  # fmt: skip
            self.stub.add_response(
                "get_products", {"PriceList": [json.dumps(product)], "FormatVersion": "aws_v1"}
            )


@pytest.fixture
def price_list(monkeypatch: pytest.MonkeyPatch) -> PriceList:
    prices = PriceList({"g6.12xlarge": 5.1, "m7i.xlarge": 0.22})
    ec2 = boto3.client("ec2", region_name="eu-north-1")
    monkeypatch.setattr(cost_cmd, "live_clients", lambda profile, region: (prices.client, ec2))
    return prices


def test_plan_live_prices_a_region_the_table_lacks(own_environments, price_list):
    with price_list.stub:
        code, out = _plan(own_environments, "--env", OUTSIDE_PRICES, "--live")
    assert code == plan_cmd.EXIT_FITS, out
    assert "not priced" not in out and "at $" in out
    assert "instance rates from the AWS Price List API" in " ".join(out.split())
    price_list.stub.assert_no_pending_responses()


def test_plan_live_without_credentials_says_why_and_keeps_the_plan(own_environments, monkeypatch):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    code, out = _plan(own_environments, "--env", "team-prod", "--live")
    assert code == plan_cmd.EXIT_FITS, out
    flat = " ".join(out.split())
    assert "cost: --live: asking AWS for prices needs credentials" in flat
    assert "per billion tokens" in flat  # us-east-1: the pinned prices still price it


@pytest.mark.parametrize("name", OWN_ENVIRONMENTS)
def test_cost_of_each(own_environments, name, price_list, capsys):
    with price_list.stub:
        code = cli.main(["cost", "--env", name, "--config-dir", str(own_environments), "--json"])
    out, err = capsys.readouterr()
    assert code == cost_cmd.EXIT_OK, err
    data = json.loads(out)
    assert data["running_per_hour"] > data["idle_per_hour"] > 0
    if name == OUTSIDE_PRICES:  # from the stubbed Price List API, said in a note
        assert any("Price List API" in n for n in data["notes"]), data["notes"]
        price_list.stub.assert_no_pending_responses()


def test_cost_outside_the_priced_regions_without_credentials_is_one_line(
    own_environments, monkeypatch, capsys
):
    monkeypatch.setattr(
        cost_cmd,
        "live_clients",
        lambda profile, region: (_ for _ in ()).throw(cost_cmd.PriceError("no creds")),
    )
    code = cli.main(["cost", "--env", OUTSIDE_PRICES, "--config-dir", str(own_environments)])
    out, err = capsys.readouterr()
    assert code == cost_cmd.EXIT_UNUSABLE and out == ""
    assert err.count("\n") == 1 and "no pinned prices for region 'eu-north-1'" in err


@pytest.fixture
def registry() -> Any:
    yield from serve_registry()


@pytest.mark.parametrize("name", OWN_ENVIRONMENTS)
def test_preflight_of_each_against_its_own_region(own_environments, name, registry: Registry, monkeypatch):
    set_credentials(monkeypatch)
    settings = load_settings(name, own_environments)
    with mock_aws():
        account = Account(settings.region)
        account.bootstrap()
        account.version()
        for addon, (pinned, _) in pinned_addons(settings).items():  # each EKS add-on the file pins
            account.eks_stub.add_response(
                "describe_addon_versions",
                {"addons": [{"addonName": addon, "addonVersions": [{"addonVersion": pinned}]}]},
                {"addonName": addon, "kubernetesVersion": settings.cluster.kubernetes_version},
            )
        # The GPU family's On-Demand vCPU quota: G and VT, or P (raytrain/capacity/quotas.py).
        quota = "L-417A185B" if settings.gpu_nodes.instance_type.startswith("p") else "L-DB2E81BA"
        account.quota(quota, 1000)
        if settings.image_source.prefix is not None:
            account.ecr_clean()
        code, lines = account.run(own_environments, registry, env=name)
    assert code == preflight.EXIT_OK, lines
    offering = check_line(lines, "gpu offering")
    assert (
        f"{settings.gpu_nodes.instance_type} is offered in {settings.gpu_nodes.availability_zone}" in offering
    )
    assert f"aws://{settings.account}/{settings.region}" not in "\n".join(lines)  # bootstrapped
    assert lines[-1].startswith(f"{name}: ") and lines[-1].endswith(" 0 problem(s)")


@pytest.fixture(scope="module")
def rayjob_schema() -> dict[str, Any]:
    crd = YAML(typ="safe", pure=True).load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return dict(version["schema"]["openAPIV3Schema"])


@pytest.mark.parametrize("name", OWN_ENVIRONMENTS)
def test_job_submit_dry_run_of_each(own_environments, name, rayjob_schema, tmp_path, capsys):
    argv = ["job", "submit", "--env", name, "--config-dir", str(own_environments), "--dry-run",
            "--kubeconfig", str(tmp_path / "absent"),
            "--set", "job.steps=20", "--set", "job.checkpoint_every=10"]  # fmt: skip
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    rayjob = json.loads(out)
    jsonschema.validate(rayjob, rayjob_schema)
    settings = load_settings(name, own_environments)
    assert rayjob["metadata"]["namespace"] == settings.workload.namespace
    assert "rendered offline" in err and len(err.strip().splitlines()) == 1


def test_a_refused_data_location_suggests_a_prefix_for_a_file_grant(own_environments, tmp_path, capsys):
    """team-prod (prod's copy) grants its training data as one file: another data set needs a
    deploy, and the refusal says how a prefix avoids that."""
    argv = ["job", "submit", "--env", "team-prod", "--config-dir", str(own_environments), "--dry-run",
            "--kubeconfig", str(tmp_path / "absent"),
            "--set", "job.data=s3://ray-train-prod-data-111122223333/sft/v2/train.jsonl"]  # fmt: skip
    code = cli.main(argv)
    out, err = capsys.readouterr()
    flat = " ".join(err.split())
    assert code == 2 and out == ""
    assert "team-prod.yaml and deploy" in flat
    assert "give it a prefix instead, e.g. s3://ray-train-prod-data-111122223333/sft/train/" in flat

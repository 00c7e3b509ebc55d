"""`raytrain capacity`: moto for EC2, a stub of our own for Service Quotas.

moto 5.2 implements offerings, zones, instances and instance types, but not capacity reservations
or Spot placement scores (NotImplementedError), and its Service Quotas mock only knows the `vpc`
service. `Ec2` below wraps moto's client and adds those calls; both fakes check every request
against botocore's API model, so a call the real API would reject fails here too.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from botocore.validate import validate_parameters
from moto import mock_aws

from config.loader import ENVIRONMENTS_DIR, load_settings, parse_settings
from raytrain import capacity
from raytrain.aws import CapacityApi
from raytrain.capacity import command, probe
from raytrain.cli import build_parser, main

ENV_FILE_LINES = ENVIRONMENTS_DIR / "dev.yaml"


def _client_error(code: str, message: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, operation)


def _validate(client: Any, operation: str, params: dict[str, Any]) -> None:
    shape = client.meta.service_model.operation_model(operation).input_shape
    validate_parameters(params, shape)  # raises ParamValidationError like the real client


class QuotasStub:
    """Service Quotas for EC2 codes: applied values, else AWS defaults, else NoSuchResource."""

    def __init__(self, world: World, region: str) -> None:
        self.world = world
        self.region = region
        self._model = boto3.client("service-quotas", region_name=region)

    def get_service_quota(self, **params: Any) -> dict[str, Any]:
        _validate(self._model, "GetServiceQuota", params)
        if self.world.quota_error:
            raise _client_error(self.world.quota_error, "rejected", "GetServiceQuota")
        applied = self.world.applied_quotas.get(self.region, {})
        if params["ServiceCode"] != "ec2" or params["QuotaCode"] not in applied:
            raise _client_error("NoSuchResourceException", "not applied", "GetServiceQuota")
        return self._quota(params["QuotaCode"], applied[params["QuotaCode"]])

    def get_aws_default_service_quota(self, **params: Any) -> dict[str, Any]:
        _validate(self._model, "GetAWSDefaultServiceQuota", params)
        code = params["QuotaCode"]
        if code not in self.world.default_quotas:
            raise _client_error("NoSuchResourceException", code, "GetAWSDefaultServiceQuota")
        return self._quota(code, self.world.default_quotas[code])

    @staticmethod
    def _quota(code: str, value: float) -> dict[str, Any]:
        return {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "Value": value}}


class Ec2:
    """moto's EC2 client plus capacity reservations and Spot placement scores."""

    def __init__(self, world: World, region: str) -> None:
        self.world = world
        self.region = region
        self._moto = boto3.client("ec2", region_name=region)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._moto, name)

    def get_spot_placement_scores(self, **params: Any) -> dict[str, Any]:
        _validate(self._moto, "GetSpotPlacementScores", params)
        assert params["SingleAvailabilityZone"] is True
        zones = self._moto.describe_availability_zones()["AvailabilityZones"]
        by_name = {z["ZoneName"]: z["ZoneId"] for z in zones}
        return {
            "SpotPlacementScores": [
                {"Region": self.region, "AvailabilityZoneId": by_name[name], "Score": score}
                for name, score in self.world.scores.items()
                if name in by_name
            ]
        }

    def create_capacity_reservation(self, **params: Any) -> dict[str, Any]:
        _validate(self._moto, "CreateCapacityReservation", params)
        self.world.create_calls.append(params)
        code = self.world.create_errors.get(params["AvailabilityZone"])
        if code:
            raise _client_error(code, "simulated", "CreateCapacityReservation")
        rid = "cr-" + secrets.token_hex(9)[:17]
        tags = params.get("TagSpecifications", [{}])[0].get("Tags", [])
        self.world.reservations[rid] = {
            "CapacityReservationId": rid,
            "InstanceType": params["InstanceType"],
            "AvailabilityZone": params["AvailabilityZone"],
            "TotalInstanceCount": params["InstanceCount"],
            "AvailableInstanceCount": params["InstanceCount"],
            "InstanceMatchCriteria": params.get("InstanceMatchCriteria", "open"),
            "State": "active",
            "Tags": tags,
            "Region": self.region,
        }
        if self.world.after_create:
            self.world.after_create(rid)
        return {"CapacityReservation": dict(self.world.reservations[rid])}

    def cancel_capacity_reservation(self, **params: Any) -> dict[str, Any]:
        _validate(self._moto, "CancelCapacityReservation", params)
        if self.world.cancel_error:
            raise _client_error(self.world.cancel_error, "simulated", "CancelCapacityReservation")
        self.world.reservations[params["CapacityReservationId"]]["State"] = "cancelled"
        return {"Return": True}

    def describe_capacity_reservations(self, **params: Any) -> dict[str, Any]:
        _validate(self._moto, "DescribeCapacityReservations", params)
        found = [r for r in self.world.reservations.values() if r["Region"] == self.region]
        if "CapacityReservationIds" in params:
            ids = params["CapacityReservationIds"]
            found = [r for r in found if r["CapacityReservationId"] in ids]
            if not found:
                raise _client_error("InvalidCapacityReservationId.NotFound", "no such", "DescribeCR")
        for flt in params.get("Filters", []):
            name, values = flt["Name"], flt["Values"]
            if name == "state":
                found = [r for r in found if r["State"] in values]
            elif name.startswith("tag:"):
                key = name[4:]
                found = [r for r in found if any(t["Key"] == key and t["Value"] in values for t in r["Tags"])]
        return {"CapacityReservations": found}


class World:
    """The pretend AWS account of one test."""

    def __init__(self) -> None:
        self.applied_quotas: dict[str, dict[str, float]] = {}
        self.default_quotas: dict[str, float] = {"L-DB2E81BA": 0.0, "L-417A185B": 0.0}
        self.quota_error: str | None = None
        self.scores: dict[str, int] = {}
        self.create_errors: dict[str, str] = {}
        self.create_calls: list[dict[str, Any]] = []
        self.cancel_error: str | None = None
        self.after_create: Any = None
        self.reservations: dict[str, dict[str, Any]] = {}

    def factory(self, region: str) -> CapacityApi:
        return CapacityApi(region, Ec2(self, region), QuotasStub(self, region))

    def live(self) -> list[str]:
        return [r for r, v in self.reservations.items() if v["State"] != "cancelled"]

    def run_instance(self, region: str, instance_type: str, **extra: Any) -> None:
        # moto accepts any AMI id unless MOTO_ENABLE_AMI_VALIDATION is set; listing its
        # thousands of AMIs would cost seconds.
        boto3.client("ec2", region_name=region).run_instances(
            ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType=instance_type, **extra
        )


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Any:
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("COLUMNS", "250")  # rich reads it: keep table rows on one line
    # moto builds ~2,000 default AMIs per region backend otherwise: seconds per test.
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws():
        yield World()


@pytest.fixture
def envdir(tmp_path: Path) -> Path:
    """A copy of the real environment files: --write must never touch the repository's."""
    target = tmp_path / "environments"
    shutil.copytree(ENVIRONMENTS_DIR, target)
    return target


def run(world: World, envdir: Path, *argv: str) -> int:
    args = build_parser().parse_args(["capacity", "--config-dir", str(envdir), *argv])
    return capacity.run(args, api_factory=world.factory)


def rows(out: str) -> list[str]:
    """Table rows of the plan, in rank order."""
    return [line for line in out.splitlines() if line.startswith("│ ") and "│ region" not in line]


# --- quota classes -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("itype", "code"),
    [
        ("g6.12xlarge", "L-DB2E81BA"),
        ("g6e.48xlarge", "L-DB2E81BA"),
        ("gr6.4xlarge", "L-DB2E81BA"),
        ("vt1.3xlarge", "L-DB2E81BA"),
        ("p5.48xlarge", "L-417A185B"),
        ("p4de.24xlarge", "L-417A185B"),
        ("m7i.xlarge", "L-1216C47A"),
        ("t3.micro", "L-1216C47A"),
        ("im4gn.large", "L-1216C47A"),
        ("d3en.xlarge", "L-1216C47A"),
        ("z1d.large", "L-1216C47A"),
        ("inf2.xlarge", None),
        ("dl1.24xlarge", None),
        ("trn1.32xlarge", None),
        ("hpc7g.4xlarge", None),
        ("mac2.metal", None),
        ("x2idn.16xlarge", None),
    ],
)
def test_quota_class(itype: str, code: str | None) -> None:
    found = capacity.quota_class(itype)
    assert (found.code if found else None) == code


# --- plans -------------------------------------------------------------------------------------


def test_all_good_prefers_current_zone_and_writes_nothing(world, envdir, capsys) -> None:
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}
    world.scores = {"us-west-2a": 9, "us-west-2b": 3, "us-west-2c": 5}
    before = (envdir / "dev.yaml").read_text()

    assert run(world, envdir, "--env", "dev") == capacity.EXIT_FITS

    out = capsys.readouterr().out
    ranked = rows(out)
    assert len(ranked) == 4  # moto offers g6.12xlarge in us-west-2a-d
    # The zone the environment uses today stays first despite a lower Spot score; the rest
    # follow by score.
    assert "us-west-2b *" in ranked[0]
    assert [r.split("│")[3].strip() for r in ranked[1:]] == ["us-west-2a", "us-west-2c", "us-west-2d"]
    assert all("fits" in r for r in ranked)
    assert "192 of 192 vCPUs free (L-DB2E81BA), 96 needed" in out
    assert "Best: us-west-2 / us-west-2b" in out
    assert "request-service-quota-increase" not in out
    assert "Nothing written" in out
    assert (envdir / "dev.yaml").read_text() == before
    assert world.create_calls == []  # no --probe, no reservation


def test_quota_short_prints_the_increase_request(world, envdir, capsys) -> None:
    # No applied value: the AWS default (0 here, as on new accounts) is what counts... plus one
    # G instance (48 vCPUs) already running against a raised quota of 96 in us-east-1.
    world.applied_quotas["us-east-1"] = {"L-DB2E81BA": 96}
    world.run_instance("us-east-1", "g5.12xlarge")
    world.run_instance("us-east-1", "m7i.xlarge")  # standard class: not counted
    world.run_instance(
        "us-east-1", "g5.12xlarge", InstanceMarketOptions={"MarketType": "spot"}
    )  # Spot: its own quota, not counted

    code = run(world, envdir, "--env", "dev", "--regions", "us-west-2,us-east-1", "--probe")

    out = capsys.readouterr().out
    assert code == capacity.EXIT_NO_FIT
    assert "No zone fits." in out
    assert "quota short: 48 of 96 vCPUs free (L-DB2E81BA), 96 needed for 2 nodes" in out
    assert "quota short: 0 of 0 vCPUs free (L-DB2E81BA)" in out
    assert "(min_size 0 fits)" not in out  # dev's min_size 0 says nothing
    assert (
        "aws service-quotas request-service-quota-increase --region us-east-1 "
        "--service-code ec2 --quota-code L-DB2E81BA --desired-value 144"
    ) in out
    assert (
        "aws service-quotas request-service-quota-increase --region us-west-2 "
        "--service-code ec2 --quota-code L-DB2E81BA --desired-value 96"
    ) in out
    assert world.create_calls == []  # no probe where the quota already says no


def test_quota_short_for_desired_but_min_fits_is_said(world, envdir, capsys) -> None:
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 48}
    path = envdir / "dev.yaml"
    path.write_text(path.read_text().replace("  min_size: 0\n", "  min_size: 1\n"))

    assert run(world, envdir, "--env", "dev") == capacity.EXIT_NO_FIT
    assert "(min_size 1 fits)" in capsys.readouterr().out


def test_not_offered_anywhere(world, envdir, capsys) -> None:
    # moto lists no g6.12xlarge offering in eu-west-1 (it does for g5.12xlarge).
    world.applied_quotas["eu-west-1"] = {"L-DB2E81BA": 0}

    code = run(world, envdir, "--env", "dev", "--regions", "eu-west-1", "--probe")

    out = capsys.readouterr().out
    assert code == capacity.EXIT_NO_FIT
    assert "request-service-quota-increase" not in out  # more quota would not help here
    ranked = rows(out)
    assert len(ranked) == 3
    assert all("g6.12xlarge is not offered in this zone" in r for r in ranked)
    assert world.create_calls == []


def test_probe_reserves_and_cancels_each_candidate(world, envdir, capsys) -> None:
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}

    assert run(world, envdir, "--env", "dev", "--probe", "--count", "2") == capacity.EXIT_FITS

    assert len(world.create_calls) == 4
    call = world.create_calls[0]
    assert call["InstanceCount"] == 2
    assert call["InstanceMatchCriteria"] == "targeted"
    assert call["InstanceType"] == "g6.12xlarge"
    assert call["TagSpecifications"][0]["Tags"][0]["Key"] == capacity.PROBE_TAG_KEY
    assert len(world.reservations) == 4
    assert world.live() == []
    assert "probe reserved 2 and cancelled" in capsys.readouterr().out


def test_ice_on_probe_moves_to_a_zone_with_capacity(world, envdir, capsys) -> None:
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}
    world.create_errors = {
        "us-west-2b": "InsufficientInstanceCapacity",
        "us-west-2c": "InstanceLimitExceeded",
        "us-west-2d": "InsufficientInstanceCapacity",
    }

    assert run(world, envdir, "--env", "dev", "--probe") == capacity.EXIT_FITS

    out = capsys.readouterr().out
    ranked = rows(out)
    assert "us-west-2a" in ranked[0]
    assert "fits" in ranked[0]
    assert "Best: us-west-2 / us-west-2a" in out
    by_zone = {r.split("│")[3].strip().rstrip(" *"): r for r in ranked}
    assert "no capacity now (InsufficientInstanceCapacity)" in by_zone["us-west-2b"]
    assert "quota (InstanceLimitExceeded)" in by_zone["us-west-2c"]
    assert world.live() == []


def test_ice_everywhere_exits_non_zero(world, envdir, capsys) -> None:
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}
    world.create_errors = dict.fromkeys(
        ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"], "InsufficientInstanceCapacity"
    )

    assert run(world, envdir, "--env", "dev", "--probe", "--write") == capacity.EXIT_NO_FIT
    assert "No zone fits." in capsys.readouterr().out
    assert (envdir / "dev.yaml").read_text() == (ENVIRONMENTS_DIR / "dev.yaml").read_text()


# --- interrupted probes ------------------------------------------------------------------------


def test_interrupt_inside_create_cancels_by_tag(world, envdir) -> None:
    # Ctrl-C lands after AWS created the reservation but before its id reached us: the
    # reservation is found again by the probe's unique tag and cancelled.
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}

    def interrupt(rid: str) -> None:
        raise KeyboardInterrupt

    world.after_create = interrupt
    with pytest.raises(KeyboardInterrupt):
        run(world, envdir, "--env", "dev", "--probe")
    assert len(world.reservations) == 1
    assert world.live() == []


@pytest.mark.parametrize(
    ("signum", "expected"),
    [(signal.SIGINT, None), (signal.SIGTERM, capacity.EXIT_TERMINATED)],
)
def test_signal_after_create_cancels(world, envdir, signum, expected) -> None:
    # A real signal arriving while the create call returns: it is held until the id is stored,
    # then unwinds the run through the cancel.
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}
    world.after_create = lambda rid: os.kill(os.getpid(), signum)
    handler_before = signal.getsignal(signal.SIGTERM)

    if expected is None:
        with pytest.raises(KeyboardInterrupt):
            run(world, envdir, "--env", "dev", "--probe")
    else:
        assert run(world, envdir, "--env", "dev", "--probe") == expected
    assert len(world.reservations) == 1  # the run stopped at the first probe
    assert world.live() == []
    assert signal.getsignal(signal.SIGTERM) is handler_before


def test_signals_are_held_until_the_block_ends() -> None:
    reached_end_of_block = False
    with pytest.raises(KeyboardInterrupt), probe._signals_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        reached_end_of_block = True
    assert reached_end_of_block


def test_signals_are_held_while_other_threads_run() -> None:
    """A process-directed signal may be delivered to any thread that does not block it; the hold
    must not depend on which one (this failed with a main-thread-only signal mask)."""
    import threading
    import time

    stop = threading.Event()
    others = [threading.Thread(target=stop.wait) for _ in range(4)]
    for t in others:
        t.start()
    reached_end_of_block = False
    try:
        with pytest.raises(KeyboardInterrupt), probe._signals_deferred():
            for _ in range(5):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)  # let the interpreter run any handler it was going to run
            reached_end_of_block = True
    finally:
        stop.set()
        for t in others:
            t.join()
    assert reached_end_of_block
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_cli_maps_interrupt_to_130(world, envdir, monkeypatch, capsys) -> None:
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}
    world.after_create = lambda rid: os.kill(os.getpid(), signal.SIGINT)
    monkeypatch.setattr(CapacityApi, "connect", classmethod(lambda cls, s, r: world.factory(r)))
    monkeypatch.setattr(command, "_check_account", lambda *a: None)

    code = main(["capacity", "--config-dir", str(envdir), "--env", "dev", "--probe"])
    assert code == 130
    assert world.live() == []


def test_cancel_failure_is_reported_with_the_command(world, envdir, capsys) -> None:
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}
    world.cancel_error = "InternalError"

    assert run(world, envdir, "--env", "dev", "--probe", "--count", "1") == capacity.EXIT_LEAKED

    err = capsys.readouterr().err
    rid = next(iter(world.reservations))
    assert f"aws ec2 cancel-capacity-reservation --region us-west-2 --capacity-reservation-id {rid}" in err


# --- errors ------------------------------------------------------------------------------------


def test_unknown_env(world, envdir, capsys) -> None:
    assert run(world, envdir, "--env", "nope") == capacity.EXIT_USAGE
    err = capsys.readouterr().err
    assert "no such environment file for env='nope'" in err
    assert "Traceback" not in err


def test_invalid_env_file_shows_the_settings_message(world, envdir, capsys) -> None:
    path = envdir / "dev.yaml"
    path.write_text(path.read_text().replace("region: us-west-2", "region: mars"))
    assert run(world, envdir, "--env", "dev") == capacity.EXIT_USAGE
    assert "'mars' is not an AWS region name" in capsys.readouterr().err


def test_unknown_region(world, envdir, capsys) -> None:
    assert run(world, envdir, "--env", "dev", "--regions", "us-west-2,mars-east-1") == 2
    assert "unknown region: mars-east-1" in capsys.readouterr().err


def test_instance_type_not_in_catalogue(world, envdir, capsys) -> None:
    assert run(world, envdir, "--env", "dev", "--instance-type", "p3.2xlarge") == 2
    assert "'p3.2xlarge' is not in the instance catalogue" in capsys.readouterr().err


def test_no_credentials(envdir, monkeypatch, capsys, tmp_path) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    args = build_parser().parse_args(["capacity", "--config-dir", str(envdir), "--env", "dev"])

    assert capacity.run(args) == capacity.EXIT_AWS
    err = capsys.readouterr().err
    assert "no AWS credentials found" in err
    assert "aws configure sso" in err
    assert "Traceback" not in err


def test_rejected_credentials(world, envdir, capsys) -> None:
    world.quota_error = "ExpiredTokenException"
    assert run(world, envdir, "--env", "dev") == capacity.EXIT_AWS
    assert "AWS rejected the credentials (ExpiredTokenException" in capsys.readouterr().err


def test_missing_permission_stops_with_exit_3(world, envdir, capsys) -> None:
    world.quota_error = "AccessDeniedException"
    assert run(world, envdir, "--env", "dev") == capacity.EXIT_AWS
    err = capsys.readouterr().err
    assert "missing permission for GetServiceQuota (AccessDeniedException" in err
    assert "Traceback" not in err


def test_missing_probe_permission_stops_before_other_zones(world, envdir, capsys) -> None:
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}
    world.create_errors = dict.fromkeys(["us-west-2a", "us-west-2b"], "UnauthorizedOperation")
    assert run(world, envdir, "--env", "dev", "--probe") == capacity.EXIT_AWS
    assert len(world.create_calls) == 1
    assert "missing permission for CreateCapacityReservation" in capsys.readouterr().err


def test_account_mismatch_blocks_write(world, monkeypatch) -> None:
    settings = load_settings("dev")
    messages: list[str] = []

    class Err:
        def print(self, text: str, **_: Any) -> None:
            messages.append(text)

    sess = boto3.session.Session()  # moto's account is 123456789012, dev's 111122223333
    with pytest.raises(capacity.AwsError, match="credentials are for account 123456789012"):
        command._check_account(sess, settings, True, Err())  # type: ignore[arg-type]
    command._check_account(sess, settings, False, Err())  # type: ignore[arg-type]
    assert "warning" in messages[0]


def test_region_not_enabled_is_a_row_not_a_crash(world, envdir, capsys, monkeypatch) -> None:
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}
    real = world.factory

    def factory(region: str) -> CapacityApi:
        api = real(region)
        if region == "ap-east-1":

            def opt_in(**_: Any) -> None:
                raise _client_error("OptInRequired", "not subscribed", "DescribeAvailabilityZones")

            monkeypatch.setattr(api, "zones", opt_in)
        return api

    monkeypatch.setattr(world, "factory", factory)
    assert run(world, envdir, "--env", "dev", "--regions", "ap-east-1,us-west-2") == 0
    assert "region unusable: OptInRequired" in capsys.readouterr().out


# --- --write -----------------------------------------------------------------------------------


def _comments(text: str) -> list[str]:
    return [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]


@pytest.mark.parametrize("env", ["dev", "prod", "example"])
def test_round_trip_without_changes_is_byte_identical(env) -> None:
    text = (ENVIRONMENTS_DIR / f"{env}.yaml").read_text()
    settings = parse_settings(text, name=env, source=env)
    same, changes = capacity.updated_text(
        text,
        region=settings.region,
        gpu_zone=settings.gpu_nodes.availability_zone,
        region_zones=[],
        reservation_id=None,
    )
    assert changes == []
    assert same == text


def test_write_moves_region_keeping_comments(world, envdir, capsys) -> None:
    world.applied_quotas["us-east-1"] = {"L-DB2E81BA": 192}
    world.scores = {"us-east-1c": 9}
    path = envdir / "dev.yaml"
    before = path.read_text()

    assert run(world, envdir, "--env", "dev", "--regions", "us-east-1", "--write") == 0

    after = path.read_text()
    assert _comments(after) == _comments(before)
    assert "region: us-east-1\n" in after
    # Flow style kept; same number of zones: the GPU zone plus the first other one.
    assert "  availability_zones: [us-east-1a, us-east-1c]\n" in after
    assert "availability_zone: us-east-1c  # pinned:" in after
    settings = load_settings("dev", envdir)
    assert settings.region == "us-east-1"
    assert settings.gpu_nodes.availability_zone == "us-east-1c"
    assert settings.gpu_nodes.placement_group is True
    # Only the placement lines changed.
    changed = {a for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b}
    assert len(changed) == 3
    assert sorted(p.name for p in envdir.iterdir()) == ["dev.yaml", "example.yaml", "prod.yaml"]
    out = capsys.readouterr().out
    assert "region: us-west-2 -> us-east-1" in out
    assert "subnets are replaced" in out


def test_write_same_region_appends_the_zone(world, envdir) -> None:
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}
    world.create_errors = {
        "us-west-2a": "InsufficientInstanceCapacity",
        "us-west-2b": "InsufficientInstanceCapacity",
    }

    assert run(world, envdir, "--env", "dev", "--probe", "--write") == 0

    settings = load_settings("dev", envdir)
    assert settings.gpu_nodes.availability_zone == "us-west-2c"
    assert settings.vpc.availability_zones == ["us-west-2a", "us-west-2b", "us-west-2c"]
    assert world.live() == []


def test_write_with_capacity_reservation(world, envdir) -> None:
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}
    rid = "cr-0123456789abcdef0"
    world.reservations[rid] = {
        "CapacityReservationId": rid,
        "InstanceType": "g6.12xlarge",
        "AvailabilityZone": "us-west-2a",
        "TotalInstanceCount": 2,
        "AvailableInstanceCount": 2,
        "InstanceMatchCriteria": "targeted",
        "State": "active",
        "Tags": [],
        "Region": "us-west-2",
    }
    path = envdir / "dev.yaml"
    before = path.read_text()

    code = run(world, envdir, "--env", "dev", "--capacity-reservation-id", rid, "--write")

    assert code == 0
    after = path.read_text()
    assert _comments(after) == _comments(before)
    assert (
        "  capacity_type: ON_DEMAND\n  capacity_reservation_id: cr-0123456789abcdef0\n"
        "  placement_group: false\n"
    ) in after
    settings = load_settings("dev", envdir)
    assert settings.gpu_nodes.availability_zone == "us-west-2a"
    assert settings.gpu_nodes.capacity_reservation_id == rid
    assert settings.gpu_nodes.placement_group is False
    assert world.create_calls == []  # the reservation is the capacity: nothing to probe


def test_reservation_for_another_type_does_not_fit(world, envdir, capsys) -> None:
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}
    rid = "cr-0123456789abcdef0"
    world.reservations[rid] = {
        "CapacityReservationId": rid,
        "InstanceType": "g5.12xlarge",
        "AvailabilityZone": "us-west-2a",
        "TotalInstanceCount": 2,
        "State": "active",
        "Tags": [],
        "Region": "us-west-2",
    }
    assert run(world, envdir, "--env", "dev", "--capacity-reservation-id", rid) == 1
    assert f"reservation {rid} is for g5.12xlarge, not g6.12xlarge" in capsys.readouterr().out


def test_unknown_reservation(world, envdir, capsys) -> None:
    code = run(world, envdir, "--env", "dev", "--capacity-reservation-id", "cr-0123456789abcdef0")
    assert code == capacity.EXIT_AWS
    assert "was not found in us-west-2" in capsys.readouterr().err


def test_write_refuses_a_result_that_does_not_validate(world, envdir, capsys) -> None:
    # Six zones and six NAT gateways in us-east-1; us-west-2 has four zones, so moving there
    # would leave more NAT gateways than zones: nothing may be written.
    path = envdir / "dev.yaml"
    text = path.read_text()
    text = text.replace("region: us-west-2", "region: us-east-1")
    text = text.replace(
        "[us-west-2a, us-west-2b]",
        "[us-east-1a, us-east-1b, us-east-1c, us-east-1d, us-east-1e, us-east-1f]",
    )
    text = text.replace("nat_gateways: 1 ", "nat_gateways: 6 ")
    text = text.replace("availability_zone: us-west-2b", "availability_zone: us-east-1b")
    path.write_text(text)
    load_settings("dev", envdir)  # the starting point is valid
    world.applied_quotas["us-west-2"] = {"L-DB2E81BA": 192}

    assert run(world, envdir, "--env", "dev", "--regions", "us-west-2", "--write") == 2

    assert path.read_text() == text
    err = capsys.readouterr().err
    assert "nothing written" in err
    assert "6 NAT gateways but only 4 availability zones" in err


def test_write_with_other_instance_type_is_refused(world, envdir, capsys) -> None:
    code = run(world, envdir, "--env", "dev", "--instance-type", "g6e.12xlarge", "--write")
    assert code == 2
    assert "change gpu_nodes.instance_type in the file first" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("current", "gpu", "region_zones", "expected"),
    [
        (["us-west-2a", "us-west-2b"], "us-west-2b", [], ["us-west-2a", "us-west-2b"]),
        (["us-west-2a", "us-west-2b"], "us-west-2d", [], ["us-west-2a", "us-west-2b", "us-west-2d"]),
        (
            ["us-west-2a", "us-west-2b", "us-west-2c"],
            "eu-west-1b",
            ["eu-west-1a", "eu-west-1b", "eu-west-1c"],
            ["eu-west-1a", "eu-west-1b", "eu-west-1c"],
        ),
        (
            ["us-west-2a", "us-west-2b"],
            "eu-west-1a",
            ["eu-west-1c", "eu-west-1a"],
            ["eu-west-1a", "eu-west-1c"],
        ),
    ],
)
def test_vpc_zones(current, gpu, region_zones, expected) -> None:
    assert capacity.vpc_zones(current, gpu, region_zones) == expected

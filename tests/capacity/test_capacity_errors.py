"""`raytrain capacity`: its errors (environment, region, credentials, permissions) and `--write`,
which pins the result into the environment file keeping its comments; against the pretend account
of tests/capacity_account.py."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from config.loader import environments_dir, load_settings, parse_settings
from raytrain import capacity
from raytrain.aws import CapacityApi
from raytrain.capacity import command
from raytrain.cli import build_parser
from tests.capacity_account import (
    client_error,
    run,
)

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
                raise client_error("OptInRequired", "not subscribed", "DescribeAvailabilityZones")

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
    text = (environments_dir() / f"{env}.yaml").read_text()
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
    files = sorted(p.name for p in envdir.iterdir())

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
    assert sorted(p.name for p in envdir.iterdir()) == files  # nothing written beside it
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

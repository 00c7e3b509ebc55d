"""`raytrain capacity`: quota classes, the plans it prints, and probes that are interrupted; against
the pretend account of tests/capacity_account.py (moto for EC2, a Service Quotas stub)."""

from __future__ import annotations

import os
import signal

import pytest

from config.loader import environments_dir
from raytrain import capacity
from raytrain.aws import CapacityApi
from raytrain.capacity import command, probe
from raytrain.cli import main
from tests.capacity_account import (
    rows,
    run,
)

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
    assert (envdir / "dev.yaml").read_text() == (environments_dir() / "dev.yaml").read_text()


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

"""Definitive answers: a targeted Capacity Reservation for the wanted count, cancelled at once, on
every exit path (signals are held while a create or cancel call is in flight)."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType

import botocore.exceptions as bce

from raytrain.aws import (
    CapacityApi,
    error_code,
    error_message,
    fatal_problem,
)

PROBE_TAG_KEY = "raytrain:capacity-probe"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so the same finally blocks cancel probe reservations."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


@contextlib.contextmanager
def terminate_as_exception() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM back while a reservation id is in flight.

    A signal that lands between the create call returning and the id being stored would otherwise
    unwind past the only reference to a live reservation. While the block runs, both signals are
    only recorded; when it ends (the id stored, or the cancel done), the original handlers are put
    back and each recorded signal is raised again, so Ctrl-C still interrupts, just later.

    A Python-level handler, not pthread_sigmask: Python runs signal handlers in the main thread
    whichever thread the kernel delivers a process-directed signal to, and blocking the signal in
    the main thread alone lets it reach any other thread (botocore's, a test runner's) and come
    back as an immediate KeyboardInterrupt. Handlers can only be set from the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    held = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, hold) for sig in held}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            # None: a handler not installed from Python; the default is the closest we can restore.
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(pending):
            signal.raise_signal(signum)


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    kind: str  # "reserved", "capacity", "quota", "unsupported", "error"
    detail: str


_CAPACITY_CODES = {"InsufficientInstanceCapacity", "InsufficientCapacity"}
_QUOTA_CODES = {"InstanceLimitExceeded", "ReservationCapacityExceeded", "VcpuLimitExceeded"}


def classify_probe_error(exc: bce.ClientError) -> ProbeResult:
    code, message = error_code(exc), error_message(exc)
    if code in _CAPACITY_CODES:
        return ProbeResult(False, "capacity", f"no capacity now ({code})")
    if code in _QUOTA_CODES:
        return ProbeResult(False, "quota", f"quota ({code}): {message}")
    if code == "Unsupported":
        return ProbeResult(False, "unsupported", f"type not supported here ({message})")
    return ProbeResult(False, "error", f"{code}: {message}")


@dataclass
class Prober:
    """Creates and cancels probe reservations; remembers any it could not cancel."""

    leaked: list[tuple[str, str]] = field(default_factory=list)  # (region, reservation id)
    warn: Callable[[str], None] = lambda text: print(text, file=sys.stderr)

    def probe(self, api: CapacityApi, instance_type: str, zone: str, count: int) -> ProbeResult:
        token = uuid.uuid4().hex
        tag = (PROBE_TAG_KEY, token)
        reservation_id: str | None = None
        # True while a reservation may exist whose id we do not hold (interrupted or timed-out
        # create): then the cancel step looks it up by its unique tag.
        unknown = False
        try:
            unknown = True
            with _signals_deferred():
                reservation_id = api.create_probe_reservation(instance_type, zone, count, token, tag)
                unknown = False
            return ProbeResult(True, "reserved", f"reserved {count} and cancelled")
        except bce.ClientError as exc:
            unknown = False  # AWS answered with an error: nothing was created
            if fatal_problem(exc):
                raise
            return classify_probe_error(exc)
        finally:
            if reservation_id is not None or unknown:
                self._release(api, reservation_id, tag)

    def _release(self, api: CapacityApi, reservation_id: str | None, tag: tuple[str, str]) -> None:
        # Deferred again: a second Ctrl-C must not cut the cancel call short.
        with _signals_deferred():
            try:
                ids = [reservation_id] if reservation_id else api.find_reservations(tag)
            except (bce.ClientError, bce.BotoCoreError) as exc:
                self.warn(
                    f"could not look up the probe reservation tagged {tag[0]}={tag[1]} in "
                    f"{api.region}: {exc}; check `aws ec2 describe-capacity-reservations "
                    f"--region {api.region} --filters Name=tag:{tag[0]},Values={tag[1]}`"
                )
                self.leaked.append((api.region, f"tag {tag[0]}={tag[1]}"))
                return
            for rid in ids:
                for attempt in range(3):
                    try:
                        api.cancel_reservation(rid)
                        break
                    except (bce.ClientError, bce.BotoCoreError) as exc:
                        if attempt == 2:
                            self.warn(
                                f"could not cancel probe reservation {rid} in {api.region}: "
                                f"{exc}\n  cancel it now: {cancel_command(api.region, rid)}"
                            )
                            self.leaked.append((api.region, rid))


def cancel_command(region: str, reservation_id: str) -> str:
    return f"aws ec2 cancel-capacity-reservation --region {region} --capacity-reservation-id {reservation_id}"

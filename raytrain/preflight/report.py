"""One result line per check: ok, a warning (works, but costs or risks something), or a problem and
its fix."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

import botocore.exceptions as bce

from raytrain.aws import credential_problem, error_code, error_message, permission_problem


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    PROBLEM = "problem"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status.value:<7} {self.name}: {self.detail}"
        return f"{text}; fix: {self.fix}" if self.fix else text


def ok(name: str, detail: str) -> Check:
    return Check(name, Status.OK, detail)


def warn(name: str, detail: str, fix: str = "") -> Check:
    return Check(name, Status.WARN, detail, fix)


def problem(name: str, detail: str, fix: str) -> Check:
    return Check(name, Status.PROBLEM, detail, fix)


class CredentialsRejected(Exception):
    """No usable credentials: no later check would do better. `str()` is the message."""


def guarded(name: str, check: Callable[[], Iterable[Check]]) -> list[Check]:
    """Run one group of checks; a missing permission or a failed call becomes its problem line,
    rejected credentials stop the run."""
    try:
        return list(check())
    except (bce.ClientError, bce.BotoCoreError) as exc:
        credentials = credential_problem(exc)
        if credentials:
            raise CredentialsRejected(credentials) from None
        if permission_problem(exc):
            operation = getattr(exc, "operation_name", "") or "the call"
            return [
                problem(
                    name,
                    f"could not check: {operation} was denied ({error_message(exc)})",
                    "grant the permissions `raytrain preflight --help` lists (docs/operations.md)",
                )
            ]
        detail = f"{error_code(exc)}: {error_message(exc)}" if isinstance(exc, bce.ClientError) else str(exc)
        return [
            problem(
                name,
                f"could not check: AWS call failed ({detail})",
                "retry; if it persists, fix what AWS says",
            )
        ]

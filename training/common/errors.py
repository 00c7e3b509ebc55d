"""Input errors: a data file, a shard or a checkpoint that cannot be used as it is.

They are not failures for Ray to retry: the same input gives the same error on every attempt.
Wherever one is raised (the driver, a Ray Data task of the preparation, a Ray Train worker), the
run stops at once and the command prints its one-line message and exits with INPUT_ERROR_EXIT.
Ray carries the exception back wrapped in its own (RayTaskError, WorkerGroupError, ControllerError,
UserExceptionWithTraceback); find_input_error digs it out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# 2 is an option refused before anything starts, 3 the transport gate, 1 anything else.
INPUT_ERROR_EXIT = 4


class InputError(Exception):
    """Input that cannot be used. The message is one line: the file (and record, block or
    checkpoint step) and what is wrong or what would be valid."""

    def __str__(self) -> str:
        return " ".join(super().__str__().split())


class DataError(InputError):
    """A corpus file or record that cannot be prepared."""


class CheckpointError(InputError):
    """A checkpoint that cannot be resumed from."""


# Where Ray keeps the exception it wraps (ray.exceptions.RayTaskError.cause, Ray Train V2's
# UserExceptionWithTraceback._base_exc and ControllerError.controller_failure; WorkerGroupError
# holds one per failed rank in worker_failures). Ray 2.58 and 2.60 use the same names.
_WRAPPED = ("cause", "_base_exc", "controller_failure")


def find_input_error(error: BaseException | Iterable[BaseException] | None) -> InputError | None:
    """The InputError inside a (possibly wrapped) exception, or None."""
    todo: list[Any] = list(error) if isinstance(error, Iterable) else [error]
    seen: set[int] = set()
    while todo:
        exc = todo.pop(0)
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        # RayTaskError.as_instanceof_cause() makes a class deriving from both Ray's error and the
        # cause's class, whose str() is a traceback: prefer the plain cause it wraps.
        if isinstance(exc, InputError) and type(exc).__module__.startswith("training."):
            return exc
        todo += [getattr(exc, name, None) for name in _WRAPPED]
        failures = getattr(exc, "worker_failures", None)
        if isinstance(failures, dict):
            todo += [failures[rank] for rank in sorted(failures)]
        if isinstance(exc, BaseException):
            todo += [exc.__cause__, exc.__context__]
    return None

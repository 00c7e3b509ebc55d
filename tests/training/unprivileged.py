"""Running a check as a user whom file permissions apply to, also when the tests run as root."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def as_unprivileged(fn: Callable[[], str], reachable: Path) -> str:
    """fn() as a user whom file permissions apply to, its result (a str) returned. Root reads and
    writes everything: as root, fn runs in a forked child that has become nobody (its modules are
    already imported), after `reachable` and its parents are made traversable for others."""
    if os.geteuid() != 0:
        return fn()
    for p in [reachable, *reachable.parents]:
        if p != Path("/"):
            p.chmod(p.stat().st_mode | 0o055)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgid(65534)
            os.setuid(65534)
            os.write(write, fn().encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        return f.read()

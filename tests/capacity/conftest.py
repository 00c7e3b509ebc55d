"""The fixtures of `raytrain capacity`'s tests: the pretend account (tests/capacity_account.py) and a
copy of the environment files."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.capacity_account import World, copy_environments, fake_account


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    yield from fake_account(monkeypatch)


@pytest.fixture
def envdir(tmp_path: Path) -> Path:
    return copy_environments(tmp_path)


@pytest.fixture(autouse=True)
def python_interrupt_handler() -> Iterator[None]:
    """These tests send the process SIGINT and expect Python's KeyboardInterrupt. A shell that
    starts the test run in the background without job control sets SIGINT to ignored (POSIX sh,
    "Asynchronous Lists"), and Python then installs no handler of its own: put Python's back."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)

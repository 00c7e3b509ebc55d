"""The fixtures of `raytrain capacity`'s tests: the pretend account (tests/capacity_account.py) and a
copy of the environment files."""

from __future__ import annotations

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

"""The fixtures of `raytrain preflight`'s tests: the pretend account and the local registry
(tests/preflight_account.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.preflight_account import Account, Registry, fake_account, serve_registry, set_credentials


@pytest.fixture
def registry() -> Iterator[Registry]:
    yield from serve_registry()


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    set_credentials(monkeypatch)


@pytest.fixture
def account(aws_credentials: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Account]:
    # moto's account is the environments' placeholder account: dev's principals are its own.
    monkeypatch.setenv("MOTO_ACCOUNT_ID", "111122223333")
    yield from fake_account()

"""The fixtures of `raytrain verify`'s tests: the fake API server (tests/verify_cluster.py) and dev's
settings."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from config.loader import load_settings
from config.settings import Settings
from tests.verify_cluster import ENV, FakeApi


@pytest.fixture
def api_server(serve_kube_api: Callable[[FakeApi], FakeApi]) -> FakeApi:
    return serve_kube_api(FakeApi())


@pytest.fixture
def settings() -> Settings:
    return load_settings(ENV)

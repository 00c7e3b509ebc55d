"""The deploy-time warm of a digest-pinned image through the pull-through cache: the handler against
a local registry that behaves as aws/containers-roadmap#2837 describes (an uncached digest is not
found; a pull by tag caches what the tag names upstream), and the resource the Cluster stack
synthesizes for it."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from cdk_constructs.image_cache import FILL_ACTIONS
from cdk_constructs.image_cache_warmer import RESOURCE_TYPE
from cdk_constructs.image_cache_warmer_handler import handler
from tests.conftest import P5_IMAGE_DIGEST
from tests.test_settings import dev_data, error_of

REPO = "dev/ecr-public/deep-learning-containers/ray"
TAG = "train-ml-cuda-v1.1"
PINNED = "sha256:" + "a" * 64
MOVED = "sha256:" + "b" * 64
TOKEN = base64.b64encode(b"AWS:secret").decode()


class CacheRegistry(ThreadingHTTPServer):
    """An ECR registry with one pull-through rule: `upstream` maps tags to digests upstream."""

    def __init__(self, upstream: dict[str, str]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = upstream
        self.cached: set[str] = set()
        self.requests: list[tuple[str, str]] = []
        self.fail_first = 0  # answer 5xx to the first N tag pulls (an import in progress)
        self.reset_first = 0  # drop the connection unanswered on the first N requests
        self.slow_first = 0.0  # answer the first request only after this many seconds
        self.digest_on_get = True  # Docker-Content-Digest on a GET (HEAD always has it)
        self.digest_lag = 0  # a cached digest is still not found for the first N asks

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: CacheRegistry

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, send_body: bool) -> None:
        srv = self.server
        srv.requests.append((self.command, self.path))
        if srv.reset_first:
            srv.reset_first -= 1
            self.close_connection = True  # no status line: the client reads a closed connection
            return
        if srv.slow_first:
            delay, srv.slow_first = srv.slow_first, 0.0
            time.sleep(delay)
        if self.headers.get("Authorization") != f"Basic {TOKEN}":
            self.send_response(401)
            self.end_headers()
            return
        repository, _, reference = self.path.removeprefix("/v2/").rpartition("/manifests/")
        digest = None
        if repository == REPO and reference.startswith("sha256:"):
            # By digest: only what is cached (aws/containers-roadmap#2837).
            digest = reference if reference in srv.cached else None
            if digest and srv.digest_lag:
                srv.digest_lag -= 1
                digest = None
        elif repository == REPO and reference in srv.upstream:
            if srv.fail_first:
                srv.fail_first -= 1
                self.send_response(503)
                self.end_headers()
                return
            digest = srv.upstream[reference]
            srv.cached.add(digest)  # a pull by tag fills the cache
        if digest is None:
            self.send_response(404)
            self.end_headers()
            return
        body = b"{}"
        self.send_response(200)
        if not send_body or srv.digest_on_get:
            self.send_header("Docker-Content-Digest", digest)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)


@pytest.fixture
def registry() -> Iterator[CacheRegistry]:
    server = CacheRegistry({TAG: PINNED})
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _warm(registry: CacheRegistry, digest: str = PINNED, sleeps: list[float] | None = None) -> str:
    return handler.warm(
        registry_url=registry.url,
        repository=REPO,
        tag=TAG,
        digest=digest,
        auth=f"Basic {TOKEN}",
        sleep=(sleeps if sleeps is not None else []).append,
    )


def test_the_registry_fails_a_first_pull_by_digest(registry: CacheRegistry) -> None:
    """What the fix is for: without the warm, a digest pull of an uncached image is not found."""
    answer = handler.registry_get(f"{registry.url}/v2/{REPO}/manifests/{PINNED}", f"Basic {TOKEN}")
    assert answer.status == 404


def test_warm_pulls_by_tag_then_the_digest_is_served(registry: CacheRegistry) -> None:
    assert _warm(registry) == f"{REPO}:{TAG} cached; {PINNED} is served"
    assert registry.requests == [
        ("GET", f"/v2/{REPO}/manifests/{TAG}"),
        ("HEAD", f"/v2/{REPO}/manifests/{PINNED}"),
    ]
    # What a node's kubelet then asks for is found.
    answer = handler.registry_get(f"{registry.url}/v2/{REPO}/manifests/{PINNED}", f"Basic {TOKEN}")
    assert (answer.status, answer.digest) == (200, PINNED)


def test_a_tag_that_moved_on_fails_the_deploy_naming_its_digest(registry: CacheRegistry) -> None:
    registry.upstream[TAG] = MOVED
    with pytest.raises(handler.WarmError) as err:
        _warm(registry)
    message = str(err.value)
    assert f"now names {MOVED} upstream, not the pinned {PINNED}" in message
    assert "aws/containers-roadmap#2837" in message


def test_an_earlier_cached_digest_still_passes(registry: CacheRegistry) -> None:
    registry.cached.add(PINNED)
    registry.upstream[TAG] = MOVED
    assert _warm(registry).endswith(f"{PINNED} is served")


def test_a_tag_pull_in_progress_is_retried(registry: CacheRegistry) -> None:
    registry.fail_first = 2
    sleeps: list[float] = []
    assert _warm(registry, sleeps=sleeps).endswith("is served")
    assert sleeps == [handler.BACKOFF_SECONDS, 2 * handler.BACKOFF_SECONDS]


def test_a_tag_that_never_answers_fails_after_the_retries(registry: CacheRegistry) -> None:
    registry.upstream.clear()
    sleeps: list[float] = []
    with pytest.raises(handler.WarmError, match="answered HTTP 404"):
        _warm(registry, sleeps=sleeps)
    assert len(sleeps) == handler.ATTEMPTS - 1


def test_connection_errors_are_retried_on_both_pulls(registry: CacheRegistry) -> None:
    """A reset connection on the tag pull and on the digest check: retried, the warm passes."""
    registry.reset_first = 1
    sleeps: list[float] = []
    assert _warm(registry, sleeps=sleeps).endswith("is served")
    registry.cached.clear()
    registry.requests.clear()
    # The tag pull goes through; the digest check's first connection is dropped.
    original = handler.registry_get
    calls: list[str] = []

    def flaky(url: str, auth: str, *, method: str = "GET") -> handler.Answer:
        calls.append(method)
        if method == "HEAD" and calls.count("HEAD") == 1:
            registry.reset_first = 1
        return original(url, auth, method=method)

    assert handler.warm(registry_url=registry.url, repository=REPO, tag=TAG, digest=PINNED,
                        auth=f"Basic {TOKEN}", get=flaky,
                        sleep=sleeps.append).endswith("is served")  # fmt: skip
    assert calls == ["GET", "HEAD", "HEAD"]


def test_a_socket_timeout_is_retried(registry: CacheRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handler, "REQUEST_TIMEOUT", 0.3)
    registry.slow_first = 1.5
    sleeps: list[float] = []
    assert _warm(registry, sleeps=sleeps).endswith("is served")
    assert sleeps == [handler.BACKOFF_SECONDS]


def test_connection_errors_to_the_end_fail_with_what_happened(registry: CacheRegistry) -> None:
    registry.reset_first = handler.ATTEMPTS
    with pytest.raises(handler.WarmError, match=r"answered no answer \(RemoteDisconnected"):
        _warm(registry)


def test_the_moved_digest_is_read_from_head_when_get_sends_none(registry: CacheRegistry) -> None:
    """A registry that sends Docker-Content-Digest only on HEAD: the message still names the tag's
    digest (not None)."""
    registry.digest_on_get = False
    registry.upstream[TAG] = MOVED
    with pytest.raises(handler.WarmError, match=f"now names {MOVED} upstream, not the pinned {PINNED}"):
        _warm(registry)


def test_a_digest_being_cached_is_asked_again(registry: CacheRegistry) -> None:
    """The tag names the pinned digest but the digest is not served yet: asked again, not failed."""
    registry.digest_lag = 2
    sleeps: list[float] = []
    assert _warm(registry, sleeps=sleeps).endswith("is served")
    assert sleeps == [handler.BACKOFF_SECONDS]


def test_authorization_is_ecrs_token_as_basic_credentials() -> None:
    ecr = boto3.client("ecr", region_name="us-west-2", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(ecr) as stub:
        stub.add_response(
            "get_authorization_token",
            {"authorizationData": [{"authorizationToken": TOKEN, "proxyEndpoint": "https://r"}]},
        )
        assert handler.authorization(ecr) == f"Basic {TOKEN}"


def test_delete_answers_success_without_pulling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handler.boto3, "client", lambda *a, **k: pytest.fail("no AWS call on delete"))
    sent: list[tuple[str, str]] = []
    event = {"RequestType": "Delete", "PhysicalResourceId": "p", "ResourceProperties": {}}
    handler.on_event(event, None, send=lambda e, status, reason, pid: sent.append((status, pid)))
    assert sent == [("SUCCESS", "p")]


def test_a_failed_warm_is_reported_to_cloudformation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handler, "authorization", lambda ecr: "Basic x")

    def warm(**kwargs: Any) -> str:
        raise handler.WarmError("tag moved")

    monkeypatch.setattr(handler, "warm", warm)
    monkeypatch.setattr(handler.boto3, "client", lambda *a, **k: object())
    sent: list[tuple[str, str]] = []
    props = {"Registry": "r", "Repository": REPO, "Tag": TAG, "Digest": PINNED}
    event = {"RequestType": "Create", "ResourceProperties": props}
    handler.on_event(event, None, send=lambda e, status, reason, pid: sent.append((status, reason)))
    assert sent == [("FAILED", "tag moved")]


# --- what the Cluster stack synthesizes -------------------------------------------------------


def _resources(template: dict, type_name: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_name}


def test_digest_pinned_environment_warms_its_image_after_the_rules(synthesized) -> None:
    t = synthesized["p5"].template("Cluster")
    ((logical_id, warm),) = _resources(t, RESOURCE_TYPE).items()
    props = warm["Properties"]
    assert props["Registry"] == "111122223333.dkr.ecr.us-west-2.amazonaws.com"
    assert props["Repository"] == "p5/ecr-public/deep-learning-containers/ray"
    assert props["Tag"] == "train-ml-cuda-v1.1"
    assert props["Digest"] == P5_IMAGE_DIGEST
    rules = _resources(t, "AWS::ECR::PullThroughCacheRule")
    assert set(rules) <= set(warm["DependsOn"])
    # Its function may fill and read only the cache's repositories.
    statements = [
        st
        for policy in _resources(t, "AWS::IAM::Policy").values()
        if "Warm" in json_dumps(policy["Properties"]["Roles"])
        for st in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    fill = next(st for st in statements if "ecr:BatchImportUpstreamImage" in st["Action"])
    assert set(FILL_ACTIONS) <= set(fill["Action"])
    assert "repository/p5/*" in json_dumps(fill["Resource"])
    assert logical_id


def test_environments_pinned_by_tag_warm_nothing(synthesized) -> None:
    for env in ("dev", "prod"):
        assert not _resources(synthesized[env].template("Cluster"), RESOURCE_TYPE)


def test_a_digest_pinned_cached_image_without_tag_is_refused() -> None:
    data = dev_data()
    data["workload"] = {
        "image": "public.ecr.aws/deep-learning-containers/ray",
        "image_digest": PINNED,
        "ray_version": "2.58.0",
    }
    message = error_of(data)
    assert "workload.image:" in message and "needs its tag too" in message, message


def json_dumps(value: Any) -> str:
    import json

    return json.dumps(value)

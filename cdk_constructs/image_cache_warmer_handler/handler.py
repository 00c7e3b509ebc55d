"""Custom resource handler: fill the pull-through cache with a digest-pinned image before any pod
asks for it, and prove the digest is then served.

An image that is not cached yet and is requested by digest through a pull-through cache rule is
reported not found, even with its tag in the reference (aws/containers-roadmap#2837): only a pull by
tag fills the cache. Kubelet pulls `repo@sha256:…`, so the first job in a fresh account would fail.
On create and update this handler does what a first `docker pull repo:tag` does — asks the
environment's registry for the tag's manifest over the registry API (`GET /v2/<name>/manifests/<tag>`,
OCI Distribution Specification; ECR authenticates it with the token of `ecr:GetAuthorizationToken` as
HTTP Basic credentials, ECR User Guide "Private registry authentication"), which makes ECR create the
repository and import the image from the upstream — then asks for the pinned digest the same way.
The digest answering means every node's pull will; otherwise the tag has moved on upstream and the
pinned image can no longer come through the cache: the deploy fails, naming the tag's digest, which
is read from a HEAD of the tag (the Docker-Content-Digest header; the distribution spec does not
require it on GET, and a GET's body may be another platform's manifest), and from the GET's body
(the digest is the SHA-256 of the manifest's bytes, OCI image spec "Digests") if no header comes.

Both pulls are retried: an HTTP status other than 200 and 404, and an answer that never came (a
reset connection, a socket timeout: urllib raises them as URLError / OSError), for ATTEMPTS tries
with a growing backoff, so a network blip on a first deploy does not fail the Cluster stack. A 404
of the tag is retried too (the import may still run); a 404 of the digest right after the tag named
that very digest as well.

Delete does nothing (the cached repositories outlive the stack: docs/images.md). Runs as a Lambda
function (stdlib + boto3, and cdk_constructs/cfn_response.py bundled beside it); tests drive `warm`
against a local registry and `on_event`.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3

from cdk_constructs import cfn_response

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)

# Every manifest kind a tag may name (an index of platforms or one manifest), so the registry answers
# with what it stores and its digest.
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
# The first pull imports from the upstream, and the function's fresh role may still be propagating:
# retry a failed tag pull for a while before failing the deploy.
ATTEMPTS = 6
BACKOFF_SECONDS = 10
REQUEST_TIMEOUT = 60


class WarmError(Exception):
    """The image cannot come through the cache as pinned. `str()` is the reason for CloudFormation."""


@dataclass(frozen=True)
class Answer:
    """`status` 0: no answer came (`error` says why)."""

    status: int
    digest: str | None
    body_digest: str | None = None
    error: str = ""

    def says(self) -> str:
        return f"HTTP {self.status}" if self.status else f"no answer ({self.error})"


def registry_get(url: str, authorization: str, *, method: str = "GET") -> Answer:
    if not url.startswith(("https://", "http://")):
        raise ValueError(f"not an http(s) URL: {url}")
    request = urllib.request.Request(  # noqa: S310 (scheme checked above)
        url, method=method, headers={"Accept": MANIFEST_TYPES, "Authorization": authorization}
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as resp:  # noqa: S310 (checked)
            body = resp.read()
            body_digest = f"sha256:{hashlib.sha256(body).hexdigest()}" if method == "GET" and body else None
            return Answer(resp.status, resp.headers.get("Docker-Content-Digest"), body_digest)
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, None)
    except (urllib.error.URLError, OSError) as exc:  # reset, refused, timed out: no answer
        reason = getattr(exc, "reason", exc)
        return Answer(0, None, error=f"{type(reason).__name__}: {reason}".rstrip(": "))


def authorization(ecr: Any) -> str:
    """`Basic <token>`: GetAuthorizationToken's token is base64 of `AWS:<password>` already."""
    data = ecr.get_authorization_token()["authorizationData"][0]
    token = data["authorizationToken"]
    base64.b64decode(token, validate=True)  # a malformed answer fails here, not as a 401 later
    return f"Basic {token}"


def warm(
    *,
    registry_url: str,
    repository: str,
    tag: str,
    digest: str,
    auth: str,
    get: Callable[..., Answer] = registry_get,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Pull `repository:tag` through the cache, then check `repository@digest` is served. Returns a
    one-line summary; raises WarmError when the pinned digest cannot be pulled."""
    base = f"{registry_url}/v2/{repository}/manifests"

    def pull(reference: str, method: str, done: Callable[[Answer], bool]) -> Answer:
        answer = Answer(0, None, error="not asked")
        for attempt in range(ATTEMPTS):
            answer = get(f"{base}/{reference}", auth, method=method)
            if done(answer):
                return answer
            LOG.info(
                "%s %s@%s answered %s (attempt %d)", method, repository, reference, answer.says(), attempt + 1
            )
            if attempt + 1 < ATTEMPTS:
                sleep(BACKOFF_SECONDS * (attempt + 1))
        return answer

    tag_answer = pull(tag, "GET", lambda a: a.status == 200)
    if tag_answer.status != 200:
        raise WarmError(
            f"pulling {repository}:{tag} through the cache answered {tag_answer.says()}: check the "
            "pull-through cache rule, the registry policy and repository creation templates "
            "(`raytrain preflight` names what blocks it)"
        )
    by_digest = pull(digest, "HEAD", lambda a: a.status in (200, 404))
    now = None
    if by_digest.status == 404:
        # What the tag names now: HEAD's header, else the GET's own bytes.
        now = (
            pull(tag, "HEAD", lambda a: a.status in (200, 404)).digest
            or tag_answer.digest
            or tag_answer.body_digest
        )
        if now == digest:  # the tag names the pinned digest: being cached, ask again
            by_digest = pull(digest, "HEAD", lambda a: a.status == 200)
    if by_digest.status == 200:
        return f"{repository}:{tag} cached; {digest} is served"
    if by_digest.status != 404:
        raise WarmError(f"checking {repository}@{digest} through the cache answered {by_digest.says()}")
    raise WarmError(
        f"{repository}:{tag} now names {now} upstream, not the pinned {digest}, and a digest "
        "that is not cached cannot be pulled through the cache (aws/containers-roadmap#2837): pin "
        f"{now} after testing it (workload.image_digest or config/image.toml digest)"
    )


def on_event(event: dict[str, Any], context: Any, *, send: cfn_response.Send | None = None) -> None:
    """Lambda entry point (CloudFormation custom resource protocol: always answer the response URL)."""
    props = event.get("ResourceProperties", {})

    def act() -> tuple[str, str]:
        if event["RequestType"] not in ("Create", "Update"):
            return cfn_response.SUCCESS, "nothing to do"
        auth = authorization(boto3.client("ecr"))
        try:
            return cfn_response.SUCCESS, warm(
                registry_url=f"https://{props['Registry']}",
                repository=props["Repository"],
                tag=props["Tag"],
                digest=props["Digest"],
                auth=auth,
            )
        except WarmError as exc:  # expected: its message is the whole reason, no traceback
            return cfn_response.FAILED, str(exc)

    default_id = f"image-cache-warm-{props.get('Repository', 'unknown')}"
    cfn_response.answer(event, default_id, act, what="warming", send=send)

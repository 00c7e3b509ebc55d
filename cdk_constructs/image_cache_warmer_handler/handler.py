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
pinned image can no longer come through the cache: the deploy fails, naming the tag's digest.

Delete does nothing (the cached repositories outlive the stack: docs/images.md). Runs as a Lambda
function (stdlib + boto3, and cdk_constructs/cfn_response.py bundled beside it); tests drive `warm`
against a local registry and `on_event`.
"""

from __future__ import annotations

import base64
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
    status: int
    digest: str | None


def registry_get(url: str, authorization: str, *, method: str = "GET") -> Answer:
    if not url.startswith(("https://", "http://")):
        raise ValueError(f"not an http(s) URL: {url}")
    request = urllib.request.Request(  # noqa: S310 (scheme checked above)
        url, method=method, headers={"Accept": MANIFEST_TYPES, "Authorization": authorization}
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as resp:  # noqa: S310 (checked)
            resp.read()
            return Answer(resp.status, resp.headers.get("Docker-Content-Digest"))
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, None)


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
    tag_answer = Answer(0, None)
    for attempt in range(ATTEMPTS):
        tag_answer = get(f"{base}/{tag}", auth)
        if tag_answer.status == 200:
            break
        LOG.info("pull %s:%s answered %s (attempt %d)", repository, tag, tag_answer.status, attempt + 1)
        if attempt + 1 < ATTEMPTS:
            sleep(BACKOFF_SECONDS * (attempt + 1))
    if tag_answer.status != 200:
        raise WarmError(
            f"pulling {repository}:{tag} through the cache answered HTTP {tag_answer.status}: check the "
            "pull-through cache rule, the registry policy and repository creation templates "
            "(`raytrain preflight` names what blocks it)"
        )
    by_digest = get(f"{base}/{digest}", auth, method="HEAD")
    if by_digest.status == 200:
        return f"{repository}:{tag} cached; {digest} is served"
    raise WarmError(
        f"{repository}:{tag} now names {tag_answer.digest} upstream, not the pinned {digest}, and a digest "
        "that is not cached cannot be pulled through the cache (aws/containers-roadmap#2837): pin "
        f"{tag_answer.digest} after testing it (workload.image_digest or config/image.toml digest)"
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

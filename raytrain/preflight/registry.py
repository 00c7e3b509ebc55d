"""Anonymous reads of public registries: does a tag (or digest) exist, and which digest does a tag
name now. No AWS call: the OCI Distribution Specification's manifest endpoint
(`HEAD /v2/<name>/manifests/<reference>`, 200 with `Docker-Content-Digest`, 404 when unknown;
https://github.com/opencontainers/distribution-spec/blob/main/spec.md#pulling-manifests) behind the
registry token flow (`401` with `WWW-Authenticate: Bearer realm=…,service=…,scope=…`, then an
anonymous token from the realm; https://distribution.github.io/distribution/spec/auth/token/).
ECR Public, quay.io and registry.k8s.io all serve anonymous pulls this way; it is what
`docker buildx imagetools inspect` does.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Every manifest kind a tag may name: an index (multi-platform) or a single manifest. Without an
# index type in Accept, some registries answer a multi-platform tag with a converted manifest and
# another digest.
MANIFEST_TYPES = ", ".join(
    (
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
TIMEOUT_S = 20


class RegistryError(Exception):
    """The registry could not be asked (network, an unexpected answer). `str()` says which."""


@dataclass(frozen=True)
class Manifest:
    exists: bool
    digest: str | None = None


# Opens a request (urlopen's answer, a context manager with .headers and .read()).
Opener = Callable[[urllib.request.Request], Any]


def _open(request: urllib.request.Request) -> Any:
    # Only http(s) URLs are ever built here (base URLs and the registry's token realm are checked).
    return urllib.request.urlopen(request, timeout=TIMEOUT_S)  # noqa: S310


def _http_url(url: str, what: str) -> str:
    if urllib.parse.urlparse(url).scheme not in ("https", "http"):
        raise RegistryError(f"{what} {url!r} is not an http(s) URL")
    return url


class RegistryClient:
    def __init__(self, base_urls: dict[str, str] | None = None, opener: Opener | None = None) -> None:
        # host -> base URL (scheme and host); default https://<host>.
        self.base_urls = base_urls or {}
        self.opener: Opener = opener or _open
        self._tokens: dict[tuple[str, str], str] = {}

    def manifest(self, host: str, repository: str, reference: str) -> Manifest:
        """HEAD the manifest `reference` (a tag or sha256:…) of `host/repository`."""
        base = self.base_urls.get(host, f"https://{host}")
        url = _http_url(f"{base}/v2/{repository}/manifests/{reference}", "registry URL")
        token = self._tokens.get((host, repository))
        for _ in range(2):
            headers = {"Accept": MANIFEST_TYPES}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                with self.opener(urllib.request.Request(url, headers=headers, method="HEAD")) as resp:  # noqa: S310 (_http_url)
                    return Manifest(True, resp.headers.get("Docker-Content-Digest"))
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return Manifest(False)
                if exc.code == 401 and token is None:
                    token = self._token(exc.headers.get("WWW-Authenticate", ""), host, repository)
                    continue
                raise RegistryError(
                    f"{host}/{repository}:{reference}: HTTP {exc.code} {exc.reason}"
                ) from None
            except (urllib.error.URLError, OSError) as exc:
                raise RegistryError(f"{host}: cannot reach the registry ({exc})") from None
        raise RegistryError(f"{host}/{repository}: the registry refused the anonymous token")

    def _token(self, challenge: str, host: str, repository: str) -> str:
        if not challenge.lower().startswith("bearer "):
            raise RegistryError(
                f"{host}: asks for credentials ({challenge or 'no challenge'}); not a public image"
            )
        params = dict(_CHALLENGE_PARAM.findall(challenge))
        realm = params.pop("realm", "")
        if not realm:
            raise RegistryError(f"{host}: token challenge without a realm")
        params.setdefault("scope", f"repository:{repository}:pull")
        url = _http_url(f"{realm}?{urllib.parse.urlencode(params)}", "token realm")
        try:
            with self.opener(urllib.request.Request(url, method="GET")) as resp:  # noqa: S310 (_http_url)
                body = json.loads(resp.read().decode("utf-8"))
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise RegistryError(f"{host}: no anonymous token from {realm} ({exc})") from None
        token = body.get("token") or body.get("access_token")
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{host}: the token endpoint {realm} returned no token")
        self._tokens[(host, repository)] = token
        return token

"""Where the cluster's images come from: each public image through the environment's own ECR
pull-through cache, where ECR supports its registry as an upstream.

A pull-through cache rule maps `<account>.dkr.ecr.<region>.amazonaws.com/<rule prefix>/<path>` to
`<upstream>/<path>`: the first pull of an image makes ECR create the repository and fetch the
image from the upstream; later pulls, on every node, come from the private registry, through the
VPC's ECR endpoints and the S3 gateway endpoint (image layers are S3 objects), not the NAT gateway
(ECR User Guide, "Sync an upstream registry with an Amazon ECR private registry" and "Amazon ECR
interface VPC endpoints"). A tag is re-checked against the upstream at most once every 24 hours; a
digest is what it is.

Upstreams (same guide, CreatePullThroughCacheRule `upstreamRegistry`): ECR Public, the Kubernetes
registry and Quay need no credentials; Docker Hub, GitHub, GitLab, Azure and Chainguard need a
Secrets Manager secret of your own; NVIDIA's nvcr.io (NGC) is not an upstream at all, so the NVIDIA
device plugin keeps coming from nvcr.io through the NAT gateway (once per GPU node start;
docs/images.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Registries this app caches: host -> ECR's name for the upstream, also the last part of the rule's
# prefix. Only those that need no credentials, so the cache works without a secret to manage.
UPSTREAMS: dict[str, str] = {
    "public.ecr.aws": "ecr-public",
    "quay.io": "quay",
    "registry.k8s.io": "k8s",
}
# ecrRepositoryPrefix of CreatePullThroughCacheRule: 2-30 characters of this pattern (ECR API
# reference; botocore's model carries both, tests/test_image_cache.py compares).
ECR_PREFIX_MAX = 30
_SEGMENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
CACHE_PREFIX_RE = re.compile(rf"^{_SEGMENT}(?:/{_SEGMENT})*$")
# The longest setting that leaves room for "/<upstream>" within ECR's limit.
CACHE_PREFIX_MAX = ECR_PREFIX_MAX - 1 - max(len(name) for name in UPSTREAMS.values())


def cache_prefix_problem(prefix: str) -> str | None:
    """Why `prefix` cannot be the cache's repository prefix (None: it can)."""
    if not CACHE_PREFIX_RE.match(prefix):
        return (
            f"{prefix!r} is not an ECR repository prefix: lowercase letters and digits, separated "
            "by '.', '_', '-' or '/' (e.g. ray-train-dev)"
        )
    if len(prefix) > CACHE_PREFIX_MAX:
        return (
            f"{prefix!r} is {len(prefix)} characters; at most {CACHE_PREFIX_MAX}, so that "
            f"'<prefix>/{max(UPSTREAMS.values(), key=len)}' fits ECR's {ECR_PREFIX_MAX}"
        )
    return None


def split_image(image: str) -> tuple[str, str]:
    """(registry host, repository path with tag) of an image reference; Docker Hub's short names
    (`ubuntu:24.04`) have host docker.io."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return "docker.io", image


def split_tag(path: str) -> tuple[str, str | None]:
    """(repository, tag) of a repository path with an optional tag and no digest
    (`eks/aws-efa-k8s-device-plugin:v0.5.20`); a ':' before the last '/' is a port, not a tag."""
    repository, sep, tag = path.rpartition(":")
    if not sep or "/" in tag:
        return path, None
    return repository, tag


@dataclass(frozen=True)
class ImageSource:
    """How the environment's nodes pull a public image: through the cache (prefix set) or not."""

    account: str
    region: str
    # None: pull-through cache off, images come from their upstreams.
    prefix: str | None

    @property
    def registry(self) -> str:
        """The environment's private ECR registry (ECR User Guide, "Private registry concepts")."""
        suffix = "amazonaws.com.cn" if self.region.startswith("cn-") else "amazonaws.com"
        return f"{self.account}.dkr.ecr.{self.region}.{suffix}"

    def rule_prefix(self, upstream: str) -> str:
        assert self.prefix is not None
        return f"{self.prefix}/{upstream}"

    def upstream_of(self, image: str) -> str | None:
        """ECR's name of the upstream that serves `image` through the cache (None: not cached)."""
        if self.prefix is None:
            return None
        return UPSTREAMS.get(split_image(image)[0])

    def cache_repository(self, image: str) -> str | None:
        """The repository the cache creates in this registry for `image` (tag dropped; None: not
        cached): the rule's prefix followed by the upstream path (ECR User Guide, "Pulling an image
        with a pull through cache rule")."""
        upstream = self.upstream_of(image)
        if upstream is None:
            return None
        return f"{self.rule_prefix(upstream)}/{split_tag(split_image(image)[1])[0]}"

    def resolve(self, image: str) -> str:
        """The reference the nodes pull: through the cache where its registry is an upstream."""
        upstream = self.upstream_of(image)
        if upstream is None:
            return image
        return f"{self.registry}/{self.rule_prefix(upstream)}/{split_image(image)[1]}"

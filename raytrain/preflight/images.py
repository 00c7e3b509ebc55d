"""Every image the cluster pulls through the environment's pull-through cache exists at its tag
upstream, and the Ray image's pinned digest can be pulled on the first job.

Why the digest matters: an image that is not cached yet and is requested by digest through a
pull-through cache rule is reported not found, even with its tag in the reference
(aws/containers-roadmap#2837); only a pull by tag fills the cache. The Cluster stack therefore warms
the cache by tag at deploy and checks the digest (cdk_constructs/image_cache.py): that works only
while the tag still names the pinned digest upstream, or the digest is already cached. This check
says which holds before anything is deployed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import botocore.exceptions as bce

from cdk_constructs import cluster_autoscaler
from cdk_constructs.addons import EFA_PUBLIC_REPOSITORY, chart_image_repository, chart_image_tag
from config.names import EFA_DEVICE_PLUGIN_CHART, KUBERAY_CHART
from config.registries import split_image, split_tag
from config.settings import Settings
from raytrain.aws import error_code
from raytrain.preflight.registry import RegistryClient, RegistryError
from raytrain.preflight.report import Check, ok, problem, warn


@dataclass(frozen=True)
class PulledImage:
    label: str
    image: str  # upstream reference with tag: host/repository:tag
    digest: str | None  # pinned digest, if any
    field: str  # the setting (or file) that decides it


def cached_images(settings: Settings) -> list[PulledImage]:
    """The images the nodes pull through the cache (the Cluster stack's list, stacks/cluster_stack.py)."""
    addons = settings.addons
    images = [
        PulledImage(
            "Ray image",
            settings.workload.image,
            settings.workload.effective_image_digest,
            "workload.image / workload.image_digest (config/image.toml)",
        ),
        PulledImage(
            "KubeRay operator image",
            f"{chart_image_repository(KUBERAY_CHART, addons.kuberay_operator)}:"
            f"{chart_image_tag(KUBERAY_CHART, addons.kuberay_operator)}",
            None,
            "addons.kuberay_operator",
        ),
        PulledImage(
            "Cluster Autoscaler image",
            f"{chart_image_repository(cluster_autoscaler.CHART, addons.cluster_autoscaler)}:"
            f"{cluster_autoscaler.IMAGE_TAGS[settings.cluster.kubernetes_version]}",
            None,
            "cdk_constructs/cluster_autoscaler.py IMAGE_TAGS",
        ),
    ]
    if settings.gpu_nodes.efa:
        efa_tag = chart_image_tag(EFA_DEVICE_PLUGIN_CHART, addons.efa_device_plugin)
        images.append(
            PulledImage(
                "EFA device plugin image",
                f"{EFA_PUBLIC_REPOSITORY}:{efa_tag}",
                None,
                "addons.efa_device_plugin (its chart's image.tag)",
            )
        )
    source = settings.image_source
    return [i for i in images if source.upstream_of(i.image) is not None]


def _cached(ecr: Any, repository: str, digest: str) -> bool:
    try:
        resp = ecr.describe_images(repositoryName=repository, imageIds=[{"imageDigest": digest}])
    except bce.ClientError as exc:
        if error_code(exc) in {"RepositoryNotFoundException", "ImageNotFoundException"}:
            return False
        raise
    return bool(resp.get("imageDetails"))


def image_checks(settings: Settings, ecr: Any, registry: RegistryClient) -> Iterator[Check]:
    if settings.image_source.prefix is None:
        yield ok("images", "pull-through cache off (registry.pull_through_cache: false): nothing to check")
        return
    for item in cached_images(settings):
        name = item.label
        host, path = split_image(item.image)
        repository, tag = split_tag(path)
        if tag is None:
            yield problem(name, f"{item.image} names no tag", f"give it a tag ({item.field})")
            continue
        try:
            upstream = registry.manifest(host, repository, tag)
        except RegistryError as exc:
            yield warn(
                name,
                f"could not read {item.image} upstream: {exc}",
                "check it with `docker buildx imagetools inspect`",
            )
            continue
        if not upstream.exists:
            yield problem(
                name, f"{item.image} does not exist upstream", f"pin a tag that exists ({item.field})"
            )
            continue
        if item.digest is None:
            yield ok(name, f"{item.image} exists upstream")
            continue
        if upstream.digest == item.digest:
            yield ok(name, f"{item.image} is {item.digest} upstream: the deploy warms the cache by tag")
            continue
        cache_repo = settings.image_source.cache_repository(item.image)
        assert cache_repo is not None
        if _cached(ecr, cache_repo, item.digest):
            yield ok(
                name, f"{item.digest} is in the cache ({cache_repo}); the tag now names {upstream.digest}"
            )
            continue
        yield problem(
            name,
            f"{item.image} now names {upstream.digest}, not the pinned {item.digest}, which is not "
            f"cached in {cache_repo}: a first pull by digest through the cache is reported not found "
            "(aws/containers-roadmap#2837), and warming by tag would cache another image",
            f"pin the tag's current digest {upstream.digest} after testing it (workload.image_digest or "
            "config/image.toml digest), or a tag that still names the pinned digest",
        )

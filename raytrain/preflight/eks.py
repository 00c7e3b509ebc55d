"""The cluster's Kubernetes version and the EKS add-on versions pinned for it.

- Support: `eks:DescribeClusterVersions` reports each version's status (STANDARD_SUPPORT,
  EXTENDED_SUPPORT, UNSUPPORTED) and its end-of-support dates (EKS API reference,
  ClusterVersionInformation). A minor version has 14 months of standard support, then 12 of
  extended support "at an additional cost per cluster hour", and extended support is on by default
  (EKS User Guide, "Understand the Kubernetes version lifecycle on EKS",
  https://docs.aws.amazon.com/eks/latest/userguide/kubernetes-versions.html, whose release calendar
  dates 1.34's end of standard support 2026-12-02). The prices are config/prices.py's
  ($0.10 per cluster-hour in standard support, $0.60 in extended support, aws.amazon.com/eks/pricing).
- Add-ons: `eks:DescribeAddonVersions` with the add-on's name and the Kubernetes version lists the
  versions EKS will install on such a cluster; a pinned version missing there fails the Cluster
  stack's create (AWS::EKS::Addon AddonVersion).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from config.prices import HOURS_PER_MONTH, PriceError, RegionPrices, prices_for
from config.settings import Settings
from raytrain.preflight.report import Check, ok, problem, warn

# How early to warn that standard support ends (one upgrade cycle of a cautious team).
SUPPORT_WARNING_DAYS = 90


def _date(value: Any) -> dt.date | None:
    if isinstance(value, dt.datetime):
        return value.date()
    return value if isinstance(value, dt.date) else None


def extended_support_cost(region: str) -> str:
    """What extended support adds, in words (config/prices.py; its US rates where the table lacks
    the region)."""
    try:
        prices = prices_for(region)
    except PriceError:
        prices = RegionPrices(region=region, ec2_per_hour={})
    standard, extended = prices.eks_cluster_per_hour, prices.eks_extended_support_per_hour
    extra = (extended - standard) * HOURS_PER_MONTH
    return (
        f"extended support costs ${extended:.2f} per cluster-hour instead of ${standard:.2f} "
        f"(+${extra:,.0f} a month per cluster)"
    )


def version_support(settings: Settings, eks: Any, today: dt.date) -> Iterator[Check]:
    name = "kubernetes version"
    version = settings.cluster.kubernetes_version
    resp = eks.describe_cluster_versions(clusterVersions=[version], includeAll=True)
    found = [v for v in resp.get("clusterVersions", []) if v.get("clusterVersion") == version]
    fix_upgrade = (
        "set cluster.kubernetes_version to a version in standard support (aws eks "
        "describe-cluster-versions --version-status STANDARD_SUPPORT lists them) and review the "
        "upgrade with `make review`"
    )
    if not found:
        yield problem(name, f"EKS does not offer Kubernetes {version} in {settings.region}", fix_upgrade)
        return
    info = found[0]
    status = str(info.get("versionStatus") or info.get("status", "")).upper().replace("-", "_")
    standard_end = _date(info.get("endOfStandardSupportDate"))
    extended_end = _date(info.get("endOfExtendedSupportDate"))
    if status == "UNSUPPORTED":
        yield problem(name, f"Kubernetes {version} is no longer supported by EKS", fix_upgrade)
    elif status == "EXTENDED_SUPPORT":
        ended = f"standard support ended {standard_end}" if standard_end else "standard support has ended"
        until = f", extended support until {extended_end}" if extended_end else ""
        yield warn(
            name,
            f"Kubernetes {version}: {ended}{until}; {extended_support_cost(settings.region)}",
            fix_upgrade,
        )
    elif standard_end and (standard_end - today).days <= SUPPORT_WARNING_DAYS:
        yield warn(
            name,
            f"Kubernetes {version}: standard support ends {standard_end} "
            f"({(standard_end - today).days} days); after that {extended_support_cost(settings.region)}",
            fix_upgrade,
        )
    else:
        until = f" until {standard_end}" if standard_end else ""
        yield ok(name, f"Kubernetes {version} is in standard support{until}")


def pinned_addons(settings: Settings) -> dict[str, tuple[str, str]]:
    """EKS add-on name -> (pinned version, the settings field), for the add-ons this environment
    installs with a pinned version (cdk_constructs/observability.py)."""
    pinned: dict[str, tuple[str, str]] = {}
    if settings.observability.node_monitoring:
        pinned["eks-node-monitoring-agent"] = (
            settings.addons.node_monitoring_agent,
            "addons.node_monitoring_agent",
        )
    if settings.observability.metrics:
        pinned["amazon-cloudwatch-observability"] = (
            settings.addons.cloudwatch_observability,
            "addons.cloudwatch_observability",
        )
    return pinned


def addon_versions(settings: Settings, eks: Any) -> Iterator[Check]:
    version = settings.cluster.kubernetes_version
    for addon, (pinned, field) in pinned_addons(settings).items():
        offered: list[str] = []
        params: dict[str, Any] = {"addonName": addon, "kubernetesVersion": version}
        while True:
            resp = eks.describe_addon_versions(**params)
            for info in resp.get("addons", []):
                if info.get("addonName") == addon:
                    offered += [v["addonVersion"] for v in info.get("addonVersions", [])]
            if not resp.get("nextToken"):
                break
            params["nextToken"] = resp["nextToken"]
        name = f"add-on {addon}"
        if pinned in offered:
            yield ok(name, f"{pinned} is offered for Kubernetes {version}")
        else:
            newest = ", ".join(offered[:3]) or "none"
            yield problem(
                name,
                f"{pinned} is not offered for Kubernetes {version} in {settings.region} (offered: {newest})",
                f"set {field} to an offered version (its chart must then be checked: "
                "tests/test_observability.py renders the pinned one)",
            )

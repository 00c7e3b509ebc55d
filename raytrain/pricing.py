"""Prices from AWS itself, for `raytrain cost --live` (and regions the pinned table lacks).

- Instance rates: the AWS Price List Query API, `pricing:GetProducts` on service code AmazonEC2
  with the filters config/prices.py's own source line uses (instance type, region code, Linux,
  shared tenancy, no pre-installed software, capacity status Used), one product per type; its
  On-Demand term's price dimension carries `pricePerUnit.USD` per hour (AWS Price List API
  reference, GetProducts; "Using the AWS Price List Query API"). The API is served from us-east-1
  (also ap-south-1 and eu-central-1), whatever region is priced.
- Spot: `ec2:DescribeSpotPriceHistory` for the type in the GPU zone, Linux/UNIX, the newest entry.

Only the instance rates come from the API; the other, small rates (EKS, NAT gateway, endpoints, EBS,
ECR) stay config/prices.py's, which the estimate says in a note when the region is not in the table.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from config.prices import PRICES, PRICES_AS_OF, PriceError, RegionPrices

PRICING_REGION = "us-east-1"


def _product_filters(instance_type: str, region: str) -> list[dict[str, str]]:
    fields = {
        "instanceType": instance_type,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]


def on_demand_rate(pricing: Any, instance_type: str, region: str) -> float:
    """$/h of one Linux On-Demand instance of `instance_type` in `region` (Price List API)."""
    rates: set[float] = set()
    params: dict[str, Any] = {
        "ServiceCode": "AmazonEC2",
        "Filters": _product_filters(instance_type, region),
        "FormatVersion": "aws_v1",
    }
    while True:
        resp = pricing.get_products(**params)
        for item in resp.get("PriceList", []):
            product = json.loads(item) if isinstance(item, str) else item
            for term in product.get("terms", {}).get("OnDemand", {}).values():
                for dimension in term.get("priceDimensions", {}).values():
                    if dimension.get("unit") == "Hrs":
                        rates.add(float(dimension["pricePerUnit"]["USD"]))
        if not resp.get("NextToken"):
            break
        params["NextToken"] = resp["NextToken"]
    rates.discard(0.0)
    if len(rates) != 1:
        found = "no price" if not rates else f"several prices ({', '.join(map(str, sorted(rates)))})"
        raise PriceError(f"the Price List API has {found} for Linux On-Demand {instance_type} in {region}")
    return rates.pop()


def live_prices(pricing: Any, region: str, instance_types: Iterable[str], today: dt.date) -> RegionPrices:
    """The region's prices with instance rates from the Price List API; the rest as pinned."""
    base = PRICES.get(region) or RegionPrices(region=region, ec2_per_hour={})
    rates = {t: on_demand_rate(pricing, t, region) for t in sorted(set(instance_types))}
    notes: tuple[str, ...] = ()
    if region not in PRICES:
        notes = (
            f"instance rates from the AWS Price List API ({today}); EKS, NAT gateway, endpoint, EBS and "
            f"ECR rates are config/prices.py's US rates of {PRICES_AS_OF}, which {region} may not share",
        )
    return replace(
        base, ec2_per_hour={**base.ec2_per_hour, **rates}, as_of=f"{today} (Price List API)", notes=notes
    )


def spot_rate(ec2: Any, instance_type: str, zone: str, now: dt.datetime) -> float | None:
    """The newest Linux/UNIX Spot price of `instance_type` in `zone` (None: none reported)."""
    resp = ec2.describe_spot_price_history(
        InstanceTypes=[instance_type],
        ProductDescriptions=["Linux/UNIX"],
        AvailabilityZone=zone,
        StartTime=now,
        MaxResults=10,
    )
    history = sorted(resp.get("SpotPriceHistory", []), key=lambda h: h["Timestamp"], reverse=True)
    return float(history[0]["SpotPrice"]) if history else None

"""Pinned, dated On-Demand prices (USD) for what an environment runs: no network needed.

EC2 instance-hours, Linux, shared tenancy, On-Demand, for every type of the catalogue
(config/catalogue.py; a test checks that each one has a price in each region here).

Sources and dates:
- us-east-1 EC2 rates: `InitialOnDemandPricesAWS["us-east-1"]` in aws/karpenter-provider-aws
  pkg/providers/pricing/zz_generated.pricing_aws.go at commit 6fc13b5236fd (2026-07-20), a file
  Karpenter generates from the AWS Price List API ("generated at 2026-07-20T13:44:30Z").
- p5en.48xlarge, p6-b200.48xlarge and g6e.24xlarge (added later): the same generated file at commit
  031e72b6099630e960dacb88b48a7e9bb780945f ("generated at 2026-01-19T13:23:24Z for us-east-1"),
  whose other rates here agree with the 2026-07-20 file's; p5en's $63.296 in us-east-1, us-east-2
  and us-west-2 also in dstack's offer listing (dstackai/dstack#4110, 2026-08). p5e.48xlarge has no
  rate there (UNPRICED).
- us-east-2 and us-west-2 EC2 rates: US East (Ohio) and US West (Oregon) are priced like
  US East (N. Virginia) for these types on aws.amazon.com/ec2/pricing/on-demand; the generated
  file above covers us-east-1 only, so these reuse its numbers. That could not be re-checked
  offline: check a region before relying on it, with
  `aws pricing get-products --region us-east-1 --service-code AmazonEC2 --filters
  Type=TERM_MATCH,Field=instanceType,Value=g6.12xlarge Type=TERM_MATCH,Field=regionCode,Value=us-west-2
  Type=TERM_MATCH,Field=operatingSystem,Value=Linux Type=TERM_MATCH,Field=tenancy,Value=Shared
  Type=TERM_MATCH,Field=preInstalledSw,Value=NA Type=TERM_MATCH,Field=capacitystatus,Value=Used`.
- EKS: $0.10 per cluster-hour in standard support, $0.60 in extended support in total
  (aws.amazon.com/eks/pricing; "charged a total of $0.60 per cluster per hour … standard support is
  unchanged — you will continue to pay $0.10", AWS Containers blog, "Amazon EKS extended support for
  Kubernetes versions pricing").
- NAT gateway: $0.045 per gateway-hour in these regions (aws.amazon.com/vpc/pricing).
- Interface VPC endpoints: $0.01 per endpoint per Availability Zone-hour, billed whether or not
  traffic flows (aws.amazon.com/privatelink/pricing).
- EBS gp3: $0.08 per GB-month of storage; 3,000 IOPS and 125 MiB/s are included, throughput
  above that is $0.04 per MiB/s-month (aws.amazon.com/ebs/pricing). A month is 730 hours, as AWS
  prices monthly resources.

- Image pulls (`raytrain cost`, "job start"): NAT gateway data processing $0.045 per GB
  (aws.amazon.com/vpc/pricing); interface endpoint data processing $0.01 per GB for the first PB
  (aws.amazon.com/privatelink/pricing); gateway endpoints (S3) carry no data charge (same VPC
  pricing page); ECR private storage $0.10 per GB-month (aws.amazon.com/ecr/pricing). Anonymous pulls from ECR
  Public are limited to 500 GB a month, a quota that cannot be raised (Amazon ECR Public service
  quotas, as issue 25 cites them; not re-checked offline).

Not included otherwise: data transfer, S3 storage and requests, CloudWatch logs, KMS keys ($1 per
key-month), Lambda invocations of CDK's providers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRICES_AS_OF = "2026-07-20"
HOURS_PER_MONTH = 730

_EC2_ON_DEMAND_US = {
    "m7i.large": 0.1008,
    "m7i.xlarge": 0.2016,
    "m7i.2xlarge": 0.4032,
    "m7i.4xlarge": 0.8064,
    "g6.xlarge": 0.8048,
    "g5.12xlarge": 5.672,
    "g6.12xlarge": 4.6016,
    "g6.48xlarge": 13.3504,
    "g6e.12xlarge": 10.49264,
    "g6e.48xlarge": 30.13118,
    "g5.48xlarge": 16.288,
    "p4d.24xlarge": 21.957642,
    "p5.48xlarge": 55.04,
    "p5en.48xlarge": 63.296,
    "p6-b200.48xlarge": 113.9328,
    "g6e.24xlarge": 15.06559,
}

# Catalogue types without a pinned On-Demand rate, and why: `raytrain cost --live` (and `plan
# --live`) ask the AWS Price List API for the region's; a Capacity Block is paid upfront anyway.
UNPRICED: dict[str, str] = {
    "p5e.48xlarge": "the pinned source (Karpenter's us-east-1 table) has no p5e.48xlarge rate: it is "
    "offered in few regions, and mostly through Capacity Blocks for ML",
}


@dataclass(frozen=True)
class RegionPrices:
    region: str
    ec2_per_hour: dict[str, float] = field(repr=False)
    eks_cluster_per_hour: float = 0.10
    eks_extended_support_per_hour: float = 0.60
    nat_gateway_per_hour: float = 0.045
    interface_endpoint_per_az_hour: float = 0.01
    gp3_per_gib_month: float = 0.08
    gp3_included_mibps: int = 125
    gp3_per_mibps_month: float = 0.04
    nat_gateway_per_gb: float = 0.045
    interface_endpoint_per_gb: float = 0.01
    ecr_storage_per_gb_month: float = 0.10
    ecr_public_anonymous_gb_per_month: float = 500.0
    # Set when these prices are not the pinned table's (raytrain/pricing.py): their date, and what
    # in them is not the region's own.
    as_of: str | None = None
    notes: tuple[str, ...] = ()


PRICES: dict[str, RegionPrices] = {
    region: RegionPrices(region=region, ec2_per_hour=dict(_EC2_ON_DEMAND_US))
    for region in ("us-east-1", "us-east-2", "us-west-2")
}


class PriceError(LookupError):
    """No pinned price for a region or instance type: says what the table covers."""


def prices_for(region: str) -> RegionPrices:
    try:
        return PRICES[region]
    except KeyError:
        raise PriceError(
            f"no pinned prices for region {region!r} (config/prices.py covers "
            f"{', '.join(sorted(PRICES))}, as of {PRICES_AS_OF}); with AWS credentials, "
            "`raytrain cost --live` reads the region's instance prices from the AWS Price List API"
        ) from None


def instance_per_hour(prices: RegionPrices, instance_type: str) -> float:
    try:
        return prices.ec2_per_hour[instance_type]
    except KeyError:
        why = f": {UNPRICED[instance_type]}" if instance_type in UNPRICED else ""
        raise PriceError(
            f"no pinned On-Demand price for {instance_type} in {prices.region} (config/prices.py){why}; "
            "with AWS credentials, --live reads it from the AWS Price List API"
        ) from None

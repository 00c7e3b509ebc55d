"""Which regional On-Demand vCPU quota (Service Quotas code) an instance type counts against."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class QuotaClass:
    code: str
    name: str


# Running On-Demand vCPU quotas (Service Quotas, service code "ec2"), as listed in the EC2 docs,
# "Amazon EC2 service quotas" > "On-Demand Instance quotas"
# (https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html) and in the
# Service Quotas console under Amazon EC2.
G_VT = QuotaClass("L-DB2E81BA", "Running On-Demand G and VT instances")
P = QuotaClass("L-417A185B", "Running On-Demand P instances")
STANDARD = QuotaClass("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances")

# Keyed by the letters before the generation digit. Longer prefixes such as dl, inf, trn, hpc and
# mac (own quotas) must not fall into d, i, t, h or m; im/is (im4gn, is4gen) are I types.
_FAMILY_QUOTA: dict[str, QuotaClass] = {
    "g": G_VT,
    "gr": G_VT,
    "vt": G_VT,
    "p": P,
    **{letters: STANDARD for letters in ("a", "c", "d", "h", "i", "im", "is", "m", "r", "t", "z")},
}
_FAMILY_LETTERS = re.compile(r"^[a-z]+")


def quota_class(instance_type: str) -> QuotaClass | None:
    """The On-Demand vCPU quota an instance type draws on; None for classes not handled here."""
    match = _FAMILY_LETTERS.match(instance_type)
    return _FAMILY_QUOTA.get(match.group(0)) if match else None

"""Documentation placeholders still in an environment's settings: values that synthesize but must be
replaced before a deploy (the shipped environment files use them so that `make synth` runs anywhere).

- Accounts: 111122223333, 444455556666, 123456789012 and friends are the example account ids of the
  AWS documentation (IAM User Guide examples); no one deploys to them.
- CIDRs: 192.0.2.0/24, 198.51.100.0/24 and 203.0.113.0/24 are TEST-NET-1/2/3, reserved for
  documentation (RFC 5737); 2001:db8::/32 likewise for IPv6 (RFC 3849). Nobody's operators sit there.
- The all-zero connection UUID in an ARN (the example files' CodeConnections ARN).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from typing import Any

from config.settings import Settings

DOC_ACCOUNTS = frozenset({"111122223333", "444455556666", "777788889999", "123456789012", "210987654321"})
DOC_NETWORKS = tuple(
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)
_ZERO_UUID = "00000000-0000-4000-8000-000000000000"
_ACCOUNT_IN = re.compile(r"(?<!\d)(\d{12})(?!\d)")


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]")


def _documentation_network(text: str) -> bool:
    try:
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return any(network.version == doc.version and network.subnet_of(doc) for doc in DOC_NETWORKS)  # type: ignore[arg-type]


def placeholders(settings: Settings) -> list[str]:
    """`field: value (why)` for every documentation placeholder in the settings, in field order."""
    found = []
    for path, text in _strings(settings.model_dump(mode="json", exclude={"name"}), ""):
        if any(account in DOC_ACCOUNTS for account in _ACCOUNT_IN.findall(text)):
            found.append(f"{path}: {text} (an AWS documentation example account)")
        elif _documentation_network(text):
            found.append(f"{path}: {text} (a documentation-only address range, RFC 5737/3849)")
        elif _ZERO_UUID in text:
            found.append(f"{path}: {text} (an example ARN)")
    return found

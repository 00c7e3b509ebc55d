"""`raytrain capacity`: where can the GPU node group launch, and pin the answer into settings.

For each candidate region and zone: is the instance type offered there, does the regional
On-Demand vCPU quota minus current usage leave room for the node group, what is the Spot
placement score (a signal only), and with --probe a definitive answer from a targeted Capacity
Reservation for the wanted count that is cancelled at once. The answer becomes a reviewed setting
(--write) rather than something synthesis computes: a computed AZ would replace the node group on
the next deploy.

One module per part: `quotas` (which vCPU quota a type counts against), `probe` (create-and-cancel
reservations), `plan` (the per-zone evaluation and ranking), `output` (the table),
`settings_file` (`--write`), `command` (arguments, exit codes, the run).
"""

from raytrain.aws import AwsError
from raytrain.capacity.command import (
    EXIT_AWS,
    EXIT_CODES_HELP,
    EXIT_FITS,
    EXIT_INTERRUPTED,
    EXIT_LEAKED,
    EXIT_NO_FIT,
    EXIT_TERMINATED,
    EXIT_USAGE,
    ApiFactory,
    register,
    run,
)
from raytrain.capacity.output import (
    render,
)
from raytrain.capacity.plan import (
    Need,
    Plan,
    RegionQuota,
    ZoneResult,
    evaluate,
)
from raytrain.capacity.probe import (
    PROBE_TAG_KEY,
    Prober,
    ProbeResult,
    Terminated,
    cancel_command,
    classify_probe_error,
    terminate_as_exception,
)
from raytrain.capacity.quotas import (
    G_VT,
    STANDARD,
    P,
    QuotaClass,
    quota_class,
)
from raytrain.capacity.settings_file import (
    updated_text,
    vpc_zones,
    write_atomically,
)

__all__ = [
    "EXIT_AWS",
    "EXIT_CODES_HELP",
    "EXIT_FITS",
    "EXIT_INTERRUPTED",
    "EXIT_LEAKED",
    "EXIT_NO_FIT",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "G_VT",
    "PROBE_TAG_KEY",
    "STANDARD",
    "ApiFactory",
    "AwsError",
    "Need",
    "P",
    "Plan",
    "ProbeResult",
    "Prober",
    "QuotaClass",
    "RegionQuota",
    "Terminated",
    "ZoneResult",
    "cancel_command",
    "classify_probe_error",
    "evaluate",
    "quota_class",
    "register",
    "render",
    "run",
    "terminate_as_exception",
    "updated_text",
    "vpc_zones",
    "write_atomically",
]

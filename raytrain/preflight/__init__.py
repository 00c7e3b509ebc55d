"""`raytrain preflight --env NAME`: what only the account can answer, checked before the first deploy.

Read-only AWS calls (and anonymous reads of the public registries) that answer: does the pinned
Kubernetes version still have standard support, does every pinned EKS add-on version exist for it,
does every image the cluster pulls through the cache exist at its tag upstream (and the Ray image at
its digest), is the GPU type offered in the pinned zone and does the vCPU quota cover
`gpu_nodes.max_size`, is the account bootstrapped, do the access entries' IAM principals exist, do
the account's ECR pull-through cache rules, repository creation templates or registry policy block
the cache, and do the VPC and Elastic IP quotas leave room for the Network stack. One line per check.

One module per group of checks: `report` (the result lines), `eks`, `images` (with `registry`, the
OCI distribution client), `capacity`, `account` (bootstrap and ECR), `principals` (access entries),
`network` (VPC and Elastic IP quotas), `permissions` (the IAM actions it needs, recorded from every
call it makes), `command` (arguments, exit codes, the run).
"""

from raytrain.preflight.command import (
    EXIT_AWS,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    register,
    run,
)
from raytrain.preflight.permissions import IAM_ACTIONS
from raytrain.preflight.report import Check, Status

__all__ = [
    "EXIT_AWS",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "IAM_ACTIONS",
    "Check",
    "Status",
    "register",
    "run",
]

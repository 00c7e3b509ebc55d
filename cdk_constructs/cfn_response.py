"""The answer to CloudFormation that every Lambda handler of our custom resources sends
(vpc_cleanup_handler, job_drain_handler, image_cache_warmer_handler).

Standard library only: it runs inside each handler's Lambda asset, where it lies at
`cdk_constructs/cfn_response.py` beside `handler.py` (cdk_constructs/handler_function.py bundles it
in), so `from cdk_constructs import cfn_response` imports this same file in Lambda and in tests.

The protocol (CloudFormation User Guide, "Custom resource response objects",
https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/crpg-ref-responses.html): a JSON body
with Status (SUCCESS or FAILED), Reason, PhysicalResourceId, and StackId, RequestId and
LogicalResourceId copied from the request, PUT to the request's presigned S3 `ResponseURL`; the body
may not exceed 4096 bytes. The Content-Type is sent empty, as AWS's own cfn-response module does
(https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/cfn-lambda-function-code-cfnresponsemodule.html):
the URL is presigned without one. A handler that never answers holds the stack until the resource's
service timeout, so `answer` answers whatever happens.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from collections.abc import Callable
from typing import Any

LOG = logging.getLogger(__name__)

SUCCESS = "SUCCESS"
FAILED = "FAILED"
# Leaves room in the 4096-byte body for the IDs (a stack ARN, a 1 KB physical ID at most).
REASON_LIMIT = 1000
# The PUT's own time limit: a handler keeps this much (and some) of its run time for the answer.
RESPONSE_TIMEOUT_SECONDS = 30

Send = Callable[[dict[str, Any], str, str, str], None]


def send_response(event: dict[str, Any], status: str, reason: str, physical_id: str) -> None:
    """PUT the response for `event` to its ResponseURL (https only: it is an S3 presigned URL)."""
    body = json.dumps(
        {
            "Status": status,
            "Reason": reason,
            "PhysicalResourceId": physical_id,
            "StackId": event["StackId"],
            "RequestId": event["RequestId"],
            "LogicalResourceId": event["LogicalResourceId"],
        }
    ).encode()
    url = event["ResponseURL"]
    if not url.startswith("https://"):
        raise ValueError("the response URL must be https")
    request = urllib.request.Request(  # noqa: S310 (https checked above)
        url, data=body, method="PUT", headers={"Content-Type": ""}
    )
    with urllib.request.urlopen(request, timeout=RESPONSE_TIMEOUT_SECONDS) as response:  # noqa: S310 (https checked)
        LOG.info("CloudFormation response: %s", response.status)


def answer(
    event: dict[str, Any],
    default_physical_id: str,
    act: Callable[[], tuple[str, str]],
    *,
    what: str,
    send: Send | None = None,
) -> None:
    """Run `act` (which returns status and reason) and answer CloudFormation in every case: an
    exception becomes FAILED with its type and message. The physical ID is the request's, or
    `default_physical_id` on create. `what` names the work in the log (e.g. "cleanup")."""
    physical_id = event.get("PhysicalResourceId") or default_physical_id
    try:
        status, reason = act()
    except Exception as exc:
        LOG.exception("%s failed", what)
        status, reason = FAILED, f"{type(exc).__name__}: {exc}"
    LOG.info("%s: %s", status, reason)
    (send or send_response)(event, status, reason[:REASON_LIMIT], physical_id)

"""Custom resource handler: when the Workload stack itself is deleted, delete the RayJobs
`raytrain job submit` created, with foreground propagation, and wait until they are gone, before
CloudFormation deletes the stack's manifests (the jobs anchor, the Roles, the network policies) and
then the Cluster stack (the KubeRay operator that clears their finalizers).

Only then: CloudFormation sends Delete "when the template developer deletes the stack or removes the
custom resource from the stack" (User Guide, crpg-ref-requesttypes-delete.html), and also for the
old resource after a replacement and for a resource an update created when that update rolls back
(User Guide, using-cfn-updating-stacks-monitor-stack.html: a replaced resource is created anew, then
the old one deleted). The request's fields (RequestType, PhysicalResourceId, ResourceProperties) are
the same in every case; the stack's status tells them apart (User Guide, "Stack status codes",
https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/using-cfn-describing-stacks.html):
DELETE_IN_PROGRESS "ongoing removal of one or more stacks", ROLLBACK_IN_PROGRESS "ongoing removal ...
after a failed stack creation", while a replaced or removed resource is deleted in
UPDATE_COMPLETE_CLEANUP_IN_PROGRESS and an update's rollback runs in UPDATE_ROLLBACK_IN_PROGRESS /
UPDATE_ROLLBACK_COMPLETE_CLEANUP_IN_PROGRESS. So the handler reads its own stack's status
(cloudformation:DescribeStacks on the request's StackId, an ARN, which names the stack even once
deleted) and drains only in the first two; otherwise the submitted jobs keep running.

Why the jobs anchor's own deletion does not do it: the kubectl handler of aws-cdk's eks-v2
(custom-resource-handlers/aws-eks-v2/kubectl-handler/apply, Delete: `kubectl delete -f`) runs
kubectl with its defaults, and kubectl's `--cascade` defaults to `background`, which it sends as an
explicit `propagationPolicy: Background` (staging/src/k8s.io/kubectl/pkg/cmd/delete). An explicit
policy overrides a `foregroundDeletion` finalizer already on the object (apiserver
registry/generic/registry/store.go, shouldDeleteDependents: options first, then finalizers), so
the anchor goes at once, the garbage collector deletes the jobs in the background and
CloudFormation moves on while they still hold KubeRay's finalizer (tests/test_job_drain.py runs
that kubectl and records it).

Here: `kubectl delete rayjobs -l ray-train/origin=submitted --cascade=foreground --wait=false`,
then `kubectl get` until none is left. Foreground: each RayJob stays (deletionTimestamp set) until
its RayCluster and submitter Job are gone (Kubernetes docs, Garbage Collection, foreground
cascading deletion), and KubeRay's `ray.io/rayjob-finalizer` stops the Ray job first. Not gone
within the function's time: FAILED, so the resource stays and the next destroy retries.
An error a retry may cure (the API server or the network for a moment) is retried until the
deadline; RBAC's or IAM's refusal fails at once with its words; no RayJob resource type (the
KubeRay CRD gone) leaves nothing to drain. Every call is cut at the deadline, which keeps the
answer's own time, so CloudFormation always gets an answer.

Create and update do nothing. Runs with the kubectl layer (kubectl) and the AWS CLI layer
(`aws eks update-kubeconfig`, as CDK's kubectl handler logs in); cdk_constructs/cfn_response.py is
bundled beside it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

from cdk_constructs import cfn_response

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)

# The layers' binaries (the kubectl layer unpacks to /opt/kubectl, the AWS CLI layer to /opt/awscli).
os.environ["PATH"] = "/opt/kubectl:/opt/awscli:" + os.environ.get("PATH", "")
KUBECONFIG = "/tmp/kubeconfig"  # noqa: S108 - Lambda's only writable folder
POLL_SECONDS = 10
# No call runs past the drain's deadline: each kubectl / AWS CLI run is cut at this or at the
# deadline, whichever comes first, and the deadline leaves the answer's own time (cfn_response's
# PUT may take up to RESPONSE_SECONDS) and some slack before Lambda ends the function. A function
# ended by its timeout sends no answer and the stack waits for the resource's service timeout.
CALL_SECONDS = 60
# A retry is not started with less time than this left: the last real error is the better answer.
MIN_RETRY_SECONDS = 5
RESPONSE_SECONDS = cfn_response.RESPONSE_TIMEOUT_SECONDS
RESPONSE_MARGIN_SECONDS = RESPONSE_SECONDS + 15
# kubectl's message when the API server has no such resource type, i.e. the KubeRay CRD is not
# installed (k8s.io/kubectl, ResourceBuilder's REST mapping: "the server doesn't have a resource
# type %q"): no RayJob can exist, nothing to drain. CDK's own manifest delete logs every error and
# succeeds (aws-cdk-lib 2.275, custom-resource-handlers/aws-eks-v2/kubectl-handler/apply, Delete).
NO_RESOURCE_TYPE = "doesn't have a resource type"
# Errors a retry cannot cure during a stack delete: RBAC's refusal (the API server's "is
# forbidden"), IAM's, and a cluster that does not exist (DescribeCluster's ResourceNotFoundException).
PERMANENT = ("forbidden", "AccessDenied", "ResourceNotFoundException")


class CallError(RuntimeError):
    """A kubectl or AWS CLI run that failed; `permanent` when a retry cannot help (RBAC refuses)."""

    def __init__(self, message: str, *, permanent: bool = False, no_resource_type: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent or no_resource_type
        self.no_resource_type = no_resource_type


def _run(argv: list[str], what: str, deadline: float) -> str:
    seconds = min(CALL_SECONDS, deadline - time.monotonic())
    if seconds <= 0:
        raise CallError(f"{what}: no time left before the answer to CloudFormation is due")
    try:
        out = subprocess.run(  # noqa: S603 - argv list
            argv, check=False, capture_output=True, text=True, timeout=seconds
        )
    except subprocess.TimeoutExpired:
        raise CallError(f"{what}: no answer within {seconds:.0f} s") from None
    if out.returncode != 0:
        err = out.stderr.strip()[-500:] or f"exit status {out.returncode}"
        raise CallError(
            f"{what}: {err}",
            permanent=any(word in err for word in PERMANENT),
            no_resource_type=NO_RESOURCE_TYPE in err,
        )
    return out.stdout


def kubeconfig(cluster_name: str, path: str, deadline: float) -> None:
    """`aws eks update-kubeconfig` (as CDK's kubectl handler logs in); its stderr in the error."""
    argv = ["aws", "eks", "update-kubeconfig", "--name", cluster_name, "--kubeconfig", path]
    _run(argv, f"aws eks update-kubeconfig --name {cluster_name}", deadline)


def kubectl(path: str, *args: str, deadline: float) -> str:
    return _run(["kubectl", "--kubeconfig", path, *args], f"kubectl {' '.join(args)}", deadline)


def retrying(call: Callable[[], Any], deadline: float, *, sleep: Callable[[float], None], poll: float) -> Any:
    """`call()`, again after `poll` seconds on an error a retry may cure (the API server or the
    network for a moment), until the deadline; the last error then."""
    while True:
        try:
            return call()
        except CallError as exc:
            if exc.permanent or time.monotonic() + poll + MIN_RETRY_SECONDS >= deadline:
                raise
            LOG.warning("retrying: %s", exc)
            sleep(poll)


def delete_args(namespace: str, selector: str) -> list[str]:
    return [
        "delete", "rayjobs.ray.io", "-n", namespace, "-l", selector,
        "--cascade=foreground", "--wait=false", "--ignore-not-found",
    ]  # fmt: skip


def remaining(path: str, namespace: str, selector: str, deadline: float) -> list[str]:
    out = kubectl(
        path, "get", "rayjobs.ray.io", "-n", namespace, "-l", selector, "-o", "name", deadline=deadline
    )
    return [line for line in out.splitlines() if line.strip()]


def drain(
    path: str,
    namespace: str,
    selector: str,
    *,
    deadline: float,
    sleep: Callable[[float], None] = time.sleep,
    poll: float | None = None,
) -> list[str]:
    """Delete the selected RayJobs (foreground) and wait until the deadline (time.monotonic());
    what is left. No RayJob resource type (no KubeRay CRD): nothing to drain."""
    poll = POLL_SECONDS if poll is None else poll
    try:
        retrying(lambda: kubectl(path, *delete_args(namespace, selector), deadline=deadline),
                 deadline, sleep=sleep, poll=poll)  # fmt: skip
    except CallError as exc:
        if exc.no_resource_type:
            LOG.info("no RayJob resource type: %s", exc)
            return []
        raise
    left: list[str] | None = None
    while True:
        try:
            left = retrying(
                lambda: remaining(path, namespace, selector, deadline), deadline, sleep=sleep, poll=poll
            )
        except CallError as exc:
            # Out of time on a slow or failing last look: what the last one saw is still the answer.
            if left is None or exc.permanent:
                raise
            return left
        if not left or time.monotonic() + poll + MIN_RETRY_SECONDS >= deadline:
            return left
        LOG.info("waiting for %s", ", ".join(left))
        sleep(poll)


# The stack statuses in which a Delete means the whole stack goes (see the module's docstring).
STACK_GOING = frozenset({"DELETE_IN_PROGRESS", "ROLLBACK_IN_PROGRESS"})


def stack_status(stack_id: str, client: Any = None) -> str:
    """The status of the stack `stack_id` (an ARN), by DescribeStacks in the stack's own region
    (the ARN's fourth field), with botocore's standard retry mode (throttling, 5xx, connection
    errors)."""
    if client is None:
        import boto3  # the Lambda runtime's
        from botocore.config import Config

        client = boto3.client(
            "cloudformation",
            region_name=stack_id.split(":")[3],
            # Bounded: a few minutes at worst, well inside the function's 15.
            config=Config(
                connect_timeout=10, read_timeout=20, retries={"mode": "standard", "max_attempts": 5}
            ),
        )
    (stack,) = client.describe_stacks(StackName=stack_id)["Stacks"]
    return str(stack["StackStatus"])


def on_event(
    event: dict[str, Any],
    context: Any,
    *,
    send: cfn_response.Send | None = None,
    login: Callable[[str, str, float], None] = kubeconfig,
    status_of: Callable[[str], str] = stack_status,
) -> None:
    """Lambda entry point (CloudFormation custom resource protocol: always answer the response URL)."""
    props = event.get("ResourceProperties", {})

    def act() -> tuple[str, str]:
        if event["RequestType"] != "Delete":
            return cfn_response.SUCCESS, "nothing to do"
        # Every call below ends before the answer is due (see CALL_SECONDS).
        deadline = time.monotonic() + context.get_remaining_time_in_millis() / 1000 - RESPONSE_MARGIN_SECONDS
        status = status_of(event["StackId"])
        if status not in STACK_GOING:
            # A replacement, a removal from the template or an update's rollback: the stack and
            # its jobs anchor stay, and so do the jobs.
            return (
                cfn_response.SUCCESS,
                f"stack is {status}, not being deleted: submitted RayJobs left running",
            )
        retrying(lambda: login(props["ClusterName"], KUBECONFIG, deadline), deadline,
                 sleep=time.sleep, poll=POLL_SECONDS)  # fmt: skip
        left = drain(KUBECONFIG, props["Namespace"], props["Selector"], deadline=deadline)
        if left:
            # FAILED keeps this resource, so a retried destroy deletes and waits again.
            return (
                cfn_response.FAILED,
                f"still being deleted: {', '.join(left)} (is the KubeRay operator running?)",
            )
        return cfn_response.SUCCESS, "no submitted RayJob left"

    default_id = f"ray-job-drain-{props.get('ClusterName', 'unknown')}"
    cfn_response.answer(event, default_id, act, what="drain", send=send)

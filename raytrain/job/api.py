"""The Kubernetes API calls of `raytrain job`, as plain dicts, on top of verify's client and its
error mapping (a refusal names the access entry; 404 is None)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, NamedTuple

from raytrain import verify
from raytrain.job.common import JobError
from raytrain.verify import RAY_GROUP, RAY_VERSION, REQUEST_TIMEOUT

# Kueue's API as the Cluster stack installs it (cdk_constructs/kueue.py, k8s/kueue.py).
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"


class _Resource(NamedTuple):
    group: str
    version: str
    plural: str
    kind: str  # as messages name it


_RAYJOBS = _Resource(RAY_GROUP, RAY_VERSION, "rayjobs", "RayJob")
_RAYCLUSTERS = _Resource(RAY_GROUP, RAY_VERSION, "rayclusters", "RayCluster")
_LOCALQUEUES = _Resource(KUEUE_GROUP, KUEUE_VERSION, "localqueues", "LocalQueue")
_WORKLOADS = _Resource(KUEUE_GROUP, KUEUE_VERSION, "workloads", "Kueue Workload")


class JobApi:
    """The calls these commands make, as plain dicts, on top of verify's client and error mapping."""

    def __init__(self, api: verify.Api) -> None:
        self.api = api
        self.host = api.host

    def rayjobs(self, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        kwargs = {"label_selector": selector} if selector else {}
        return self._list_custom(
            _RAYJOBS, namespace, what="rayjobs", installed_by="the KubeRay operator", **kwargs
        )

    def rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get_custom(_RAYJOBS, namespace, name)

    def local_queue(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A Kueue LocalQueue (k8s/kueue.py); None when absent."""
        return self._get_custom(_LOCALQUEUES, namespace, name)

    def workloads(self, namespace: str) -> list[dict[str, Any]]:
        """Kueue's Workloads in a namespace: one per queued RayJob."""
        return self._list_custom(_WORKLOADS, namespace, what="Kueue workloads", installed_by="Kueue")

    def may(self, verb: str, group: str, resource: str, namespace: str) -> bool:
        """Whether the caller's RBAC allows `verb` on `resource` in `namespace`: a
        SelfSubjectAccessReview, which every authenticated user may create (the built-in
        system:basic-user ClusterRole; Kubernetes docs, "Checking API access")."""
        from kubernetes import client

        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                }
            },
        }
        out = self.api._call(
            f"asking whether you may {verb} {resource} in {namespace}",
            client.AuthorizationV1Api(self.api._client).create_self_subject_access_review,
            review,
        )
        return bool(((out or {}).get("status") or {}).get("allowed"))

    def _get_custom(self, res: _Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """One custom object; None when absent."""
        return self.api._call(
            f"reading {res.kind} {namespace}/{name}",
            self.api.custom.get_namespaced_custom_object,
            res.group,
            res.version,
            namespace,
            res.plural,
            name,
        )

    def _list_custom(
        self, res: _Resource, namespace: str, *, what: str, installed_by: str, **kwargs: Any
    ) -> list[dict[str, Any]]:
        """The items of a custom resource in a namespace; one that the API server does not serve
        (404) is an error naming what installs it."""
        out = self.api._call(
            f"listing {what} in {namespace}",
            self.api.custom.list_namespaced_custom_object,
            res.group,
            res.version,
            namespace,
            res.plural,
            **kwargs,
        )
        if out is None:
            raise JobError(
                f"the API at {self.host} has no {res.kind} resource: is {installed_by} installed "
                "(the Cluster stack)?"
            )
        return list(out.get("items") or [])

    def configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.api._call(
            f"reading ConfigMap {namespace}/{name}",
            self.api.core.read_namespaced_config_map,
            name,
            namespace,
        )

    def events(self, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
        """Events about one object (the scheduler's and the Cluster Autoscaler's about a pod)."""
        out = self.api._call(
            f"listing events of {kind} {namespace}/{name}",
            self.api.core.list_namespaced_event,
            namespace,
            field_selector=f"involvedObject.kind={kind},involvedObject.name={name}",
        )
        return [] if out is None else list(out.get("items") or [])

    def create_rayjob(self, namespace: str, body: dict[str, Any], *, dry_run: bool) -> dict[str, Any]:
        """Create (or, with `dry_run`, have the API server validate without storing: its schema,
        CEL rules, admission) a RayJob."""
        what = f"{'validating' if dry_run else 'creating'} RayJob {namespace}/{body['metadata']['name']}"
        kwargs: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
        return self._write(
            what,
            self.api.custom.create_namespaced_custom_object,
            RAY_GROUP,
            RAY_VERSION,
            namespace,
            "rayjobs",
            body,
            **kwargs,
        )

    def delete_rayjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Delete with foreground propagation: the RayJob stays visible (deletionTimestamp set)
        until its dependents (RayCluster, submitter Job) are gone (Kubernetes docs, Garbage
        Collection), and KubeRay's finalizer stops the Ray job first (rayjob_controller.go)."""
        return self._write(
            f"deleting RayJob {namespace}/{name}",
            self.api.custom.delete_namespaced_custom_object,
            RAY_GROUP,
            RAY_VERSION,
            namespace,
            "rayjobs",
            name,
            propagation_policy="Foreground",
            missing_ok=True,
        )

    def suspend_workers(self, namespace: str, cluster: dict[str, Any]) -> dict[str, Any] | None:
        """Set `suspend: true` on every worker group of a job's RayCluster: the update KubeRay's
        DeleteWorkers rule makes (rayjob_controller.go suspendWorkerGroups); the RayCluster
        controller then deletes the groups' pods and keeps the head."""
        name = str((cluster.get("metadata") or {}).get("name"))
        groups = (cluster.get("spec") or {}).get("workerGroupSpecs") or []
        # A JSON patch, so that only the suspend fields change (a merge patch, the client's
        # default for custom objects, would replace the whole list).
        patch = [
            {"op": "add", "path": f"/spec/workerGroupSpecs/{i}/suspend", "value": True}
            for i in range(len(groups))
        ]
        return self._write(
            f"suspending the workers of RayCluster {namespace}/{name}",
            self.api.custom.patch_namespaced_custom_object,
            RAY_GROUP,
            RAY_VERSION,
            namespace,
            "rayclusters",
            name,
            patch,
            missing_ok=True,
            _content_type="application/json-patch+json",
        )

    def deactivate_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Set a Kueue Workload's `spec.active` to false: Kueue evicts it ("Changing active from
        true to false will evict any running workloads", the Workload CRD, v0.19.2) and never
        admits it again; the RayJob is suspended, and KubeRay deletes its cluster (the pods'
        preStop hooks write the checkpoint on notice: training/checkpoint/notice.py). A JSON patch
        of that one field."""
        return self._write(
            f"deactivating Kueue workload {namespace}/{name}",
            self.api.custom.patch_namespaced_custom_object,
            KUEUE_GROUP,
            KUEUE_VERSION,
            namespace,
            "workloads",
            name,
            [{"op": "add", "path": "/spec/active", "value": False}],
            _content_type="application/json-patch+json",
            missing_ok=True,
        )

    def _write(self, what: str, fn: Any, *args: Any, missing_ok: bool = False, **kwargs: Any) -> Any:
        """A write; the API server's own message on refusal (409 exists, 422 invalid)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            resp = fn(*args, _request_timeout=REQUEST_TIMEOUT, _preload_content=False, **kwargs)
            return json.loads(resp.data or b"{}")
        except ApiException as exc:
            if exc.status == 404 and missing_ok:
                return None
            if exc.status in (401, 403):
                raise JobError(_refused(self.host, what, exc)) from None
            raise JobError(f"{what}: HTTP {exc.status} {_status_message(exc)}") from None
        except (HTTPError, OSError, ValueError) as exc:
            raise JobError(
                f"{what}: cannot reach the Kubernetes API at {self.host} ({type(exc).__name__}: {exc})"
            ) from None

    def raycluster(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get_custom(_RAYCLUSTERS, namespace, name)

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.api.pods(namespace, selector)

    def secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.api._call(
            f"reading Secret {namespace}/{name}", self.api.core.read_namespaced_secret, name, namespace
        )

    def log_chunks(
        self,
        namespace: str,
        pod: str,
        *,
        container: str | None,
        follow: bool,
        tail: int | None,
        previous: bool,
    ) -> Iterator[bytes]:
        """The container's log as it arrives (the API streams it while `follow` is set)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        kwargs: dict[str, Any] = {"follow": follow, "previous": previous}
        if container:
            kwargs["container"] = container
        if tail is not None:
            kwargs["tail_lines"] = tail
        try:
            # No timeout while following (the client takes none or both): a quiet training step
            # is not a dead server, and the lookups before this one proved the server answers.
            timeout: Any = None if follow else REQUEST_TIMEOUT
            resp: Any = self.api.core.read_namespaced_pod_log(
                pod, namespace, _preload_content=False, _request_timeout=timeout, **kwargs
            )
            try:
                yield from resp.stream(4096, decode_content=True)
            finally:
                resp.release_conn()
        except ApiException as exc:
            if exc.status in (401, 403):
                raise JobError(_refused(self.host, f"reading logs of {namespace}/{pod}", exc)) from None
            detail = _status_message(exc)
            raise JobError(f"logs of {namespace}/{pod}: HTTP {exc.status} {detail}") from None
        except (HTTPError, OSError) as exc:
            raise JobError(f"the log stream from {self.host} broke ({type(exc).__name__}: {exc})") from None


def _refused(host: str, what: str, exc: Any) -> str:
    return (
        f"the API server at {host} refused {what} (HTTP {exc.status} {exc.reason}): check your AWS "
        "credentials and that your IAM principal has an EKS access entry "
        "(cluster.job_submitter_principals or admin_principal_arns)"
    )


def _status_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)

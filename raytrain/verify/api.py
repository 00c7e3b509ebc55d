"""The Kubernetes client `raytrain verify` and `raytrain job` share: the kubeconfig connection,
the few reads as plain dicts, and the one-line errors (a refusal names the access entry)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

from config.settings import Settings

RAY_GROUP, RAY_VERSION = "ray.io", "v1"
REQUEST_TIMEOUT = (5, 30)  # connect, read (seconds)


class VerifyError(Exception):
    """Verification cannot run at all; `str()` is the message for the user."""


class Api:
    """The few reads verify needs, as plain dicts, through the official client."""

    def __init__(self, api_client: Any) -> None:
        # Imported where used: every `raytrain` command imports this module to register it.
        from kubernetes import client

        self._client = api_client
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.host = api_client.configuration.host

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call the API; None for 404; VerifyError for anything that makes checking impossible."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            # Raw JSON, not the client's models: those reject objects missing fields they declare
            # required (node systemInfo, …), which is the client's strictness, not the cluster's fault.
            resp = fn(*args, _request_timeout=REQUEST_TIMEOUT, _preload_content=False, **kwargs)
            out = json.loads(resp.data)
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status in (401, 403):
                raise VerifyError(
                    f"the API server at {self.host} refused {what} (HTTP {exc.status} {exc.reason}): "
                    "check your AWS credentials and that your IAM principal has an EKS access entry "
                    "(cluster.admin_principal_arns)"
                ) from None
            raise VerifyError(f"{what} failed at {self.host}: HTTP {exc.status} {exc.reason}") from None
        except (HTTPError, OSError, ValueError) as exc:
            raise VerifyError(
                f"cannot reach the Kubernetes API at {self.host} ({type(exc).__name__}: {exc}); "
                "is the cluster up, the endpoint reachable from here (cluster.public_access_cidrs), "
                "and the kubeconfig current (aws eks update-kubeconfig)?"
            ) from None
        if not isinstance(out, dict):
            raise VerifyError(f"{what}: the API at {self.host} answered {type(out).__name__}, not an object")
        return out

    def nodes(self) -> list[dict[str, Any]]:
        return self._call("listing nodes", self.core.list_node)["items"]

    def daemonsets(self, namespace: str) -> list[dict[str, Any]] | None:
        out = self._call(
            f"listing DaemonSets in {namespace}", self.apps.list_namespaced_daemon_set, namespace
        )
        return None if out is None else out["items"]

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        out = self._call(
            f"listing pods in {namespace}",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=selector,
        )
        return [] if out is None else out["items"]

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(
            f"reading Deployment {namespace}/{name}",
            self.apps.read_namespaced_deployment,
            name,
            namespace,
        )

    def ray_objects(self, namespace: str, plural: str) -> list[dict[str, Any]] | None:
        """None when the CRD is not installed (the API answers 404 for the resource)."""
        out = self._call(
            f"listing {plural} in {namespace}",
            self.custom.list_namespaced_custom_object,
            RAY_GROUP,
            RAY_VERSION,
            namespace,
            plural,
        )
        return None if out is None else out.get("items", [])


@contextlib.contextmanager
def _exec_plugin_errors() -> Iterator[list[str]]:
    """What the kubernetes client logs while it runs the kubeconfig's exec credential plugin.

    On a failed plugin (`aws eks get-token` without credentials exits 255) the client does not raise:
    `KubeConfigLoader._load_from_exec_plugin` (kubernetes/config/kube_config.py) calls
    `logging.error(...)` on the root logger, which with no handler configures logging and prints
    `ERROR:root:exec: ...`, and carries on without a token. A handler on the root logger for the
    load both collects those messages and keeps logging from configuring itself."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name == "root" and f"kubernetes{os.sep}config" in record.pathname:
                messages.append(record.getMessage())
            elif logging.lastResort is not None:  # anything else: shown as without this handler
                logging.lastResort.handle(record)

    root = logging.getLogger()
    handler = Collect(logging.WARNING)
    root.addHandler(handler)
    try:
        yield messages
    finally:
        root.removeHandler(handler)


def connect(kubeconfig: str | None, context: str | None, settings: Settings) -> Api:
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    hint = f"aws eks update-kubeconfig --name {settings.cluster.name} --region {settings.region}"
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
    shown = path or "~/.kube/config"
    if path is not None and not os.path.isfile(os.path.expanduser(path)):
        raise VerifyError(f"no kubeconfig at {shown}; write one with: {hint}")
    cfg = client.Configuration()
    try:
        with _exec_plugin_errors() as exec_errors:
            config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
    except ConfigException as exc:
        raise VerifyError(f"kubeconfig {shown}: {exc}; write one with: {hint}") from None
    except OSError as exc:  # e.g. the exec credential plugin (aws) is not installed
        raise VerifyError(f"kubeconfig {shown}: {exc}") from None
    if exec_errors:
        raise VerifyError(
            f"kubeconfig {shown}: its credential command failed ({' '.join(exec_errors[0].split())}); "
            f"it needs AWS credentials for account {settings.account}: `aws sso login --profile NAME` "
            "and export AWS_PROFILE=NAME (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
        )
    # One retry: a gate should fail in seconds when the endpoint is closed, not after minutes.
    cfg.retries = 1
    # urllib3 logs a warning before that retry; the failure, if it comes, is reported in one line.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    return Api(client.ApiClient(cfg))

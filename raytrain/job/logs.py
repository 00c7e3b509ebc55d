"""`raytrain job logs`: the submitter's (the driver's), the head's or a worker's log."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape

from config.settings import Settings
from raytrain.job.api import JobApi
from raytrain.job.common import EXIT_OK, JobError, consoles
from raytrain.job.entry import guarded
from raytrain.job.find import Target, _created, _meta, _role


def _container(pod: dict[str, Any]) -> str | None:
    containers = (pod.get("spec") or {}).get("containers") or []
    return str(containers[0]["name"]) if containers else None


def pick_pod(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    if args.head:
        pods, what = target.cluster_pods("head"), "head pod"
    elif args.worker is not None:
        pods, what = target.cluster_pods("worker"), "worker pod"
        names = [str(_meta(p, "name")) for p in pods]
        if args.worker in names:
            return pods[names.index(args.worker)]
        if not args.worker.isdigit():
            raise JobError(
                f"no worker pod {args.worker!r} in {target.describe()}; present: {names or 'none'}"
            )
        index = int(args.worker)
        if index >= len(pods):
            raise JobError(
                f"--worker {index}: {target.describe()} has {len(pods)} worker pod(s): {names or 'none'}"
            )
        return pods[index]
    else:
        # Newest attempt first: the Job retries its submitter pod up to its backoff limit.
        pods = sorted(target.submitter_pods(), key=_created, reverse=True)
        what = "submitter pod"
    if not pods:
        raise JobError(
            f"no {what} for {target.describe()}: not started yet, or removed when the job finished "
            "(`raytrain job status` shows what exists)"
        )
    return pods[0]


def run_logs(args: argparse.Namespace, console: Console | None = None) -> int:
    console, err = consoles(console)
    out = sys.stdout

    def body(settings: Settings, api: JobApi) -> int:
        target = Target(api, settings, args.job)
        pod = pick_pod(target, args)
        name = str(_meta(pod, "name"))
        console.print(f"[dim]logs of {target.namespace}/{escape(name)} ({_role(pod)})[/]", highlight=False)
        decoder = _Utf8()
        for chunk in api.log_chunks(
            target.namespace,
            name,
            container=_container(pod),
            follow=args.follow,
            tail=args.tail,
            previous=args.previous,
        ):
            out.write(decoder(chunk))
            out.flush()
        out.write(decoder(b"", final=True))
        out.flush()
        return EXIT_OK

    return guarded(args, console, body, err=err)


class _Utf8:
    """Decodes a byte stream whose chunks may split a multi-byte character."""

    def __init__(self) -> None:
        import codecs

        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, data: bytes, final: bool = False) -> str:
        return str(self._dec.decode(data, final=final))

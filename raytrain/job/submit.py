"""`raytrain job submit`: a RayJob from the environment's settings (plus `--set` overrides), in
seconds, without CloudFormation.

Order, so that nothing is created half-way: settings and overrides validated (the same model and
memory plan as synthesis); the environment's jobs read (the Workload stack's jobs anchor must
exist; the run name must not be in use by an unfinished job: two jobs would write the same
checkpoints; nor be a finished job's run unless job.resume: the job would refuse it after its GPU
nodes started); the code zip built; the RayJob rendered by the chart's own function and validated by
the API server without being stored (dryRun=All: its schema, CEL rules and admission); only then
the code uploaded (skipped when that content is there) and the RayJob created.
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import shlex
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from config.loader import SettingsError, environment_file, load_with_overrides
from config.locations import S3Input, checkpoint_bucket_name, checkpoint_prefix, checkpoint_uri, s3_inputs
from config.names import DEPLOYED_JOB_PREFIX, JOBS_ANCHOR, RUN_NAME_LABEL
from config.settings import ClusterMode, Settings
from config.settings.teams import priority_problem
from config.startup import PODS_READY_TIMEOUT_SECONDS
from raytrain.job import code
from raytrain.job.api import JobApi
from raytrain.job.common import EXIT_FAILED, EXIT_OK, EXIT_UNUSABLE, JOBS_SELECTOR, JobError, consoles
from raytrain.job.entry import connect, guarded, settings_refused, team_view
from raytrain.job.find import _meta, finished, gpu_nodes_held
from raytrain.verify import VerifyError

SUBMITTED_PREFIX = "rs-"
# A DNS-1035 label of at most 47 characters: KubeRay appends 6 to name the job's cluster.
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,45}[a-z0-9])?$")
# What the deployed stack fixes; a job cannot change it (the change needs a deploy).
_DEPLOYED_ONLY = {
    "deploy": "says what `cdk deploy` starts",
    "cluster": "own or standing is the deployed cluster's shape",
    "input_kms_keys": "are IAM grants of the Ray pods' role",
    "hf_token_secret": "is an IAM grant of the Ray pods' role",
}


def run_submit(args: argparse.Namespace, console: Console | None = None) -> int:
    console, err = consoles(console)
    for item in args.overrides:
        field = item.partition("=")[0].strip().removeprefix("job.")
        if field in _DEPLOYED_ONLY:
            err.print(
                f"[bold red]--set {escape(item)}:[/] job.{field} {_DEPLOYED_ONLY[field]}: change it "
                f"in {environment_file(args.env, args.config_dir)} and deploy",
                highlight=False,
                soft_wrap=True,
            )
            return 2
    # One read of the environment file: the job's settings (with --set) and the file's own.
    try:
        loaded, own = load_with_overrides(args.env, args.overrides, args.config_dir)
    except SettingsError as exc:
        return settings_refused(err, exc)
    try:
        loaded = team_view(args, loaded)
        check_queue(loaded, args.priority)
    except JobError as exc:
        err.print(
            f"[bold red]raytrain job submit ({loaded.name}):[/] {escape(str(exc))}",
            highlight=False,
            soft_wrap=True,
        )
        return EXIT_UNUSABLE
    if args.dry_run:
        return dry_run(args, err, loaded, own)

    def body(settings: Settings, api: JobApi) -> int:
        # The chart's code loads cdk8s (a jsii process): only this command pays for it.
        from k8s.chart import JobOwner, submitted_rayjob

        check_inputs_granted(settings, own, args.env, environment_file(args.env, args.config_dir))
        check_image_cached(settings)
        check_model_access(settings, err)
        name = job_name(args.name, settings)
        ns = settings.workload.namespace
        anchor = api.configmap(ns, JOBS_ANCHOR)
        if anchor is None:
            raise JobError(
                f"no ConfigMap {ns}/{JOBS_ANCHOR}: the Workload stack of {settings.name} is not "
                "deployed (or predates `job submit`): cdk deploy it first"
            )
        jobs = api.rayjobs(ns, JOBS_SELECTOR)
        check_run_name(jobs, settings, name)
        with tempfile.TemporaryDirectory(prefix="raytrain-submit-") as tmp:
            zipped = code.build(Path(tmp))
            bucket = checkpoint_bucket_name(settings)
            manifest = submitted_rayjob(
                settings,
                name=name,
                code_uri=f"s3://{bucket}/{zipped.key}",
                checkpoint_uri=checkpoint_uri(settings),
                owner=JobOwner(uid=str(_meta(anchor, "uid"))),
                priority=args.priority,
            )
            api.create_rayjob(ns, manifest, dry_run=True)
            uploaded = code.upload(
                zipped,
                bucket=bucket,
                region=settings.region,
                policy_name=f"{settings.stack_prefix}-job-submitter",
            )
            api.create_rayjob(ns, manifest, dry_run=False)
        state = "uploaded" if uploaded else "unchanged, already uploaded"
        console.print(
            f"code: s3://{bucket}/{zipped.key} ({state}, {zipped.size / 2**20:.1f} MiB)", highlight=False
        )
        team = settings.active_team
        console.print(
            f"[green]submitted[/] RayJob {ns}/{name} (run {settings.job.run_name}) to queue {team.queue}, "
            f"priority {args.priority or team.default_priority}: Kueue starts it when the team's quota "
            "(or idle quota it may borrow) can take all of it",
            highlight=False,
            soft_wrap=True,
        )
        for line in capacity_lines(jobs, settings):
            console.print(line, highlight=False, soft_wrap=True)
        env = f"--env {shlex.quote(settings.name)}"
        if len(settings.team_list) > 1:
            env += f" --team {settings.active_team.name}"
        console.print("follow it with:", highlight=False)
        for action in ("status", "logs --follow", "stop"):
            console.print(f"  raytrain job {action} {env} --job {name}", highlight=False)
        if args.wait:
            return wait(api, ns, name, console, args.poll_seconds)
        return EXIT_OK

    return guarded(args, console, body, err=err, settings=loaded)


# The ownerReference uid of a RayJob rendered without the cluster (the jobs anchor's uid is the
# cluster's to assign): not a valid uid, so the output cannot be applied as it is by mistake.
OFFLINE_OWNER_UID = "<uid of ConfigMap ray-train-jobs: read from the cluster at submit>"


def dry_run(args: argparse.Namespace, err: Console, settings: Settings, own: Settings | None) -> int:
    """`--dry-run`: print the RayJob `submit` would create, as JSON on stdout; upload and create
    nothing. With the cluster reachable, the same reads and refusals as a submit (the jobs anchor,
    a run name in use); without (no kubeconfig, no credentials, endpoint unreachable), rendered
    offline from the settings, with one line on stderr saying what was not checked."""
    from k8s.chart import JobOwner, submitted_rayjob

    where = f"raytrain job submit --dry-run ({settings.name})"
    try:
        check_inputs_granted(settings, own, args.env, environment_file(args.env, args.config_dir))
        check_image_cached(settings)
        name = job_name(args.name, settings)
    except JobError as exc:
        err.print(f"[bold red]{where}:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return EXIT_UNUSABLE
    ns = settings.workload.namespace
    uid = OFFLINE_OWNER_UID
    try:
        api = connect(args, settings)
        anchor = api.configmap(ns, JOBS_ANCHOR)
        check_run_name(api.rayjobs(ns, JOBS_SELECTOR), settings, name)
        if anchor is None:
            err.print(
                f"[yellow]{where}:[/] no ConfigMap {ns}/{JOBS_ANCHOR} (the Workload stack is not "
                "deployed): its ownerReference uid is a placeholder",
                highlight=False,
                soft_wrap=True,
            )
        else:
            uid = str(_meta(anchor, "uid"))
    except VerifyError as exc:
        err.print(
            f"[yellow]{where}: rendered offline[/] (not checked against the cluster: the jobs "
            f"anchor's uid, a run name in use): {escape(str(exc))}",
            highlight=False,
            soft_wrap=True,
        )
    except JobError as exc:
        err.print(f"[bold red]{where}:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return EXIT_UNUSABLE
    with tempfile.TemporaryDirectory(prefix="raytrain-submit-") as tmp:
        zipped = code.build(Path(tmp))
    manifest = submitted_rayjob(
        settings,
        name=name,
        code_uri=f"s3://{checkpoint_bucket_name(settings)}/{zipped.key}",
        checkpoint_uri=checkpoint_uri(settings),
        owner=JobOwner(uid=uid),
        priority=args.priority,
    )
    print(json.dumps(manifest, indent=2, sort_keys=True))
    return EXIT_OK


def check_image_cached(settings: Settings, ecr: Any = None) -> None:
    """A digest-pinned Ray image pulled through the cache must be in it already: a digest that is
    not cached is "not found" through the cache (aws/containers-roadmap#2837), and the pods would
    sit in ImagePullBackOff with no hint. The Cluster stack's warm caches the pinned digest at
    deploy (cdk_constructs/image_cache_warmer.py), so a digest newly pinned in the file and not
    deployed yet is refused here. ecr:DescribeImages on the repository: the Workload stack's
    JobSubmitter policy grants it."""
    digest = settings.workload.effective_image_digest
    repository = settings.image_source.cache_repository(settings.workload.image)
    if digest is None or repository is None:
        return
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    ecr = ecr or boto3.client("ecr", region_name=settings.region)
    try:
        found = ecr.describe_images(repositoryName=repository, imageIds=[{"imageDigest": digest}])
        if found.get("imageDetails"):
            return
    except ClientError as exc:
        code_ = exc.response.get("Error", {}).get("Code")
        if code_ not in ("ImageNotFoundException", "RepositoryNotFoundException"):
            raise JobError(
                f"checking that {digest} is in the cache ({repository}): {exc}; your AWS principal "
                f"needs the {settings.stack_prefix}-job-submitter policy (docs/jobs.md)"
            ) from None
    except BotoCoreError as exc:
        raise JobError(
            f"checking the image cache: {exc}; are AWS credentials set for {settings.region}?"
        ) from None
    raise JobError(
        f"workload.image_digest {digest} is not in the pull-through cache ({repository}), and a digest "
        "not cached cannot be pulled through it (aws/containers-roadmap#2837): the pods would stay in "
        f"ImagePullBackOff. Deploy the Cluster stack (`cdk deploy {settings.stack_prefix}-Cluster`: its "
        "warm caches the pinned digest), or pin the digest the last deploy warmed"
    )


def check_queue(settings: Settings, priority: str | None) -> None:
    """`--priority` names a WorkloadPriorityClass, and the job fits what its team could ever be given:
    Kueue would queue a larger one for ever (its nominal quota plus what it may borrow, within the
    GPU node group)."""
    if priority is not None:
        problem = priority_problem(priority)
        if problem:
            raise JobError(f"--priority: {problem}")
    if settings.job.cluster is not ClusterMode.OWN:
        return
    team, gpu = settings.active_team, settings.gpu_nodes
    most = team.most_nodes(gpu.max_size)
    if settings.job.nodes > most:
        borrow = "any idle" if team.borrowing_limit_nodes is None else str(team.borrowing_limit_nodes)
        raise JobError(
            f"job.nodes {settings.job.nodes}: team {team.name} can never be given more than {most} "
            f"{gpu.instance_type} nodes (its quota gpu_nodes {team.gpu_nodes}, borrowing_limit_nodes "
            f"{borrow}, gpu_nodes.max_size {gpu.max_size}), so Kueue would never admit it: "
            f"--set job.nodes={most} or less, or raise the team's quota (docs/teams.md)"
        )


def job_name(given: str | None, settings: Settings) -> str:
    """`--name`, or rs-<run name>-<UTC time>-<3 random>: never the deployed jobs' rj- names."""
    if given is not None:
        if not _NAME_RE.match(given):
            raise JobError(
                f"--name {given!r}: not a RayJob name: 1-47 of a-z, 0-9 and '-', starting with a "
                "letter, not ending with '-'"
            )
        if given.startswith(DEPLOYED_JOB_PREFIX):
            raise JobError(
                f"--name {given!r}: names starting with {DEPLOYED_JOB_PREFIX!r} are the deployed jobs'"
            )
        return given
    stamp = datetime.now(UTC).strftime("%y%m%d%H%M%S")
    suffix = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(3))
    slug = re.sub(r"[^a-z0-9-]+", "-", settings.job.run_name).strip("-")[:24].strip("-")
    return f"{SUBMITTED_PREFIX}{slug}-{stamp}-{suffix}" if slug else f"{SUBMITTED_PREFIX}{stamp}-{suffix}"


def check_model_access(settings: Settings, err: Console) -> None:
    """The model's weights reachable on the hub with the job's token (raytrain/hub_access.py): a
    gated or missing model is refused before anything is uploaded or any node starts."""
    from raytrain.aws import session
    from raytrain.hub_access import Access, model_access

    sess = session(None)
    found, detail, fix = model_access(
        settings, lambda service, region: sess.client(service, region_name=region)
    )
    if found == Access.REFUSED:
        raise JobError(f"job.model: {detail}; {fix}")
    if found == Access.UNKNOWN:
        err.print(f"[yellow]model access:[/] {escape(detail)} (not checked)", highlight=False, soft_wrap=True)


def check_inputs_granted(
    settings: Settings, own: Settings | None, env: str, env_file: Path | str = ""
) -> None:
    """An s3:// data or model set with --set must lie inside what the deployed role may read (the
    environment file's own locations, `own`: the file without the overrides, from the same read;
    None when the file alone is refused, e.g. a memory plan the overrides fixed): the grants come
    with a deploy, not with a job."""
    deployed = s3_inputs(own) if own is not None else []
    env_file = env_file or f"config/environments/{env}.yaml"

    def covered(loc: S3Input) -> bool:
        return any(
            d.bucket == loc.bucket
            and (not d.prefix or loc.prefix == d.prefix or loc.prefix.startswith(d.prefix + "/"))
            for d in deployed
        ) or (
            loc.bucket == checkpoint_bucket_name(settings)
            and loc.prefix.startswith(checkpoint_prefix(settings) + "/")
        )

    for loc in s3_inputs(settings):
        if not covered(loc):
            allowed = ", ".join(f"s3://{d.bucket}/{d.prefix}" for d in deployed) or "none"
            raise JobError(
                f"{loc.setting}: s3://{loc.bucket}/{loc.prefix} is not readable by the Ray pods' role "
                f"(the deployed grants: {allowed}); set it in {env_file} and deploy{_prefix_hint(deployed)}"
            )


def _prefix_hint(deployed: list[S3Input]) -> str:
    """A deployed grant of one file means a deploy per data set: say how a prefix avoids that."""
    files = [d for d in deployed if d.setting in ("job.data", "job.eval_data") and _is_file(d.prefix)]
    if not files:
        return ""
    d = files[0]
    folder = d.prefix.rsplit("/", 1)[0] if "/" in d.prefix else ""
    example = f"s3://{d.bucket}/{folder + '/' if folder else ''}train/"
    return (
        f" (the file grants {d.setting} as one file, s3://{d.bucket}/{d.prefix}: give it a prefix "
        f"instead, e.g. {example} holding the jsonl files, and every data set under it is readable "
        "by later jobs without a deploy; keep held-out data under another prefix)"
    )


def _is_file(prefix: str) -> bool:
    return prefix.rsplit("/", 1)[-1].endswith((".jsonl", ".json", ".parquet", ".txt", ".gz", ".zst"))


def check_run_name(jobs: list[dict[str, Any]], settings: Settings, name: str) -> None:
    for job in jobs:
        if _meta(job, "name") == name:
            raise JobError(f"RayJob {name!r} exists already: choose another --name, or delete it first")
        labels = _meta(job, "labels") or {}
        if labels.get(RUN_NAME_LABEL) != settings.job.run_name:
            continue
        if not finished(job):
            raise JobError(
                f"job.run_name {settings.job.run_name!r} is in use by the unfinished RayJob "
                f"{_meta(job, 'name')} (both would write {checkpoint_uri(settings)}/"
                f"{settings.job.run_name}): stop it, or --set job.run_name=ANOTHER"
            )
        if not settings.job.resume:
            # The job itself would refuse the run's checkpoint, but only once GPU nodes had started.
            raise JobError(
                f"job.run_name {settings.job.run_name!r} is the run of the finished RayJob "
                f"{_meta(job, 'name')}: --set job.resume=true (with a larger job.steps) to continue "
                "it, or --set job.run_name=ANOTHER for a new run"
            )


def capacity_lines(jobs: list[dict[str, Any]], settings: Settings) -> list[str]:
    """Say when this job will wait for GPU nodes other jobs hold (they queue; none is refused)."""
    if settings.job.cluster is ClusterMode.STANDING:
        return []
    held = {str(_meta(j, "name")): gpu_nodes_held(j) for j in jobs if not finished(j)}
    held = {k: v for k, v in held.items() if v}
    in_use, cap = sum(held.values()), settings.gpu_nodes.max_size
    if in_use + settings.job.nodes <= cap:
        return []
    others = ", ".join(f"{k} ({v})" for k, v in sorted(held.items()))
    return [
        f"[yellow]waits for GPU nodes:[/] it needs {settings.job.nodes}, gpu_nodes.max_size is {cap} "
        f"and unfinished jobs hold {in_use}: {others}. It waits, suspended, in its team's Kueue queue "
        "until its nodes are free (no start budget runs meanwhile); once admitted, Kueue requeues it if "
        f"its pods are not ready within {PODS_READY_TIMEOUT_SECONDS} s (waitForPodsReady, "
        "config/startup.py). `raytrain job queue` and `raytrain job status` show why it waits."
    ]


_TERMINAL_DEPLOYMENT = ("Complete", "Failed", "ValidationFailed")


def wait(api: JobApi, ns: str, name: str, console: Console, poll: float) -> int:
    """Poll the RayJob until KubeRay reports an end; exit 0 only for SUCCEEDED."""
    seen: tuple[Any, Any] | None = None
    while True:
        job = api.rayjob(ns, name)
        if job is None:
            raise JobError(f"RayJob {ns}/{name} was deleted while waiting")
        status = job.get("status") or {}
        now = (status.get("jobDeploymentStatus"), status.get("jobStatus"))
        if now != seen:
            console.print(
                f"{datetime.now(UTC):%H:%M:%S} deployment {now[0] or '-'}, job {now[1] or '-'}"
                + (f": {escape(str(status['message']))}" if status.get("message") else ""),
                highlight=False,
                soft_wrap=True,
            )
            seen = now
        if now[0] in _TERMINAL_DEPLOYMENT:
            return EXIT_OK if now[1] == "SUCCEEDED" else EXIT_FAILED
        time.sleep(poll)

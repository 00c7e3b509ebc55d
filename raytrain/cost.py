"""`raytrain cost --env NAME [--summary summary.json] [--json]`: what an environment costs per hour.

Idle: what runs between jobs (EKS control plane, system nodes and their root volumes, NAT
gateways, interface endpoints, and the GPU group at its minimum size, zero unless the settings say
otherwise). Running: idle plus the GPU nodes of one job (`job.nodes`) and their root volumes.
After a job: its GPU workers are deleted when it ends (k8s/job.py), and the Cluster Autoscaler
removes the empty nodes within minutes; those minutes are billed once per job. A queued job's
whole cluster, head included, goes when it ends (Kueue: k8s/job.py); a head kept for inspection
would run on a system node, which idle already counts. Which team's queue the job lands in, and
what it may borrow, is printed beside (docs/teams.md).
Prices come from the pinned, dated table in config/prices.py (no network needed); with --live, or
for a region the table lacks, the instance rates come from the AWS Price List API and a Spot group's
from the current Spot price (raytrain/pricing.py; needs AWS credentials). Spot nodes without --live
are priced at the On-Demand rate, their ceiling, and a Capacity Block's instance-hours, paid upfront,
are left out: the output says so. Given a run's summary.json, the cost per billion training tokens
at the run's throughput.

Exit status: 0 printed, 2 cannot price (bad environment, region or type not priced and no
credentials to ask, bad summary file).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from config.costs import CostEstimate, Line, estimate, job_nodes, root_volume_per_hour
from config.loader import config_dir_argument, env_argument
from config.prices import PRICES, PriceError, RegionPrices, prices_for
from config.settings import Settings

__all__ = ["CostEstimate", "Line", "TokenCost", "estimate", "job_nodes", "root_volume_per_hour", "token_cost"]

EXIT_OK, EXIT_UNUSABLE = 0, 2
BILLION = 1e9


@dataclass(frozen=True)
class ImagePull:
    """What one job start moves to pull the Ray image, and what it costs, before and after the
    pull-through cache. Scale-from-zero: every GPU node the job adds starts without the image and
    pulls all of it (system nodes keep theirs between jobs)."""

    image: str
    image_gb: float
    nodes: int  # GPU nodes pulling per job start
    cached: bool  # pulled through the environment's ECR pull-through cache
    # Anonymously from ECR Public through the NAT gateway (no cache).
    nat_per_job: float
    quota_gb_per_month: float
    # Through the cache: layers from S3 through the gateway endpoint (no data charge), manifests and
    # API calls through the ECR interface endpoints (a few kB per pull, priced as nothing here).
    cached_per_job: float
    cache_storage_per_month: float

    @property
    def gb_per_job(self) -> float:
        return self.image_gb * self.nodes

    @property
    def job_starts_within_quota(self) -> int | None:
        """Job starts a month before anonymous pulls exhaust ECR Public's quota (None: no pull)."""
        return int(self.quota_gb_per_month // self.gb_per_job) if self.gb_per_job else None


def image_pull(settings: Settings, prices: RegionPrices | None = None) -> ImagePull:
    from config.settings.workload import IMAGE

    prices = prices or prices_for(settings.region)
    nodes = max(0, settings.job.nodes - settings.gpu_nodes.min_size)
    # The recorded size belongs to config/image.toml's image; another image is priced the same
    # until its own size is recorded (docs/images.md).
    size = IMAGE.compressed_size_gb
    gb = size * nodes
    return ImagePull(
        image=settings.workload.image,
        image_gb=size,
        nodes=nodes,
        cached=settings.image_source.upstream_of(settings.workload.image) is not None,
        nat_per_job=gb * prices.nat_gateway_per_gb,
        quota_gb_per_month=prices.ecr_public_anonymous_gb_per_month,
        cached_per_job=0.0,
        cache_storage_per_month=size * prices.ecr_storage_per_gb_month,
    )


@dataclass(frozen=True)
class TokenCost:
    tokens_per_s: float
    nodes: int
    per_hour: float
    per_billion_tokens: float
    # End to end: every trained token over the run's wall time (start-up, checkpoints included).
    end_to_end_per_billion_tokens: float | None


class SummaryError(ValueError):
    """A summary.json that cannot be priced; the message names the file and the field."""


def token_cost(
    settings: Settings,
    summary: dict[str, Any],
    *,
    source: str = "summary.json",
    est: CostEstimate | None = None,
) -> TokenCost:
    """$ per billion tokens of a run: the running cost of the nodes it ran on, over its throughput.

    The nodes are the run's own (`nodes` in the summary) when it has them, else the job's."""
    tps = summary.get("tokens_per_s")
    if not isinstance(tps, int | float) or tps <= 0:
        raise SummaryError(f"{source}: tokens_per_s is {tps!r}; need the run's measured tokens/s (> 0)")
    device = summary.get("device")
    if isinstance(device, str) and device.lower() == "cpu":
        raise SummaryError(
            f"{source}: a CPU run (device 'cpu', e.g. make train-local): its tokens/s says nothing about "
            f"{settings.gpu_nodes.instance_type} nodes; price the summary.json of a run on the cluster"
        )
    nodes = summary.get("nodes") or job_nodes(settings)
    if not isinstance(nodes, int) or nodes < 1:
        raise SummaryError(f"{source}: nodes is {nodes!r}; need a positive node count")
    per_hour = (est or estimate(settings)).running_with(nodes)
    per_billion = per_hour / (tps * 3600) * BILLION
    end_to_end = None
    wall, steps = summary.get("wall_time_s"), summary.get("steps")
    options = summary.get("options") or {}
    batch, seq = summary.get("global_batch_size"), options.get("seq_len")
    if all(isinstance(v, int | float) and v > 0 for v in (wall, steps, batch, seq)):
        tokens = steps * batch * seq  # type: ignore[operator]
        end_to_end = per_hour * wall / 3600 / tokens * BILLION  # type: ignore[operator]
    return TokenCost(
        tokens_per_s=float(tps),
        nodes=nodes,
        per_hour=per_hour,
        per_billion_tokens=per_billion,
        end_to_end_per_billion_tokens=end_to_end,
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "cost",
        help="idle and running cost per hour of an environment; $ per billion tokens of a run",
        description=(__doc__ or "").split("\n\n", 1)[0],
    )
    env_argument(parser)
    config_dir_argument(parser)
    parser.add_argument("--summary", type=Path, help="a run's summary.json: also print $ per billion tokens")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    parser.add_argument(
        "--live",
        action="store_true",
        help="instance rates from the AWS Price List API and the current Spot price (needs credentials; "
        "automatic for a region the pinned table lacks)",
    )
    parser.add_argument("--profile", help="AWS profile for --live (default: the usual credential chain)")
    parser.set_defaults(func=run)


def live_clients(profile: str | None, region: str) -> tuple[Any, Any]:
    """(pricing, ec2) clients; raises PriceError without usable credentials."""
    from raytrain.aws import AwsError, session
    from raytrain.pricing import PRICING_REGION

    try:
        sess = session(profile)
    except AwsError as exc:
        raise PriceError(str(exc)) from None
    if sess.get_credentials() is None:
        raise PriceError(
            "asking AWS for prices needs credentials (`aws sso login --profile NAME`, then --profile NAME)"
        )
    return sess.client("pricing", region_name=PRICING_REGION), sess.client("ec2", region_name=region)


def _prices(args: argparse.Namespace, settings: Settings) -> tuple[RegionPrices | None, float | None]:
    """(prices, Spot $/h): None, None for the pinned table."""
    return region_prices(settings, live=getattr(args, "live", False), profile=getattr(args, "profile", None))


def optional_prices(
    settings: Settings, *, live: bool, profile: str | None
) -> tuple[RegionPrices | None, float | None, str | None]:
    """For commands whose cost is one part among others (`raytrain plan`): the prices --live asks
    AWS for, else the pinned table's (None, None); with why AWS could not price them, instead of
    failing (the pinned table is used then, where it has the region)."""
    if not live:
        return None, None, None
    try:
        prices, spot = region_prices(settings, live=True, profile=profile)
    except PriceError as exc:
        return None, None, f"--live: {exc}"
    return prices, spot, None


def region_prices(
    settings: Settings, *, live: bool, profile: str | None
) -> tuple[RegionPrices | None, float | None]:
    """(prices, Spot $/h) from the AWS Price List API and Spot price history when `live` or when the
    pinned table lacks the region; (None, None) for the pinned table. PriceError says why not."""
    import datetime as dt

    import botocore.exceptions as bce

    from config.settings import CapacityType
    from raytrain.aws import credential_problem, permission_problem
    from raytrain.pricing import live_prices, spot_rate

    if not live and settings.region in PRICES:
        return None, None
    try:
        pricing, ec2 = live_clients(profile, settings.region)
    except PriceError:
        if not live:  # a region the table lacks, and no credentials to ask AWS: say both
            prices_for(settings.region)
        raise
    gpu = settings.gpu_nodes
    now = dt.datetime.now(dt.UTC)
    try:
        prices = live_prices(
            pricing, settings.region, {settings.system_nodes.instance_type, *gpu.types}, now.date()
        )
        spot = None
        if gpu.capacity_type is CapacityType.SPOT:
            # EKS may launch any of the group's types: the dearest Spot price, not to understate; a
            # type without a reported price leaves the group at its ceiling (the On-Demand rate).
            rates = [spot_rate(ec2, name, gpu.availability_zone, now) for name in gpu.types]
            spot = None if None in rates else max(r for r in rates if r is not None)
    except (bce.ClientError, bce.BotoCoreError) as exc:
        raise PriceError(
            credential_problem(exc) or permission_problem(exc) or f"AWS call failed: {exc}"
        ) from None
    return prices, spot


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from config.loader import SettingsError, load_settings

    console = Console(width=None if sys.stdout.isatty() else 120)
    try:
        settings = load_settings(args.env, getattr(args, "config_dir", None))
        prices, spot = _prices(args, settings)
        result = estimate(settings, prices, spot_per_hour=spot)
        tokens = None
        if args.summary is not None:
            tokens = token_cost(settings, _read_summary(args.summary), source=str(args.summary), est=result)
    except (SettingsError, PriceError, SummaryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE

    pull = image_pull(settings, prices)
    figures = interruption_figures(settings, result)
    if args.json:
        out = result.as_dict()
        out["interruptions"] = figures
        out["image_pull"] = {**asdict(pull), "gb_per_job": pull.gb_per_job,
                             "job_starts_within_quota": pull.job_starts_within_quota}  # fmt: skip
        if tokens is not None:
            out["tokens"] = asdict(tokens)
        print(json.dumps(out, indent=2))
        return EXIT_OK

    table = Table(title=f"{settings.name}: cost in {settings.region} (prices as of {result.prices_as_of})")
    for column in ("", "item", "quantity", "$/h"):
        table.add_column(column, justify="right" if column == "$/h" else "left")
    for line in result.idle:
        table.add_row("idle", line.item, line.quantity, f"{line.per_hour:.4f}")
    table.add_row("", "[bold]idle total[/]", "", f"[bold]{result.idle_per_hour:.4f}[/]")
    for line in result.job:
        table.add_row("job", line.item, line.quantity, f"{line.per_hour:.4f}")
    table.add_row(
        "",
        f"[bold]running total ({result.job_nodes} GPU nodes)[/]",
        "",
        f"[bold]{result.running_per_hour:.4f}[/]",
    )
    console.print(table)
    if result.job_nodes > result.gpu_min_nodes:
        console.print(
            f"after each job: its GPU nodes until the autoscaler removes them (at most "
            f"{result.after_job_minutes} min) = [bold]${result.after_job:.2f} per job[/]"
        )
    team = settings.deploy_team
    borrow = (
        "any idle node" if team.borrowing_limit_nodes is None else f"{team.borrowing_limit_nodes} node(s)"
    )
    console.print(
        f"queue: the job lands in team {team.name}'s queue (quota {team.gpu_nodes} of "
        f"{settings.gpu_nodes.max_size} GPU nodes, may borrow {borrow}); "
        f"{len(settings.team_list)} team(s) share the GPU group",
        highlight=False,
    )
    for note in result.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    _print_interruptions(console, settings, figures)
    _print_image_pull(console, pull)
    if tokens is not None:
        console.print(
            f"{args.summary}: {tokens.tokens_per_s:,.0f} tokens/s on {tokens.nodes} node(s) at "
            f"${tokens.per_hour:.2f}/h = [bold]${tokens.per_billion_tokens:,.2f} per billion tokens[/] "
            "(steady state)"
        )
        if tokens.end_to_end_per_billion_tokens is not None:
            console.print(
                "  end to end over the run's wall time: "
                f"${tokens.end_to_end_per_billion_tokens:,.2f} per billion tokens"
            )
    return EXIT_OK


def interruption_figures(settings: Settings, est: CostEstimate) -> dict[str, Any]:
    """What `raytrain plan` prints of the job's checkpoints and interruptions (raytrain/interruptions.py),
    at the step the step-time model predicts; `{"problem": ...}` where it cannot predict one."""
    from config.step_prediction import predict
    from raytrain.interruptions import interruptions

    try:
        step_s = predict(settings).step_s
    except (ValueError, LookupError) as exc:
        return {"problem": f"not predicted: {exc}"}
    nodes = job_nodes(settings)
    return interruptions(settings, step_s, est.running_with(nodes), est.running_on_demand_with(nodes))


def _print_interruptions(console: Any, settings: Settings, figures: dict[str, Any]) -> None:
    from config.settings import CapacityType
    from raytrain.interruptions import lines

    if "problem" in figures:
        console.print(f"interruptions: {figures['problem']}", markup=False, highlight=False)
        return
    spot = settings.gpu_nodes.capacity_type is CapacityType.SPOT
    for line in lines(figures, spot):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _print_image_pull(console: Any, pull: ImagePull) -> None:
    console.print(
        f"each job start: {pull.nodes} GPU node(s) pull the {pull.image_gb:g} GB image = "
        f"{pull.gb_per_job:g} GB"
    )
    quota = pull.job_starts_within_quota
    within = f", {quota} job starts a month within ECR Public's anonymous quota" if quota is not None else ""
    console.print(
        f"  without the pull-through cache: NAT data processing ${pull.nat_per_job:.2f} per job{within}"
    )
    console.print(
        f"  through the cache: ${pull.cached_per_job:.2f} per job (layers from S3 through the gateway "
        f"endpoint) + ${pull.cache_storage_per_month:.2f} a month for the cached image"
        + ("" if pull.cached else " [bold](cache off or image not cached: the first line applies)[/]")
    )


def _read_summary(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SummaryError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SummaryError(f"{path}: not a readable JSON summary ({exc})") from None
    if not isinstance(data, dict):
        raise SummaryError(f"{path}: not a run summary (expected a JSON object)")
    return data

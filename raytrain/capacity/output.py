"""The plan as a table, with a reason per zone and the quota-increase command when quota is short."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from raytrain.capacity.plan import Need, Plan


def render(plan: Plan, need: Need, console: Console) -> None:
    table = Table(
        title=f"Capacity for {need.count} x {need.instance.name} "
        f"({need.vcpus} vCPUs; min_size {need.min_count} = {need.min_vcpus})",
        title_justify="left",
    )
    for column in ("#", "region", "zone", "zone id", "offered", "quota free", "spot", "probe"):
        table.add_column(column, no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("reason")
    for i, r in enumerate(plan.zones, 1):
        table.add_row(
            str(i),
            r.region,
            r.zone + (" *" if r.current else ""),
            r.zone_id,
            "-" if r.zone == "-" else ("yes" if r.offered else "no"),
            f"{r.quota.free}/{int(r.quota.limit)}" if r.quota else "-",
            str(r.score) if r.score is not None else "-",
            (r.probe.kind if r.probe else "-"),
            "[green]fits[/green]" if r.fits else "[red]no[/red]",
            r.reason,
        )
    console.print(table)
    console.print("* = the environment's GPU zone today")
    for note in plan.notes:
        console.print(f"note: {note}")
    if plan.quota_requests:
        console.print("\nQuota short; request the increase (vCPUs = in use + needed):")
        for command in plan.quota_requests.values():
            console.print(f"  {command}", soft_wrap=True)
    best = plan.best
    if best:
        console.print(f"\nBest: {best.region} / {best.zone} ({best.zone_id}): {best.reason}")
    else:
        console.print("\nNo zone fits.")

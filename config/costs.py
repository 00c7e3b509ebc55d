"""The hourly cost estimate of an environment, from its settings and the pinned prices beside it
(config/prices.py): used by `make synth`'s summary and by `raytrain cost`, which prints it.

Idle: what runs between jobs (EKS control plane, system nodes and their root volumes, NAT
gateways, interface endpoints, and the GPU group at its minimum size). Running: idle plus the GPU
nodes of one job (`job.nodes`) and their root volumes. Three facts the infrastructure code
provisions with (root volume throughput, the interface endpoints, the autoscaler's scale-down
delay) are written once in config/provisioned.py, which both read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from config.prices import (
    HOURS_PER_MONTH,
    PRICES_AS_OF,
    RegionPrices,
    instance_per_hour,
    prices_for,
)
from config.provisioned import INTERFACE_ENDPOINTS, ROOT_THROUGHPUT_MIBPS, empty_gpu_node_minutes
from config.settings import CapacityType, Settings


@dataclass(frozen=True)
class Line:
    item: str
    quantity: str
    per_hour: float


@dataclass(frozen=True)
class CostEstimate:
    env: str
    region: str
    prices_as_of: str
    idle: list[Line]
    job: list[Line]
    job_nodes: int
    # One GPU node with its root volume, and how many the group keeps at idle (its minimum).
    gpu_node_per_hour: float
    gpu_min_nodes: int
    # At most how long the job's added GPU nodes stay after it ends (autoscaler scale-down).
    after_job_minutes: int
    # How the GPU instance-hours are priced: "on-demand", "spot" (a measured Spot price),
    # "spot-ceiling" (the On-Demand rate: Spot's default maximum price) or "capacity-block" (paid
    # upfront with the block: no instance-hour charge here).
    gpu_pricing: str = "on-demand"
    # One GPU node with its root volume at the On-Demand rate: what Spot is compared with.
    gpu_node_on_demand_per_hour: float = 0.0
    # What these totals leave out or only bound, in a sentence each.
    notes: tuple[str, ...] = ()

    @property
    def idle_per_hour(self) -> float:
        return sum(line.per_hour for line in self.idle)

    @property
    def running_per_hour(self) -> float:
        return self.idle_per_hour + sum(line.per_hour for line in self.job)

    def running_with(self, nodes: int) -> float:
        """Running cost with `nodes` GPU nodes up (those kept at idle count once)."""
        return self.idle_per_hour + max(0, nodes - self.gpu_min_nodes) * self.gpu_node_per_hour

    def running_on_demand_with(self, nodes: int) -> float:
        """running_with(nodes), every GPU node (the group's minimum too) at the On-Demand rate."""
        on_demand = self.gpu_node_on_demand_per_hour or self.gpu_node_per_hour
        return self.running_with(nodes) + max(nodes, self.gpu_min_nodes) * (
            on_demand - self.gpu_node_per_hour
        )

    @property
    def after_job(self) -> float:
        """$ per job for the GPU nodes the job added, from its end until the autoscaler removes them."""
        added = max(0, self.job_nodes - self.gpu_min_nodes)
        return added * self.gpu_node_per_hour * self.after_job_minutes / 60

    def as_dict(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "region": self.region,
            "prices_as_of": self.prices_as_of,
            "idle": [asdict(line) for line in self.idle],
            "job": [asdict(line) for line in self.job],
            "job_nodes": self.job_nodes,
            "gpu_node_per_hour": self.gpu_node_per_hour,
            "idle_per_hour": self.idle_per_hour,
            "running_per_hour": self.running_per_hour,
            "after_job_minutes": self.after_job_minutes,
            "after_job": self.after_job,
            "gpu_pricing": self.gpu_pricing,
            "gpu_node_on_demand_per_hour": self.gpu_node_on_demand_per_hour,
            "notes": list(self.notes),
        }


def root_volume_per_hour(prices: RegionPrices, size_gib: int, throughput_mibps: int) -> float:
    """One gp3 root volume: storage plus provisioned throughput above the included baseline."""
    extra = max(0, throughput_mibps - prices.gp3_included_mibps)
    month = size_gib * prices.gp3_per_gib_month + extra * prices.gp3_per_mibps_month
    return month / HOURS_PER_MONTH


def job_nodes(settings: Settings) -> int:
    """GPU nodes one job's Ray cluster runs on (one worker pod per node)."""
    return settings.job.nodes


def gpu_on_demand_rate(settings: Settings, prices: RegionPrices) -> float:
    """On-Demand $/h of one GPU node: of a group of several types (Spot, gpu_nodes.instance_types) the
    dearest, since EKS may launch any of them and an estimate should not understate."""
    return max(instance_per_hour(prices, name) for name in settings.gpu_nodes.types)


def gpu_types_label(settings: Settings) -> str:
    """The GPU group's types as the estimate's lines name them."""
    types = settings.gpu_nodes.types
    return types[0] if len(types) == 1 else f"{' or '.join(types)}, priced at the dearest"


def gpu_instance_rate(
    settings: Settings, prices: RegionPrices, spot_per_hour: float | None = None
) -> tuple[float, str, list[str]]:
    """$/h of one GPU node's instance, how it is priced, and what that leaves out.

    - On-Demand: the table's rate. A targeted On-Demand Capacity Reservation is billed at that rate
      for every instance it holds, used or not (EC2 User Guide, "Capacity Reservation pricing and
      billing"): not in these totals, since its size is the reservation's.
    - Spot: a measured price when given (`raytrain cost --live`: the dearest of the group's types);
      otherwise the On-Demand rate (the dearest type's), the most a Spot instance is charged with the
      default maximum price (EC2 User Guide, "Spot Instance pricing history" / "maximum price": the
      default is the On-Demand price).
    - Capacity Block: paid upfront when the block is bought; its instances add no instance-hour
      charge (EC2 User Guide, "Capacity Blocks for ML", pricing and billing).
    """
    gpu = settings.gpu_nodes
    on_demand = gpu_on_demand_rate(settings, prices)
    if gpu.capacity_type is CapacityType.CAPACITY_BLOCK:
        return (
            0.0,
            "capacity-block",
            [
                f"GPU instance-hours are not in these totals: Capacity Block {gpu.capacity_reservation_id} "
                "was paid upfront when it was bought, for its whole duration, used or not "
                f"(On-Demand would be ${on_demand:.4f}/h per node)"
            ],
        )
    if gpu.capacity_type is CapacityType.SPOT:
        if spot_per_hour is not None:
            return (
                spot_per_hour,
                "spot",
                [
                    f"GPU nodes at the Spot price seen now in {gpu.availability_zone} "
                    f"(${spot_per_hour:.4f}/h; On-Demand ${on_demand:.4f}/h); it moves, and a Spot node "
                    "can be reclaimed mid-job"
                ],
            )
        return (
            on_demand,
            "spot-ceiling",
            [
                f"GPU nodes are Spot: priced here at the On-Demand rate (${on_demand:.4f}/h), the most Spot "
                "charges with the default maximum price; the real price is lower and moves "
                "(`raytrain cost --live` reads the current one)"
            ],
        )
    notes = []
    if gpu.capacity_reservation_id:
        notes.append(
            f"capacity reservation {gpu.capacity_reservation_id} is billed at ${on_demand:.4f}/h for every "
            "instance it holds, running or not, until it is cancelled; the totals count only running nodes"
        )
    return on_demand, "on-demand", notes


def estimate(
    settings: Settings, prices: RegionPrices | None = None, *, spot_per_hour: float | None = None
) -> CostEstimate:
    """`prices`: the region's (default: the pinned table, config/prices.py)."""
    prices = prices or prices_for(settings.region)
    system, gpu = settings.system_nodes, settings.gpu_nodes
    system_rate = instance_per_hour(prices, system.instance_type)
    gpu_rate, gpu_pricing, notes = gpu_instance_rate(settings, prices, spot_per_hour)
    system_root = root_volume_per_hour(prices, system.root_volume_gib, ROOT_THROUGHPUT_MIBPS)
    gpu_root = root_volume_per_hour(prices, gpu.root_volume_gib, ROOT_THROUGHPUT_MIBPS)
    azs = len(settings.vpc.availability_zones)
    endpoints = len(INTERFACE_ENDPOINTS)
    idle = [
        Line("EKS control plane", "1 cluster", prices.eks_cluster_per_hour),
        Line(
            f"system nodes ({system.instance_type})",
            f"{system.desired_size} × ${system_rate:.4f}",
            system.desired_size * system_rate,
        ),
        Line(
            "system root volumes (gp3)",
            f"{system.desired_size} × {system.root_volume_gib} GiB",
            system.desired_size * system_root,
        ),
        Line(
            "NAT gateways",
            f"{settings.vpc.nat_gateways} × ${prices.nat_gateway_per_hour:.3f}",
            settings.vpc.nat_gateways * prices.nat_gateway_per_hour,
        ),
        Line(
            "interface endpoints",
            f"{endpoints} × {azs} AZs × ${prices.interface_endpoint_per_az_hour:.3f}",
            endpoints * azs * prices.interface_endpoint_per_az_hour,
        ),
        Line(
            f"GPU nodes at minimum ({gpu_types_label(settings)})",
            f"{gpu.min_size} × ${gpu_rate:.4f}",
            gpu.min_size * (gpu_rate + gpu_root),
        ),
    ]
    nodes = job_nodes(settings)
    # Nodes the group keeps anyway (its minimum) serve the job too; only the rest are added.
    added = max(0, nodes - gpu.min_size)
    job = [
        Line(
            f"GPU nodes of the job ({gpu_types_label(settings)})",
            f"{added} × ${gpu_rate:.4f}",
            added * gpu_rate,
        ),
        Line("GPU root volumes (gp3)", f"{added} × {gpu.root_volume_gib} GiB", added * gpu_root),
    ]
    return CostEstimate(
        env=settings.name,
        region=settings.region,
        prices_as_of=prices.as_of or PRICES_AS_OF,
        idle=idle,
        job=job,
        job_nodes=nodes,
        gpu_node_per_hour=gpu_rate + gpu_root,
        gpu_min_nodes=gpu.min_size,
        after_job_minutes=empty_gpu_node_minutes(),
        gpu_pricing=gpu_pricing,
        gpu_node_on_demand_per_hour=gpu_on_demand_rate(settings, prices) + gpu_root,
        notes=(*prices.notes, *notes),
    )

"""Instance-type catalogue: the one place that says what each EC2 type offers.

Kubernetes (resource requests), Ray (num-gpus), EC2 (launch template network interfaces) and the
settings validation all read these numbers from here; nothing else re-types them.

Sources: the EC2 instance-type documentation (accelerated computing, network specifications,
EFA-supported types) and the VPC CNI max-pods table (ENIs of the default network card x (IPv4 per
ENI - 1) + 2, capped by EKS at 110 below 30 vCPU and 250 above); tests/test_catalogue_ec2.py checks
every type against EC2's own DescribeInstanceTypes data (the copy moto serves). Kubelet reservations
follow what the EKS AL2023 AMI (nodeadm) configures; see `Instance.allocatable_*`.
"""

from __future__ import annotations

from dataclasses import dataclass

from config.network import NodeAddresses

# Memory the kernel, firmware and the NVIDIA driver keep before kubelet sees "capacity". Kubelet's
# capacity is MemTotal, which on EC2 runs 3-6 % below the nominal size (more on GPU types, whose
# driver pins memory). A fixed fraction keeps pod sizing on the safe side of what the node reports.
KERNEL_MEMORY_FRACTION = 0.06
# AL2023 nodeadm: kube-reserved memory = 255 MiB + 11 MiB per pod; eviction-hard memory.available.
KUBE_RESERVED_MEMORY_BASE_MIB = 255
KUBE_RESERVED_MEMORY_PER_POD_MIB = 11
EVICTION_HARD_MEMORY_MIB = 100


# GPU memory a CUDA process can use, as torch reports it (cudaMemGetInfo's total, in the
# "GPU 0 has a total capacity of X GiB" of torch's out-of-memory message): below the nominal size,
# which counts memory the driver keeps (nvidia-smi shows 23,034 MiB on a "24 GB" L4). The memory
# plan (training/sizing/memory_plan.py) fits a job into this, not into gpu_memory_gib. Sources: torch
# OOM messages quoted in public issues from the named instance or GPU:
#   L4:   21.96 GiB (SageMaker ml.g6 endpoint and a Cloud Run L4, both quoting torch's message)
#   L40S: 44.42 GiB (stepfun-ai/Step-Video-T2V#8, 8 x L40S)
#   A100 40 GB: 39.50 GiB (TianheWu/CoSeR#10)
#   H100 80 GB: 79.18-79.25 GiB reported with different drivers; the lowest is used
#   H200 141 GB: 139.72-139.81 GiB in torch OOM messages from 8 x H200 hosts; the lowest is used
#   B200 180 GB: 178.35 GiB (torch OOM messages from 8 x B200 hosts; cudaDeviceProp's
#         totalGlobalMem printed as "Total Global Memory: 178.35" in pytorch/ao#4002)
#   A10G: no report found; taken as the L4's (the same 24 GB of GDDR6 with ECC), an assumption
GPU_MEMORY_CUDA_GIB: dict[str, float] = {
    "L4": 21.96,
    "A10G": 21.96,
    "L40S": 44.42,
    "A100": 39.50,
    "H100": 79.18,
    "H200": 139.72,
    "B200": 178.35,
}

# GPUs with FP8 tensor cores (compute capability >= 8.9: Ada and Hopper), which float8 training
# (job.float8, torchao) needs; A10G (Ampere, 8.6) and A100 (8.0) have none. NVIDIA's data sheets.
FP8_GPU_MODELS = frozenset({"L4", "L40S", "H100", "H200", "B200"})


@dataclass(frozen=True)
class Instance:
    name: str
    vcpus: int
    memory_gib: int
    gpus: int = 0
    gpu_model: str | None = None
    gpu_memory_gib: int = 0
    # Number of EFA interfaces the type supports (0 = no EFA). One per network card on the types
    # listed here; p5 has 32 cards and can carry 32 EFA interfaces. Every EFA type is in the AWS
    # EFA device plugin chart's instance allowlist (tests/test_addons.py checks the values file).
    efa_interfaces: int = 0
    network_cards: int = 1
    # EC2 accepts EFA-only interfaces (an EFA device without an ENA device: no IP address, no ENI
    # from the subnet) on this type's secondary network cards. Set only where AWS documents it;
    # elsewhere every interface is a full EFA (with ENA), which also works, at the cost of an IP
    # address per card. The VPC CNI handles EFA-only interfaces from v1.18.4 (terraform-aws-eks).
    efa_only: bool = False
    network_gbps: float = 0.0
    # How the GPUs of one node reach each other, and its bandwidth per direction in GB/s (the step-time
    # model's intra-node link, training/sizing/step_time.py). PCIe Gen4 x16: 32 GB/s per direction (L4, L40S,
    # A10G data sheets: "PCIe Gen4 x16, 64 GB/s" bidirectional); NVLink: H100 SXM and H200 900 GB/s,
    # A100 600 GB/s and B200 (fifth-generation NVLink) 1.8 TB/s bidirectional per GPU (NVIDIA's H100,
    # H200, A100 and HGX B200 data sheets), so 450 / 300 / 900 per direction.
    gpu_link: str = "PCIe"
    gpu_link_gbytes: float = 32.0
    max_pods: int = 110
    # ENIs on the default network card and IPv4 addresses per ENI, as the VPC CNI counts them
    # (config/network.py: amazon-vpc-cni-k8s pkg/vpc/vpc_ip_resource_limit.go, ENILimit/IPv4Limit).
    enis: int = 0
    ipv4_per_eni: int = 0
    # CPU architecture: every type here is x86_64, matching the node groups' AL2023 x86_64 AMI types.
    arch: str = "x86_64"

    @property
    def efa(self) -> bool:
        return self.efa_interfaces > 0

    @property
    def fp8(self) -> bool:
        return self.gpu_model in FP8_GPU_MODELS

    def efa_interface_layout(self) -> list[tuple[int, int, str]]:
        """(network card index, device index, interface type) of each EFA interface.

        Card 0 carries the primary interface (device 0), which must be an EFA with ENA: an EFA-only
        interface cannot be primary, and the node's IP (and the pods', through the VPC CNI) lives
        there. Each further card gets one interface: EFA-only at device index 0 where the type
        supports it (EC2 User Guide, "Maximize network bandwidth on Amazon EC2 instances with
        multiple network cards"; terraform-aws-eks `enable_efa_only` makes every interface outside
        `efa_indices = [0]` EFA-only likewise), else an EFA with ENA at device index 1.
        """
        layout = [(0, 0, "efa")] if self.efa_interfaces else []
        for card in range(1, self.efa_interfaces):
            layout.append((card, 0, "efa-only") if self.efa_only else (card, 1, "efa"))
        return layout

    def subnet_addresses(self) -> NodeAddresses:
        """What one node of this type takes from its subnet with the VPC CNI's defaults."""
        other_cards = sum(1 for card, _, kind in self.efa_interface_layout() if card > 0 and kind == "efa")
        return NodeAddresses(self.enis, self.ipv4_per_eni, self.max_pods, other_cards)

    @property
    def gpu_memory_cuda_gib(self) -> float:
        """Memory of one GPU a training process can use (GPU_MEMORY_CUDA_GIB); 0 without GPUs."""
        return GPU_MEMORY_CUDA_GIB[self.gpu_model] if self.gpu_model else 0.0

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    def kube_reserved_cpu_millis(self) -> int:
        """CPU kubelet keeps for itself (the GKE/EKS formula nodeadm uses)."""
        millis = 0.0
        for core in range(self.vcpus):
            if core == 0:
                millis += 60
            elif core == 1:
                millis += 10
            elif core < 4:
                millis += 5
            else:
                millis += 2.5
        return int(millis + 0.999)

    def allocatable_cpu_millis(self) -> int:
        return self.vcpus * 1000 - self.kube_reserved_cpu_millis()

    def allocatable_memory_mib(self) -> int:
        """Memory Kubernetes can hand to pods: MemTotal minus kube-reserved and eviction-hard."""
        mem_total = int(self.memory_gib * 1024 * (1 - KERNEL_MEMORY_FRACTION))
        reserved = KUBE_RESERVED_MEMORY_BASE_MIB + KUBE_RESERVED_MEMORY_PER_POD_MIB * self.max_pods
        return mem_total - reserved - EVICTION_HARD_MEMORY_MIB


_TYPES = [
    # CPU types for the system node group.
    Instance("m7i.large", vcpus=2, memory_gib=8, network_gbps=12.5, max_pods=29, enis=3, ipv4_per_eni=10),
    Instance("m7i.xlarge", vcpus=4, memory_gib=16, network_gbps=12.5, max_pods=58, enis=4, ipv4_per_eni=15),
    Instance("m7i.2xlarge", vcpus=8, memory_gib=32, network_gbps=12.5, max_pods=58, enis=4, ipv4_per_eni=15),
    Instance(
        "m7i.4xlarge", vcpus=16, memory_gib=64, network_gbps=12.5, max_pods=110, enis=8, ipv4_per_eni=30
    ),
    # GPU types without EFA (single-node experiments; rejected when EFA is on).
    Instance(
        "g6.xlarge",
        vcpus=4,
        memory_gib=16,
        gpus=1,
        gpu_model="L4",
        gpu_memory_gib=24,
        network_gbps=10,
        max_pods=58,
        enis=4,
        ipv4_per_eni=15,
    ),
    # EFA GPU types.
    Instance(
        "g5.12xlarge",
        vcpus=48,
        memory_gib=192,
        gpus=4,
        gpu_model="A10G",
        gpu_memory_gib=24,
        efa_interfaces=1,
        network_gbps=40,
        max_pods=250,
        enis=15,
        ipv4_per_eni=50,
    ),
    Instance(
        "g6.12xlarge",
        vcpus=48,
        memory_gib=192,
        gpus=4,
        gpu_model="L4",
        gpu_memory_gib=24,
        efa_interfaces=1,
        network_gbps=40,
        max_pods=234,
        enis=8,
        ipv4_per_eni=30,
    ),
    Instance(
        "g6.48xlarge",
        vcpus=192,
        memory_gib=768,
        gpus=8,
        gpu_model="L4",
        gpu_memory_gib=24,
        efa_interfaces=1,
        network_gbps=100,
        max_pods=250,
        enis=15,
        ipv4_per_eni=50,
    ),
    Instance(
        "g6e.12xlarge",
        vcpus=48,
        memory_gib=384,
        gpus=4,
        gpu_model="L40S",
        gpu_memory_gib=48,
        efa_interfaces=1,
        network_gbps=100,
        max_pods=250,
        enis=10,
        ipv4_per_eni=30,
    ),
    Instance(
        "g6e.24xlarge",
        vcpus=96,
        memory_gib=768,
        gpus=4,
        gpu_model="L40S",
        gpu_memory_gib=48,
        efa_interfaces=2,
        network_cards=2,
        network_gbps=200,
        max_pods=250,
        enis=10,
        ipv4_per_eni=50,
    ),
    Instance(
        "g6e.48xlarge",
        vcpus=192,
        memory_gib=1536,
        gpus=8,
        gpu_model="L40S",
        gpu_memory_gib=48,
        efa_interfaces=4,
        network_cards=4,
        network_gbps=400,
        max_pods=250,
        enis=10,
        ipv4_per_eni=50,
    ),
    Instance(
        "g5.48xlarge",
        vcpus=192,
        memory_gib=768,
        gpus=8,
        gpu_model="A10G",
        gpu_memory_gib=24,
        efa_interfaces=1,
        network_gbps=100,
        max_pods=250,
        enis=7,
        ipv4_per_eni=50,
    ),
    Instance(
        "p4d.24xlarge",
        vcpus=96,
        memory_gib=1152,
        gpus=8,
        gpu_model="A100",
        gpu_memory_gib=40,
        gpu_link="NVLink",
        gpu_link_gbytes=300.0,
        efa_interfaces=4,
        network_cards=4,
        network_gbps=400,
        max_pods=250,
        enis=15,
        ipv4_per_eni=50,
    ),
    Instance(
        "p5.48xlarge",
        vcpus=192,
        memory_gib=2048,
        gpus=8,
        gpu_model="H100",
        gpu_memory_gib=80,
        gpu_link="NVLink",
        gpu_link_gbytes=450.0,
        efa_interfaces=32,
        network_cards=32,
        # EC2's P5 EFA configuration: card 0 EFA (with ENA), cards 1-31 EFA-only.
        efa_only=True,
        network_gbps=3200,
        max_pods=100,
        enis=2,
        ipv4_per_eni=50,
    ),
    # H200 and B200 (p5e, p5en, p6-b200): EC2 accelerated-computing specifications (8 x H200 141 GB,
    # 8 x B200 180 GB HBM3e, 192 vCPUs, 2 TiB, 3,200 Gbps of EFA: 32 cards on p5e, 16 EFAv3 cards on
    # p5en, 8 x 400 Gbps EFAv4 cards on p6-b200); tests/test_catalogue_ec2.py checks each against
    # DescribeInstanceTypes. Every secondary card takes an EFA-only interface (its InterfaceTypes).
    Instance(
        "p5e.48xlarge",
        vcpus=192,
        memory_gib=2048,
        gpus=8,
        gpu_model="H200",
        gpu_memory_gib=141,
        gpu_link="NVLink",
        gpu_link_gbytes=450.0,
        efa_interfaces=32,
        network_cards=32,
        efa_only=True,
        network_gbps=3200,
        max_pods=100,
        enis=2,
        ipv4_per_eni=50,
    ),
    Instance(
        "p5en.48xlarge",
        vcpus=192,
        memory_gib=2048,
        gpus=8,
        gpu_model="H200",
        gpu_memory_gib=141,
        gpu_link="NVLink",
        gpu_link_gbytes=450.0,
        efa_interfaces=16,
        network_cards=16,
        efa_only=True,
        network_gbps=3200,
        max_pods=198,
        enis=4,
        ipv4_per_eni=50,
    ),
    Instance(
        "p6-b200.48xlarge",
        vcpus=192,
        memory_gib=2048,
        gpus=8,
        gpu_model="B200",
        gpu_memory_gib=180,
        gpu_link="NVLink",
        gpu_link_gbytes=900.0,
        efa_interfaces=8,
        network_cards=8,
        efa_only=True,
        network_gbps=3200,
        max_pods=198,
        enis=4,
        ipv4_per_eni=50,
    ),
]

CATALOGUE: dict[str, Instance] = {t.name: t for t in _TYPES}

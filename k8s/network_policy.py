"""NetworkPolicies of the Ray namespace: closed by default, then only what the Ray pods need."""

from __future__ import annotations

import ipaddress

from cdk8s_plus_27 import k8s as kube
from constructs import Construct

from config.names import KUBERAY_NAMESPACE, PART_OF, PART_OF_LABEL
from config.settings import Settings
from k8s.cluster import DASHBOARD_PORT
from k8s.pods import COMPONENT, HEAD, SUBMITTER, WORKER

# EKS Pod Identity agent (a DaemonSet on every node): the Ray pods get their AWS credentials here.
POD_IDENTITY_AGENT_CIDR = "169.254.170.23/32"
# Never reached over the HTTPS egress rule: private (VPC, peered networks) and link-local (IMDS).
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16")


def _select(*components: str) -> kube.LabelSelector:
    return kube.LabelSelector(
        match_labels={PART_OF_LABEL: PART_OF},
        match_expressions=[
            kube.LabelSelectorRequirement(key=COMPONENT, operator="In", values=list(components))
        ],
    )


def _tcp(*ports: int) -> list[kube.NetworkPolicyPort]:
    return [kube.NetworkPolicyPort(port=kube.IntOrString.from_number(p), protocol="TCP") for p in ports]


def network_policies(chart: Construct, settings: Settings) -> None:
    """Default-deny for the Ray namespace, then what the Ray pods, the job submitter and the KubeRay
    operator need."""
    ns = settings.workload.namespace
    ray_nodes = _select(HEAD, WORKER)

    def policy(name: str, spec: kube.NetworkPolicySpec) -> None:
        kube.KubeNetworkPolicy(chart, name, metadata=kube.ObjectMeta(name=name, namespace=ns), spec=spec)

    # Everything in the namespace starts closed, both ways; the policies below add what is needed.
    policy(
        "default-deny",
        kube.NetworkPolicySpec(pod_selector=kube.LabelSelector(), policy_types=["Ingress", "Egress"]),
    )
    policy(
        "allow-dns",
        kube.NetworkPolicySpec(
            pod_selector=kube.LabelSelector(),
            policy_types=["Egress"],
            egress=[
                kube.NetworkPolicyEgressRule(
                    to=[
                        kube.NetworkPolicyPeer(
                            namespace_selector=kube.LabelSelector(
                                match_labels={"kubernetes.io/metadata.name": "kube-system"}
                            ),
                            pod_selector=kube.LabelSelector(match_labels={"k8s-app": "kube-dns"}),
                        )
                    ],
                    ports=[
                        kube.NetworkPolicyPort(port=kube.IntOrString.from_number(53), protocol=proto)
                        for proto in ("UDP", "TCP")
                    ],
                )
            ],
        ),
    )
    # Ray pods talk to each other on any port: GCS, raylets, object manager, worker ports and
    # NCCL's TCP bootstrap all use ranges. (EFA traffic bypasses the IP stack altogether.)
    # Out of the cluster they get HTTPS only: S3 (code asset, checkpoints, data) through the S3
    # gateway endpoint, and the Hugging Face hub through the NAT gateway when job.model is a hub id.
    # Nothing is installed at job start (no package index). The gateway endpoint routes S3's public
    # addresses by a prefix list, which a NetworkPolicy cannot name: with workload.s3_cidrs (that
    # list's CIDRs) and a model from S3 or a path, HTTPS is limited to them; otherwise it goes to
    # public addresses, private ranges excepted so a pod cannot reach node ports, databases or
    # peered networks over 443. Image pulls are the kubelet's, not the pod's: no rule here.
    https_to = _https_peers(settings)
    policy(
        "ray-nodes",
        kube.NetworkPolicySpec(
            pod_selector=ray_nodes,
            policy_types=["Ingress", "Egress"],
            ingress=[kube.NetworkPolicyIngressRule(from_=[kube.NetworkPolicyPeer(pod_selector=ray_nodes)])],
            egress=[
                kube.NetworkPolicyEgressRule(to=[kube.NetworkPolicyPeer(pod_selector=ray_nodes)]),
                kube.NetworkPolicyEgressRule(to=https_to, ports=_tcp(443)),
                # AWS credentials for the service account (EKS Pod Identity agent on the node).
                kube.NetworkPolicyEgressRule(
                    to=[kube.NetworkPolicyPeer(ip_block=kube.IpBlock(cidr=POD_IDENTITY_AGENT_CIDR))],
                    ports=_tcp(80),
                ),
            ],
        ),
    )
    # Of the head's ports, only the job server is reachable from outside the Ray pods: by the
    # job submitter and the KubeRay operator (job status; its pods run in KUBERAY_NAMESPACE, where
    # the cluster stack installs it). GCS and the client port stay internal.
    policy(
        "ray-head-job-server",
        kube.NetworkPolicySpec(
            pod_selector=_select(HEAD),
            policy_types=["Ingress"],
            ingress=[
                kube.NetworkPolicyIngressRule(
                    from_=[
                        kube.NetworkPolicyPeer(pod_selector=_select(SUBMITTER)),
                        kube.NetworkPolicyPeer(
                            namespace_selector=kube.LabelSelector(
                                match_labels={"kubernetes.io/metadata.name": KUBERAY_NAMESPACE}
                            )
                        ),
                    ],
                    ports=_tcp(DASHBOARD_PORT),
                )
            ],
        ),
    )
    policy(
        "job-submitter",
        kube.NetworkPolicySpec(
            pod_selector=_select(SUBMITTER),
            policy_types=["Egress"],
            egress=[
                kube.NetworkPolicyEgressRule(
                    to=[kube.NetworkPolicyPeer(pod_selector=_select(HEAD))], ports=_tcp(DASHBOARD_PORT)
                )
            ],
        ),
    )


def _https_peers(settings: Settings) -> list[kube.NetworkPolicyPeer]:
    """Where the Ray pods' HTTPS may go: S3's ranges only, when they are given and no model hub is
    needed; else any public address."""
    if settings.workload.s3_cidrs and not settings.job.model_from_hub:
        return [kube.NetworkPolicyPeer(ip_block=kube.IpBlock(cidr=c)) for c in settings.workload.s3_cidrs]
    excluded = _private_ranges(settings.vpc.cidr)
    return [kube.NetworkPolicyPeer(ip_block=kube.IpBlock(cidr="0.0.0.0/0", except_=excluded))]


def _private_ranges(vpc_cidr: str) -> list[str]:
    """The HTTPS rule's exceptions: the private ranges, plus the VPC's CIDR when it lies outside
    them (a VPC may use e.g. 100.64.0.0/10)."""
    vpc = ipaddress.ip_network(vpc_cidr)
    ranges = [ipaddress.ip_network(r) for r in PRIVATE_RANGES]
    if not any(vpc.subnet_of(r) for r in ranges):  # type: ignore[arg-type]
        ranges.append(vpc)
    return [str(r) for r in ranges]

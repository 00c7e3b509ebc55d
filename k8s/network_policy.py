"""NetworkPolicies of the Ray namespace: closed by default, then only what the Ray pods need."""

from __future__ import annotations

import ipaddress

import cdk8s
from cdk8s_plus_27 import k8s as kube

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


def network_policies(chart: cdk8s.Chart, settings: Settings) -> None:
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
    # Out of the cluster they get HTTPS only, to public addresses: S3 (code, checkpoints, data),
    # Hugging Face, pip; through the NAT gateway or the S3 gateway endpoint. Private ranges are
    # excluded so a pod cannot reach node ports, databases or peered networks over 443; image
    # pulls are done by the kubelet, not the pod, and need no rule here.
    excluded = _private_ranges(settings.vpc.cidr)
    policy(
        "ray-nodes",
        kube.NetworkPolicySpec(
            pod_selector=ray_nodes,
            policy_types=["Ingress", "Egress"],
            ingress=[kube.NetworkPolicyIngressRule(from_=[kube.NetworkPolicyPeer(pod_selector=ray_nodes)])],
            egress=[
                kube.NetworkPolicyEgressRule(to=[kube.NetworkPolicyPeer(pod_selector=ray_nodes)]),
                kube.NetworkPolicyEgressRule(
                    to=[kube.NetworkPolicyPeer(ip_block=kube.IpBlock(cidr="0.0.0.0/0", except_=excluded))],
                    ports=_tcp(443),
                ),
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


def _private_ranges(vpc_cidr: str) -> list[str]:
    """The HTTPS rule's exceptions: the private ranges, plus the VPC's CIDR when it lies outside
    them (a VPC may use e.g. 100.64.0.0/10)."""
    vpc = ipaddress.ip_network(vpc_cidr)
    ranges = [ipaddress.ip_network(r) for r in PRIVATE_RANGES]
    if not any(vpc.subnet_of(r) for r in ranges):  # type: ignore[arg-type]
        ranges.append(vpc)
    return [str(r) for r in ranges]

"""Kubernetes side of the workload: the cdk8s chart (RayCluster, RayJob, namespace, access)."""

"""Kubernetes: manifests, names and tenancy objects for the `kubernetes` driver and KubeSpawner."""

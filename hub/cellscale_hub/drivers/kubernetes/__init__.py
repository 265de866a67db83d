"""The Kubernetes backend, one folder: the driver (`driver.KubernetesDriver`, named by the
entry point `cellscale_hub.drivers.kubernetes:KubernetesDriver`), the API watches it keeps
(`watch`), the manifests it renders (`manifests`) and what their status says (`status`),
the objects' names (`names`), the tenancy mirrored into Kueue objects (`tenancy`, also an
admin command), and the desks' user servers (`spawner`, a KubeSpawner)."""

from cellscale_hub.drivers.kubernetes.driver import KubernetesDriver

__all__ = ["KubernetesDriver"]

# JupyterHub whose user servers are pods on Kubernetes (KubeSpawner, with profiles per desk), each
# in its desk's namespace; everything else (desks, scopes, the control plane service) is the demo
# configuration's. The hub needs only the namespaced Role that the tenancy mirror renders in each
# desk's namespace (docs/kubernetes.md); it finds the API from its in-cluster ServiceAccount or
# $KUBECONFIG.
#
#   KUBECONFIG=... jupyterhub -f config/jupyterhub_kube_config.py
#
# CELLSCALE_KUBE_PROFILES: the profiles file (default config/kubernetes/profiles.yaml);
# CELLSCALE_KUBE_NAMESPACE_PREFIX: as the tenancy mirror's --prefix.
import os
from pathlib import Path

import yaml

here = Path(__file__).resolve().parent
load_subconfig(str(here / "jupyterhub_config.py"))  # noqa: F821

c = get_config()  # noqa: F821
profiles = Path(os.environ.get("CELLSCALE_KUBE_PROFILES", here / "kubernetes" / "profiles.yaml"))
c.JupyterHub.spawner_class = "cellscale_hub.drivers.kubernetes.spawner.DeskKubeSpawner"
c.DeskKubeSpawner.desk_profiles = yaml.safe_load(profiles.read_text())
c.DeskKubeSpawner.namespace_prefix = os.environ.get("CELLSCALE_KUBE_NAMESPACE_PREFIX", "")
c.DeskKubeSpawner.cmd = ["jupyterhub-singleuser"]  # the image's, not this machine's Python
c.DeskKubeSpawner.start_timeout = 600  # first pulls of a large image take minutes
c.DeskKubeSpawner.http_timeout = 120

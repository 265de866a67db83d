# The control plane's configuration when the hub runs it as a managed service.
# Class names are keys, as in JupyterHub. Environment variables override the demo defaults.
import os
from pathlib import Path

here = Path(__file__).resolve().parent
state = Path(os.environ.get("CELLSCALE_STATE_DIR", here.parent / "var"))

c = get_config()  # noqa: F821
c.ControlPlane.data_dir = str(state / "cellscale")
c.ControlPlane.tenants_file = os.environ.get("CELLSCALE_TENANTS", str(here / "tenants.yaml"))
if os.environ.get("CELLSCALE_DB_URL"):
    c.ControlPlane.db_url = os.environ["CELLSCALE_DB_URL"]  # e.g. postgresql+psycopg://cellscale@127.0.0.1/cellscale
c.ControlPlane.backends = {"local": "local"}
c.LocalDriver.gpus = int(os.environ.get("CELLSCALE_LOCAL_GPUS", "4"))
# the demo emulates a workstation: its 4 GPUs, 16 cores and 64 GiB are what admission divides
# (the machine's own may be fewer: the processes share what it has)
c.LocalDriver.cpus = int(os.environ.get("CELLSCALE_LOCAL_CPUS", "16"))
c.LocalDriver.memory_mb = int(os.environ.get("CELLSCALE_LOCAL_MEMORY_MB", str(64 * 1024)))

# A Slurm cluster (the dev cluster: `cellscale dev slurm up` prints its SLURM_CONF), used
# with `%%cluster --backend slurm` (its gpu partition) or `--backend slurm-cpu` (its cpu
# partition). Both partitions charge the same desk accounts, so each backend names the other
# (`shares_accounts_with`) and they mirror the same limits. Jobs run as the researcher's own
# Unix user and need a job root that every node and that user can reach.
if os.environ.get("CELLSCALE_SLURM_CONF"):
    c.ControlPlane.backends["slurm"] = {"driver": "slurm", "partition": "gpu", "shares_accounts_with": ["slurm-cpu"]}
    c.ControlPlane.backends["slurm-cpu"] = {"driver": "slurm", "partition": "cpu", "shares_accounts_with": ["slurm"]}
    c.SlurmDriver.slurm_conf = os.environ["CELLSCALE_SLURM_CONF"]
    c.SlurmDriver.master_addr = os.environ.get("CELLSCALE_SLURM_MASTER_ADDR", "127.0.0.1")
    c.ControlPlane.jobs_root = os.environ.get("CELLSCALE_JOBS_ROOT", str(state / "jobs"))
    # `--data`: each node's dataset cache (the dev cluster's emulated nodes share a disk: one
    # directory each); a waiting job's datasets are staged by a small job in the cpu partition
    dev_cache = Path(os.environ["CELLSCALE_SLURM_CONF"]).parent.parent / "data-cache" / "{node}"
    c.SlurmDriver.data_cache_root = os.environ.get("CELLSCALE_DATA_CACHE", str(dev_cache))
    c.ControlPlane.backends["slurm"]["stage_partition"] = os.environ.get("CELLSCALE_STAGE_PARTITION", "cpu")

# A Kubernetes cluster running Kueue, JobSet and KubeRay (docs/kubernetes.md), used with
# `%%cluster --backend k8s`: each attempt is a JobSet (a RayJob for --launcher ray) in the desk's
# namespace, admitted by Kueue through the desk's LocalQueue. Its pods mount the jobs root (a
# ReadWriteMany PersistentVolumeClaim, CELLSCALE_KUBE_JOBS_CLAIM) where the control plane has it.
# The dev apiserver (`python -m cellscale_hub.dev.kube up`) prints its kubeconfig.
if os.environ.get("CELLSCALE_KUBECONFIG"):
    c.ControlPlane.backends["k8s"] = {"driver": "kubernetes"}
    c.KubernetesDriver.kubeconfig = os.environ["CELLSCALE_KUBECONFIG"]
    c.KubernetesDriver.namespace_prefix = os.environ.get("CELLSCALE_KUBE_NAMESPACE_PREFIX", "")
    c.KubernetesDriver.image = os.environ.get("CELLSCALE_KUBE_IMAGE", "cellscale:latest")
    c.KubernetesDriver.jobs_claim = os.environ.get("CELLSCALE_KUBE_JOBS_CLAIM", "cellscale-jobs")
    c.ControlPlane.jobs_root = os.environ.get("CELLSCALE_JOBS_ROOT", str(state / "jobs"))

# Sites (`cellscale dev slurm up --sites`): a second datacenter, cluster dcb (its own
# slurmctld, its own SLURM_CONF), and dca's burst partition of cloud nodes, billed by the
# cloud (the dev topology's cloud SIMULATION serves its ledger). Their flavors name sites in
# tenants.yaml; `%%cluster --site auto` lets admission weigh them (docs/sites.md).
if os.environ.get("CELLSCALE_SLURM_CONF") and os.environ.get("CELLSCALE_SLURM_SITES"):
    # the dev topology: everything else follows from its state dir (<state>/etc/slurm.conf)
    from cellscale_hub.dev import cloud as dev_cloud
    from cellscale_hub.dev import slurm as dev_slurm

    topology = Path(os.environ["CELLSCALE_SLURM_CONF"]).parent.parent
    cloud = dev_cloud.load_config(topology)
    os.environ.setdefault("CELLSCALE_SLURM_DCB_CONF", str(dev_slurm.layout_for(topology).dcb_conf))
    os.environ.setdefault("CELLSCALE_CLOUD_LEDGER_URL", f"http://127.0.0.1:{int(cloud['port'])}/ledger")
    os.environ.setdefault("CELLSCALE_CLOUD_TOKEN_FILE", str(cloud["token_file"]))
if os.environ.get("CELLSCALE_SLURM_CONF") and os.environ.get("CELLSCALE_SLURM_DCB_CONF"):
    c.ControlPlane.backends["slurm-dcb"] = {
        "driver": "slurm",
        "partition": "gpu",
        "slurm_conf": os.environ["CELLSCALE_SLURM_DCB_CONF"],
    }
if os.environ.get("CELLSCALE_SLURM_CONF") and os.environ.get("CELLSCALE_CLOUD_LEDGER_URL"):
    c.ControlPlane.backends["slurm-burst"] = {
        "driver": "slurm",
        "partition": "burst",
        "stage_ahead": False,  # staging would power cloud nodes up (and bill them) before the job is admitted
        "shares_accounts_with": ["slurm", "slurm-cpu"],
        "cloud_ledger_url": os.environ["CELLSCALE_CLOUD_LEDGER_URL"],
        "cloud_ledger_token_file": os.environ.get("CELLSCALE_CLOUD_TOKEN_FILE", ""),
    }
    for partition in ("slurm", "slurm-cpu"):
        c.ControlPlane.backends[partition]["shares_accounts_with"].append("slurm-burst")

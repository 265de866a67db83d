# JupyterHub whose user servers run as Slurm jobs (batchspawner's SlurmSpawner), on the dev
# cluster from `cellscale dev slurm up` or a production cluster. Everything else (desks,
# scopes, the control plane service) is the demo configuration's.
#
#   SLURM_CONF=/tmp/cellscale-slurm/etc/slurm.conf jupyterhub -f config/jupyterhub_slurm_config.py
#
# Production: set CELLSCALE_SLURM_PARTITION, drop the dev-only `state_exechost_exp` (node
# names resolve there), and let the hub's account run sbatch as users with a sudoers rule
# (the default exec_prefix `sudo -E -u {username}`).
import os
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
load_subconfig(str(here / "jupyterhub_config.py"))  # noqa: F821

c = get_config()  # noqa: F821
bin_dir = Path(sys.executable).parent
c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
c.SlurmSpawner.exec_prefix = "runuser -u {username} --" if os.getuid() == 0 else "sudo -E -u {username}"
c.SlurmSpawner.batchspawner_singleuser_cmd = str(bin_dir / "batchspawner-singleuser")
c.SlurmSpawner.cmd = [str(bin_dir / "jupyterhub-singleuser")]
c.SlurmSpawner.args = []
c.SlurmSpawner.req_partition = os.environ.get("CELLSCALE_SLURM_PARTITION", "gpu")
c.SlurmSpawner.req_runtime = "8:00:00"
c.SlurmSpawner.req_srun = ""
c.SlurmSpawner.req_keepvars_extra = "SLURM_CONF"
c.SlurmSpawner.environment = {**c.Spawner.environment, "SLURM_CONF": os.environ.get("SLURM_CONF", "")}
if os.environ.get("CELLSCALE_SLURM_DEV", "1") == "1":
    c.SlurmSpawner.state_exechost_exp = "127.0.0.1"  # emulated nodes share this host
# the stock script asks for --get-user-env, which only root's sbatch may; the user's own
# environment is what keepvars carries
c.SlurmSpawner.batch_script = """#!/bin/bash
#SBATCH --output={{homedir}}/jupyterhub_slurmspawner_%j.log
#SBATCH --job-name=jupyterhub-{{username}}
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if gres %}#SBATCH --gres={{gres}}
{% endif %}
set -euo pipefail
trap 'echo SIGTERM received' TERM
{{cmd}}
"""
c.Spawner.http_timeout = 120
c.Spawner.start_timeout = 180

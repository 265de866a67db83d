#!/bin/bash
# cellscale: stage the datasets of job cs-0123456789ab (owner alice) onto node3, node4
#SBATCH --job-name=cellscale-stage-cs-0123456789ab
#SBATCH --account=desk-a
#SBATCH --partition=cpu
#SBATCH --nodelist=node3,node4
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --mem=1024M
#SBATCH --time=60
#SBATCH --chdir=/shared/cellscale/jobs/cs-0123456789ab
#SBATCH --output=/shared/cellscale/jobs/cs-0123456789ab/staging/slurm-%j.out
#SBATCH --no-requeue
#SBATCH --comment=cellscale-stage
exec srun --ntasks-per-node=1 /opt/venv/bin/python -m cellscale.runtime.stage /shared/cellscale/jobs/cs-0123456789ab

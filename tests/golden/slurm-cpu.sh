#!/bin/bash
# cellscale job cs-0123456789ab, attempt 2, owner alice: 1 node(s) x 0 GPU(s), 1 CPU(s), launcher torchrun
#SBATCH --job-name=cs-0123456789ab-a2
#SBATCH --account=desk-a
#SBATCH --partition=gpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --time=60
#SBATCH --chdir=/shared/cellscale/jobs/cs-0123456789ab
#SBATCH --output=/shared/cellscale/jobs/cs-0123456789ab/attempts/2/slurm-%j.out
#SBATCH --no-requeue
#SBATCH --comment=cellscale
exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task=1 /opt/venv/bin/python -m cellscale.runtime.supervisor /shared/cellscale/jobs/cs-0123456789ab 2

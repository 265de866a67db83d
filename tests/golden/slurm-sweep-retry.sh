#!/bin/bash
# cellscale sweep cs-0123456789ab, attempt 2, owner alice: array 4, 1 task(s) from task 0 of 125, 2 point(s) each, 1 GPU(s) and 4 CPU(s) per task
#SBATCH --job-name=cs-0123456789ab-a2-s4
#SBATCH --account=desk-a
#SBATCH --partition=gpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=4
#SBATCH --gres=gpu:1
#SBATCH --time=40
#SBATCH --array=0-0%1
#SBATCH --exclude=node3
#SBATCH --chdir=/shared/cellscale/jobs/cs-0123456789ab
#SBATCH --output=/shared/cellscale/jobs/cs-0123456789ab/arrays/slurm-%A_%a.out
#SBATCH --no-requeue
#SBATCH --comment=cellscale
exec /opt/venv/bin/python -m cellscale.runtime.sweep task /shared/cellscale/jobs/cs-0123456789ab 4

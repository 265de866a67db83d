#!/bin/bash
# cellscale sweep cs-0123456789ab, attempt 2, owner alice: array 2, 101 task(s) from task 101 of 250, 1 point(s) each, 1 GPU(s) and 4 CPU(s) per task
#SBATCH --job-name=cs-0123456789ab-a2-s2
#SBATCH --account=desk-a
#SBATCH --partition=gpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=4
#SBATCH --gres=gpu:1
#SBATCH --time=20
#SBATCH --array=0-100%3
#SBATCH --chdir=/shared/cellscale/jobs/cs-0123456789ab
#SBATCH --output=/shared/cellscale/jobs/cs-0123456789ab/arrays/slurm-%A_%a.out
#SBATCH --no-requeue
#SBATCH --comment=cellscale
exec /opt/venv/bin/python -m cellscale.runtime.sweep task /shared/cellscale/jobs/cs-0123456789ab 2

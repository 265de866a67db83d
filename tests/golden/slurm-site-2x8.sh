#!/bin/bash
# cellscale job cs-0123456789ab, attempt 2, owner alice: 2 node(s) x 8 GPU(s), 8 CPU(s), launcher torchrun
#SBATCH --job-name=cs-0123456789ab-a2
#SBATCH --account=desk-a
#SBATCH --partition=gpu
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --gres=gpu:8
#SBATCH --time=60
#SBATCH --exclude=node3,node7
#SBATCH --chdir=/shared/cellscale/jobs/cs-0123456789ab
#SBATCH --output=/shared/cellscale/jobs/cs-0123456789ab/attempts/2/slurm-%j.out
#SBATCH --no-requeue
#SBATCH --comment=cellscale
#SBATCH "--constraint=a100&nvlink"
#SBATCH --qos=normal
#SBATCH --mail-type=FAIL
#SBATCH --exclusive
module load cuda/12.4
export NCCL_DEBUG=WARN
exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task=8 /opt/venv/bin/python -m cellscale.runtime.supervisor /shared/cellscale/jobs/cs-0123456789ab 2

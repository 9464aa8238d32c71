#!/bin/bash
#SBATCH --job-name=podrun-resnet18_cifar10
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:10:00
#SBATCH --output=%x-%j.out
#SBATCH --error=%x-%j.err
#SBATCH --no-requeue
# plan: cluster local, recipe resnet18_cifar10, 3 host(s) x 2 cpu = 6 device(s)
# plan: 6 replica(s) x local batch 32 x GA 1 = global batch 192; 3 instance(s), 1 device(s) per replica
# submit: sbatch --parsable SCRIPT; podrun launch starts the instances over srun on the hosts of $SLURM_JOB_NODELIST

set -euo pipefail
# PYTHON -m podrun launch, but never a podrun/ from the working directory: the -c boot takes it off the import path
exec /opt/venv/bin/python3 -c 'import os, sys; sys.path[:1] == [""] and sys.path.pop(0); import runpy; runpy.run_module("podrun", run_name="__main__", alter_sys=True)' launch --transport srun --cluster local --nodes 3 --devices-per-host 2 --instances-per-host 1 --global-batch 192 --local-batch 32 --grad-accum 1 resnet18_cifar10 -- --epochs 1

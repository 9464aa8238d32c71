#!/bin/bash
#SBATCH --job-name=podrun-resnet50
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=112
#SBATCH --time=02:00:00
#SBATCH --partition=gpu
#SBATCH --account=proj01
#SBATCH --output=%x-%j.out
#SBATCH --error=%x-%j.err
#SBATCH --no-requeue
# plan: cluster dgx-h100, recipe resnet50, 4 host(s) x 8 gpu-h100 = 32 device(s)
# plan: 32 replica(s) x local batch 256 x GA 10 = global batch 81920; 4 instance(s), 1 device(s) per replica
# submit: sbatch --parsable SCRIPT; podrun launch starts the instances over srun on the hosts of $SLURM_JOB_NODELIST

set -euo pipefail
export NCCL_DEBUG=WARN
# PYTHON -m podrun launch, but never a podrun/ from the working directory: the -c boot takes it off the import path
exec /opt/venv/bin/python3 -c 'import os, sys; sys.path[:1] == [""] and sys.path.pop(0); import runpy; runpy.run_module("podrun", run_name="__main__", alter_sys=True)' launch --transport srun --cluster dgx-h100 --nodes 4 --devices-per-host 8 --instances-per-host 1 --global-batch 81920 --local-batch 256 --grad-accum 10 resnet50

#!/bin/bash
#SBATCH --job-name=podrun-efficientnet_b4
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=128
#SBATCH --time=24:00:00
#SBATCH --partition=pod64
#SBATCH --output=%x-%j.out
#SBATCH --error=%x-%j.err
#SBATCH --no-requeue
# plan: cluster ipu-pod64, recipe efficientnet_b4, 4 host(s) x 16 ipu-gc200 = 64 device(s)
# plan: 32 replica(s) x local batch 3 x GA 64 = global batch 6144; 4 instance(s), 2 device(s) per replica
# submit: sbatch --parsable SCRIPT; podrun launch starts the instances through its engine on the hosts of $SLURM_JOB_NODELIST

set -euo pipefail
# PYTHON -m podrun launch, but never a podrun/ from the working directory: the -c boot takes it off the import path
exec /opt/venv/bin/python3 -c 'import os, sys; sys.path[:1] == [""] and sys.path.pop(0); import runpy; runpy.run_module("podrun", run_name="__main__", alter_sys=True)' launch --cluster ipu-pod64 --nodes 4 --devices-per-host 16 --instances-per-host 1 --global-batch 6144 --local-batch 3 --grad-accum 64 --vipu-server-host vipu-ctrl --vipu-partition pod64-p1 efficientnet_b4 -- --data /localdata/imagenet

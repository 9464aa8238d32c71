#!/bin/bash
#PBS -N podrun-resnet50
#PBS -S /bin/bash
#PBS -l select=2:ncpus=40:ngpus=4:mpiprocs=1
#PBS -l place=scatter
#PBS -l walltime=01:00:00
#PBS -q gpu
#PBS -o logs/
#PBS -e logs/
#PBS -r n
# plan: cluster abci, recipe resnet50, 2 host(s) x 4 gpu-v100 = 8 device(s)
# plan: 8 replica(s) x local batch 128 x GA 80 = global batch 81920; 2 instance(s), 1 device(s) per replica
# submit: qsub SCRIPT; podrun launch reads the hosts from $PBS_NODEFILE

set -euo pipefail
cd "$PBS_O_WORKDIR"
# PYTHON -m podrun launch, but never a podrun/ from the working directory: the -c boot takes it off the import path
exec /opt/venv/bin/python3 -c 'import os, sys; sys.path[:1] == [""] and sys.path.pop(0); import runpy; runpy.run_module("podrun", run_name="__main__", alter_sys=True)' launch --transport mpirun --cluster abci --nodes 2 --devices-per-host 4 --instances-per-host 1 --global-batch 81920 --local-batch 128 --grad-accum 80 resnet50 -- --data /scratch/imagenet

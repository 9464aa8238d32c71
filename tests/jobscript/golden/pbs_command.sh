#!/bin/bash
#PBS -N podrun-command
#PBS -S /bin/bash
#PBS -l select=1:mpiprocs=1
#PBS -l place=scatter
#PBS -r n
# plan: cluster local, a command, 1 host(s) x 2 cpu = 2 device(s)
# plan: 2 replica(s) x local batch 1 x GA 1 = global batch 2; 1 instance(s), 1 device(s) per replica
# submit: qsub SCRIPT; podrun launch reads the hosts from $PBS_NODEFILE

set -euo pipefail
cd '/scratch/my run'
# PYTHON -m podrun launch, but never a podrun/ from the working directory: the -c boot takes it off the import path
exec /opt/venv/bin/python3 -c 'import os, sys; sys.path[:1] == [""] and sys.path.pop(0); import runpy; runpy.run_module("podrun", run_name="__main__", alter_sys=True)' launch --transport mpirun --nodes 1 --devices-per-host 2 --instances-per-host 1 -- python train.py --note 'it'"'"'s $(not) run'

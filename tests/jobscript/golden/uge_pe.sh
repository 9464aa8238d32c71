#!/bin/bash
#$ -N podrun-command
#$ -S /bin/bash
#$ -cwd
#$ -pe mpi 3
#$ -q all.q
# plan: cluster local, a command, 3 host(s) x 1 cpu = 3 device(s)
# plan: 3 replica(s) x local batch 1 x GA 1 = global batch 3; 3 instance(s), 1 device(s) per replica
# submit: qsub -terse SCRIPT; podrun launch reads the hosts from $PE_HOSTFILE / $SGE_JOB_HOSTLIST

set -euo pipefail
export NCCL_DEBUG=INFO
# PYTHON -m podrun launch, but never a podrun/ from the working directory: the -c boot takes it off the import path
exec /opt/venv/bin/python3 -c 'import os, sys; sys.path[:1] == [""] and sys.path.pop(0); import runpy; runpy.run_module("podrun", run_name="__main__", alter_sys=True)' launch --transport ssh --nodes 3 --devices-per-host 1 --instances-per-host 1 --ssh-config /home/me/.ssh/cluster --env NCCL_DEBUG -- python train.py

#!/bin/bash
#PBS -N podrun-resnet50
#PBS -S /bin/bash
#PBS -l select=2:mpiprocs=1
#PBS -l place=scatter
#PBS -P gaa50000
#PBS -v USE_SSH=1
#PBS -l walltime=02:00:00
#PBS -q rt_HF
#PBS -r n
# plan: cluster abci3, recipe resnet50, 2 host(s) x 8 gpu-h200 = 16 device(s)
# plan: 16 replica(s) x local batch 256 x GA 20 = global batch 81920; 2 instance(s), 1 device(s) per replica
# queue rt_HF: cluster spec abci3's default (jobs.queue)
# queue rt_HF sets each node's CPUs and GPUs itself (cluster spec abci3: jobs.typed_queues)
# -v USE_SSH=1: the job's launch reaches its nodes over ssh (cluster spec abci3: jobs.ssh_directives)
# submit: qsub SCRIPT; podrun launch reads the hosts from $PBS_NODEFILE

set -eo pipefail
if ! command -v module >/dev/null 2>&1 && [ -f /etc/profile.d/modules.sh ]; then
  . /etc/profile.d/modules.sh
fi
module load hpcx
set -u
cd "$PBS_O_WORKDIR"
# PYTHON -m podrun launch, but never a podrun/ from the working directory: the -c boot takes it off the import path
exec /opt/venv/bin/python3 -c 'import os, sys; sys.path[:1] == [""] and sys.path.pop(0); import runpy; runpy.run_module("podrun", run_name="__main__", alter_sys=True)' launch --transport mpirun --cluster abci3 --nodes 2 --devices-per-host 8 --instances-per-host 1 --global-batch 81920 --local-batch 256 --grad-accum 20 resnet50

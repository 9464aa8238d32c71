#!/bin/bash
#$ -N rn50-81920
#$ -S /bin/bash
#$ -cwd
#$ -l rt_F=512
#$ -l h_rt=01:00:00
#$ -l USE_SSH=1
# plan: cluster abci, recipe resnet50, 512 host(s) x 4 gpu-v100 = 2048 device(s)
# plan: 2048 replica(s) x local batch 40 x GA 1 = global batch 81920; 512 instance(s), 1 device(s) per replica
# rt_F=512: 512 whole node(s) of 4 gpu-v100 each, the resource cluster spec abci names (jobs.resource)
# submit: qsub -terse -g gaa50000 SCRIPT; podrun launch reads the hosts from $PE_HOSTFILE / $SGE_JOB_HOSTLIST

set -eo pipefail
if ! command -v module >/dev/null 2>&1 && [ -f /etc/profile.d/modules.sh ]; then
  . /etc/profile.d/modules.sh
fi
module load cuda/12.2
module load hpcx/2.12
set -u
# PYTHON -m podrun launch, but never a podrun/ from the working directory: the -c boot takes it off the import path
exec /opt/venv/bin/python3 -c 'import os, sys; sys.path[:1] == [""] and sys.path.pop(0); import runpy; runpy.run_module("podrun", run_name="__main__", alter_sys=True)' launch --transport mpirun --cluster abci --nodes 512 --devices-per-host 4 --instances-per-host 1 --global-batch 81920 --local-batch 40 --grad-accum 1 resnet50

#!/bin/bash
#$ -N podrun-resnet50
#$ -S /bin/bash
#$ -cwd
#$ -l rt_F=4
#$ -l h_rt=01:00:00
#$ -l USE_SSH=1
#$ -v SSH_PORT=2299
# plan: cluster abci, recipe resnet50, 4 host(s) x 4 gpu-v100 = 16 device(s)
# plan: 16 replica(s) x local batch 128 x GA 40 = global batch 81920; 4 instance(s), 1 device(s) per replica
# rt_F=4: 4 whole node(s) of 4 gpu-v100 each, the resource cluster spec abci names (jobs.resource)
# -l USE_SSH=1, -v SSH_PORT=2299: the job's launch reaches its nodes over ssh (cluster spec abci: jobs.ssh_directives)
# submit: qsub -terse -g gaa50000 SCRIPT; podrun launch reads the hosts from $PE_HOSTFILE / $SGE_JOB_HOSTLIST

set -euo pipefail
ssh_config="$(mktemp "${TMPDIR:-/tmp}/podrun-ssh.XXXXXX")"
printf 'Host *\n  Port %s\n' 2299 > "$ssh_config"
if [ -f ~/.ssh/config ]; then cat ~/.ssh/config >> "$ssh_config"; fi
# PYTHON -m podrun launch, but never a podrun/ from the working directory: the -c boot takes it off the import path
exec /opt/venv/bin/python3 -c 'import os, sys; sys.path[:1] == [""] and sys.path.pop(0); import runpy; runpy.run_module("podrun", run_name="__main__", alter_sys=True)' launch --ssh-config "$ssh_config" --transport ssh --cluster abci --nodes 4 --devices-per-host 4 --instances-per-host 1 --global-batch 81920 --local-batch 128 --grad-accum 40 resnet50 -- --data /groups/gaa50000/imagenet

#!/usr/bin/env bash
# The peers of `python -m bench scale` that are not Python packages: pdsh and ClusterShell's clush, from Debian
# (Open MPI's mpirun comes with the project's `mpi` extra, Slurm and torchrun with the test machine's setup).
set -euo pipefail
apt-get install -y --no-install-recommends pdsh clustershell
echo "scale peers: $(pdsh -V 2>&1 | head -1), clush $(clush --version 2>&1 | awk '{print $2}')"

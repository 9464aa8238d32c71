#!/usr/bin/env bash
# The peers of `python -m bench elastic` (torchft 0.2.0 and DLRover 0.6.1) in a venv of their own, DIR (default
# /work/peers-venv), that sees the system's packages: they use the system's torch, which this pins, so neither
# install replaces it. dlrover's k8s extra (grpcio, tornado, kubernetes) is what dlrover-run and its master import
# even without Kubernetes.
set -euo pipefail
dir=${1:-/work/peers-venv}
python3 -m venv --system-site-packages "$dir"
torch=$(python3 -c 'import torch; print(torch.__version__)')
"$dir/bin/pip" install -q -c <(echo "torch==$torch") "torchft==0.2.0" "dlrover[k8s]==0.6.1"
got=$("$dir/bin/python" -c 'import torch; print(torch.__version__)')
[ "$got" = "$torch" ] || { echo "the peers' venv has torch $got, the system $torch" >&2; exit 1; }
echo "peers in $dir (torch $got): $("$dir/bin/pip" list 2>/dev/null | grep -iE '^(torchft|dlrover) ' | tr -s ' ' | paste -sd, -)"

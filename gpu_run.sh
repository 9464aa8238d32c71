#!/bin/bash
# one device call: the prepared GPU check (issue 44's, <= 345 s), then the step split on CUDA (<= 110 s)
set -u
export PYTHONPATH=$PWD
nvidia-smi -L
mkdir -p $OUT/check
timeout 360 python3 -m bench gpu-check $OUT/check > $OUT/gpu-check.log 2>&1; echo "gpu-check rc $?"
tail -5 $OUT/gpu-check.log
R=/tmp/h4runs; rm -rf $R
timeout 70 python3 -m podrun launch --devices-per-host 1 --runs-dir $R recipes/resnet18_cifar10 \
  --data digits --image-size 32 --steps 60 --eval-every 0 --keep-checkpoints 0 > $OUT/split.log 2>&1
echo "split rc $?"; grep -v "progress:" $OUT/split.log | tail -3
D=$(ls -d $R/*/ | head -1)
cp $D/summary.json $OUT/split-summary.json 2>/dev/null
python3 -m podrun report $D --no-plot > $OUT/split-report.txt 2>&1; tail -8 $OUT/split-report.txt
PODRUN_TEST_INPUT_DELAY=0=0.05 timeout 40 python3 -m podrun launch --devices-per-host 1 --runs-dir $R \
  recipes/resnet18_cifar10 --data digits --image-size 32 --steps 30 --eval-every 0 --keep-checkpoints 0 > $OUT/split2.log 2>&1
echo "split2 rc $?"; grep -i "input" $OUT/split2.log | grep -v "progress:" | head -3

"""A light rank (no torch) for the metrics bench: `metrics_ranks.py STEPS PAUSE`: STEPS reports through
podrun.runtime, each PAUSE s apart, with a busy time and a step split as the recipes' runner sends them."""
import os
import sys
import time

from podrun import runtime
from podrun.wire.protocol import StepSplit

steps, pause = int(sys.argv[1]), float(sys.argv[2])
rank = int(os.environ["RANK"])
print(f"up rank {rank}", flush=True)
for step in range(1, steps + 1):
    time.sleep(pause)
    busy = pause * (0.5 + 0.001 * rank)
    runtime.report(step=step, total=steps, loss=1.0 / step, samples_per_sec=100.0, step_seconds=pause,
                   busy_seconds=busy, split=StepSplit(0.01, busy * 0.6, pause * 0.3, busy * 0.1, 1, 0))
print(f"done rank {rank}", flush=True)

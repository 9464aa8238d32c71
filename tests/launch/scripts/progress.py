"""A plain script that reports its steps through podrun.runtime (STEPS steps over 2 epochs, SLEEP s each)."""
import sys
import time

from podrun import runtime

steps, pause = int(sys.argv[1]), float(sys.argv[2])
for step in range(1, steps + 1):
    time.sleep(pause)
    runtime.report(step=step, total=steps, epoch=(step - 1) * 2 // steps, loss=1.0 / step + 1e-9,
                   samples_per_sec=1234.56789, step_seconds=pause)
print("done", flush=True)

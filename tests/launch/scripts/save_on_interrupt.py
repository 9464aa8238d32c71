"""A training loop's Ctrl-C handler: ``except KeyboardInterrupt`` writes <dir>/saved-<RANK> (the signal each
rank got first, by name), prints the interrupt's traceback on stderr as an unhandled one would, and exits 0; every
rank prints ``up <RANK>`` once its handler is in place. The save takes $SAVE_S seconds (default 0.5)."""
import os
import signal
import sys
import time
import traceback

out = sys.argv[1]
got = []
for s in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, lambda n, f: (got.append(signal.Signals(n).name), sys.exit(128 + n)))
try:
    print(f"up {os.environ['RANK']}", flush=True)    # inside the handler: the signal may come while print returns
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    time.sleep(float(os.environ.get("SAVE_S", "0.5")))   # a save that takes a while: nothing may end it meanwhile
    with open(os.path.join(out, f"saved-{os.environ['RANK']}"), "w") as f:
        f.write("SIGINT " + " ".join(got))
    print(f"saved {os.environ['RANK']}", flush=True)
    traceback.print_exc()

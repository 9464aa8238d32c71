"""bench_start's worker: imports torch. With --after-zygote GLOB, the first attempt imports nothing: its rank 0 waits
until a file matches GLOB (the host's zygote listens) and exits 1, so that the restart's workers are forked by it."""
import glob
import os
import sys
import time

if len(sys.argv) > 2 and sys.argv[1] == "--after-zygote" and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    while os.environ.get("RANK") == "0" and not glob.glob(sys.argv[2]):
        time.sleep(0.1)
    sys.exit(1 if os.environ.get("RANK") == "0" else 0)
import torch  # noqa: E402,F401

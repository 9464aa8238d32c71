"""A worker for tests/elastic/test_warm.py: says how it was started, fails the first attempt on a go file.

Prints ``probe <host> attempt <n> pid <pid> ppid <ppid> warm <PODRUN_WARM or ->`` and a line from
torch (imported, so that a warm start has something to skip). On attempt 0 it waits for ``<dir>/go``
(the test's cue) and exits 3; on a later attempt it exits 0.
"""
import os
import socket
import sys
import time

import torch

d = sys.argv[1]
attempt = os.environ["PODRUN_RESTART_COUNT"]
print(f"probe {socket.gethostname()} attempt {attempt} pid {os.getpid()} ppid {os.getppid()} "
      f"warm {os.environ.get('PODRUN_WARM', '-')} threads {torch.get_num_threads()}", flush=True)
if attempt == "0":
    while not os.path.exists(os.path.join(d, "go")):
        time.sleep(0.05)
    sys.exit(3)
while "--wait-done" in sys.argv and not os.path.exists(os.path.join(d, "done")):
    time.sleep(0.05)  # WARM-LOOP

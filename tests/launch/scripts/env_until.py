"""A worker for the secrets tests: writes the values of the names it is given (as its environment holds them) to
DUMP/<RANK>.json, then sleeps until DUMP/go appears (at most 300 s), so that a test can read every process's
command line while the whole run is up.

    python env_until.py DUMP NAME [NAME ...]
"""
import json
import os
import sys
import time

dump, names = sys.argv[1], sys.argv[2:]
rank = os.environ.get("RANK", "x")
tmp = os.path.join(dump, f".{rank}.json")
with open(tmp, "w") as f:
    json.dump({n: os.environ.get(n) for n in names}, f)
os.replace(tmp, os.path.join(dump, f"{rank}.json"))
deadline = time.monotonic() + 300
while not os.path.exists(os.path.join(dump, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)

#!/usr/bin/env python3
"""A FAKE poprun for contract tests (the real one ships only with Graphcore's Poplar SDK).

It records its argv and env to $FAKE_POPRUN_RECORD (JSON), then does what poprun does on one host:
starts --num-instances copies of the command with Open MPI's rank variables and popdist's POPDIST_*
set, ends the others when one fails, and exits with the first failing instance's code.
"""
import json
import os
import signal
import subprocess
import sys
import time


def main(argv):
    opts, i = {}, 0
    while i < len(argv) and argv[i].startswith("--"):
        name, eq, value = argv[i][2:].partition("=")
        if not eq:
            print(f"fake poprun: option --{name} needs =VALUE in this fake", file=sys.stderr)
            return 64
        opts[name] = value
        i += 1
    command = argv[i:]
    rec = os.environ.get("FAKE_POPRUN_RECORD")
    if rec:
        with open(rec, "w") as f:
            json.dump({"argv": ["poprun", *argv], "options": opts, "command": command}, f)
    n = int(opts["num-instances"])
    replicas = int(opts["num-replicas"])
    per = replicas // n
    procs = []
    for k in range(n):
        env = dict(os.environ, OMPI_COMM_WORLD_RANK=str(k), OMPI_COMM_WORLD_SIZE=str(n),
                   POPDIST_NUM_INSTANCES=str(n), POPDIST_INSTANCE_INDEX=str(k),
                   POPDIST_NUM_TOTAL_REPLICAS=str(replicas), POPDIST_NUM_LOCAL_REPLICAS=str(per),
                   POPDIST_REPLICA_INDEX_OFFSET=str(k * per),
                   POPDIST_NUM_IPUS_PER_REPLICA=opts.get("ipus-per-replica", "1"))
        procs.append(subprocess.Popen(command, env=env))

    def stop(signum, _):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = 0
    while any(p.poll() is None for p in procs):
        for p in procs:
            rc = p.poll()
            if rc not in (None, 0) and code == 0:
                code = rc if rc > 0 else 128 - rc
                stop(signal.SIGTERM, None)
        time.sleep(0.02)
    for p in procs:
        rc = p.returncode
        if rc != 0 and code == 0:
            code = rc if rc > 0 else 128 - rc
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""A STAND-IN for Graphcore's poprun in contract tests: the real one ships only with the Poplar SDK and needs a POD.

Its command line is checked against the options Graphcore's "PopRun and PopDist User Guide" documents (section
"PopRun features": poprun [options] program [program args]): it accepts those options as `--name=value` or
`--name value` (and `-H hosts`), refuses any other option as real poprun refuses an unknown one (exit 1), and, as
on a POD, refuses a run that names no V-IPU partition (--vipu-partition) unless --offline-mode attaches no IPUs.
It records its argv and env to $FAKE_POPRUN_RECORD (JSON), then does what poprun does on one host: starts
--num-instances copies of the command with Open MPI's rank variables and popdist's POPDIST_* set, ends the
others when one fails, and exits with the first failing instance's code. It reaches no V-IPU server.
"""
import json
import os
import signal
import subprocess
import sys
import time

# the options the guide lists that take a value (boost program_options: `--name=value` or `--name value`)
VALUED = {
    "host", "host-file", "num-replicas", "ipus-per-replica", "num-instances", "num-ilds", "vipu-server-host",
    "vipu-server-port", "vipu-server-timeout", "vipu-partition", "vipu-partition-attempts", "update-partition",
    "reset-partition", "remove-partition", "vipu-cluster", "vipu-allocation", "executable-cache-path",
    "mpi-global-args", "mpi-local-args", "numa-aware", "print-topology", "only-output-from-instance",
    "offline-mode", "version-format", "import-config", "export-config", "overwrite-config",
}
FLAGS = {"help", "version", "verbose", "debug"}
SHORT = {"-H": "host", "-v": "verbose", "-vv": "verbose"}
ON = ("1", "on", "yes", "true")


def parse(argv):
    """(options, command) as poprun reads them, or a SystemExit(1) naming an option it does not know."""
    opts, i = {}, 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        name, eq, value = (arg[2:].partition("=") if arg.startswith("--") else (SHORT.get(arg, arg), "", ""))
        if name not in VALUED and name not in FLAGS:
            print(f"poprun: unrecognised option '{arg}'", file=sys.stderr)
            raise SystemExit(1)
        if name in VALUED and not eq:
            if i + 1 >= len(argv):
                print(f"poprun: the required argument for option '--{name}' is missing", file=sys.stderr)
                raise SystemExit(1)
            i, value = i + 1, argv[i + 1]
        opts[name] = value
        i += 1
    return opts, argv[i:]


def main(argv):
    opts, command = parse(argv)
    if not command:
        print("poprun: no program to launch", file=sys.stderr)
        return 1
    if not opts.get("vipu-partition") and opts.get("offline-mode", "0").lower() not in ON:
        print("poprun: no V-IPU partition: give --vipu-partition (or --offline-mode=on)", file=sys.stderr)
        return 1
    rec = os.environ.get("FAKE_POPRUN_RECORD")
    if rec:
        with open(rec, "w") as f:
            json.dump({"argv": ["poprun", *argv], "options": opts, "command": command}, f)
    n = int(opts.get("num-instances", "1"))
    replicas = int(opts.get("num-replicas", "1"))
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

"""A worker's stdout and stderr lines keep the order it wrote them in: on the console (both streams into one
pipe), in instance-N.log and in the root cause's last lines. Real podrun launches of a real script."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.launch.helpers import PODRUN, run_dir

pytestmark = pytest.mark.timeout(600)
RUNS = 30
LINES = 200
WORKERS = 2
ALTERNATE = (
    "import os, sys, time\n"
    "rank = os.environ['RANK']\n"
    f"for i in range({LINES}):\n"
    "    print(f'rank {rank} line {i}', file=sys.stdout if i % 2 == 0 else sys.stderr, flush=True)\n"
    "open(os.path.join(sys.argv[1], f'done-{rank}'), 'w').close()\n"
    "while len([n for n in os.listdir(sys.argv[1]) if n.startswith('done-')]) < int(os.environ['WORLD_SIZE']):\n"
    "    time.sleep(0.05)\n"
    "sys.exit(3)   # every rank has written all its lines: none is cut short by the others' teardown\n")


def _numbers(lines, rank: int) -> list[int]:
    return [int(m[1]) for line in lines if (m := re.search(rf"rank {rank} line (\d+)$", line))]


def test_stdout_and_stderr_lines_keep_each_ranks_order_over_many_runs(tmp_path):
    """30 runs of 2 workers that alternate 200 flushed lines between stdout and stderr, then exit 3: every
    run shows every rank's lines in the order written, on the console (stdout and stderr into one pipe), in
    instance-0.log, and as the root cause's last lines."""
    script = tmp_path / "alternate.py"
    script.write_text(ALTERNATE)
    bad = []
    for run in range(RUNS):
        runs, done = tmp_path / f"runs{run}", tmp_path / f"done{run}"
        done.mkdir()
        cp = subprocess.run([*PODRUN, "launch", "--devices-per-host", str(WORKERS), "--runs-dir", str(runs), "--",
                             sys.executable, str(script), str(done)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=120, env=dict(os.environ))
        assert cp.returncode == 3, cp.stdout[-3000:]
        console = [line for line in cp.stdout.splitlines() if line.startswith("[0:")]   # the workers' lines
        log = (run_dir(runs) / "instance-0.log").read_text().splitlines()
        root = json.loads((run_dir(runs) / "summary.json").read_text())["root_cause"]
        rank = int(root["local_rank"])
        for where, lines, want in [(f"console rank {r}", console, list(range(LINES))) for r in range(WORKERS)] \
                + [(f"instance-0.log rank {r}", log, list(range(LINES))) for r in range(WORKERS)] \
                + [("root cause's last lines", root["last_lines"], list(range(LINES - 10, LINES)))]:
            r = rank if where.startswith("root") else int(where.rsplit(" ", 1)[1])
            got = _numbers(lines, r)
            if got != want:
                bad.append(f"run {run}, {where}: {got[:12]}...")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("unbuffered", [False, True])
def test_a_python_worker_writes_more_than_one_message_holds_in_one_write(tmp_path, unbuffered):
    """A worker's stdout and stderr take one write as one message (at most half the socket's send buffer):
    a Python worker writing 20 MB in one call (buffered, and with -u) still writes it, in pieces (podrun's
    sitecustomize), and the run goes on: the line is cut as any long line is, the next lines follow."""
    script = tmp_path / "big.py"
    script.write_text("import sys\nsys.stdout.write('z' * 20_000_000 + '\\n'); sys.stdout.flush()\n"
                      "print('after', flush=True)\nsys.stderr.write('e' * 20_000_000 + '\\n')\nprint('end')\n")
    cp = subprocess.run([*PODRUN, "launch", "--devices-per-host", "1", "--runs-dir", str(tmp_path / "runs"), "--",
                         sys.executable, *(["-u"] if unbuffered else []), str(script)], capture_output=True,
                        text=True, timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1" if unbuffered else ""})
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert "Message too long" not in cp.stderr
    log = [line for line in (run_dir(tmp_path / "runs") / "instance-0.log").read_text().splitlines()
           if not line.startswith("# podrun agent:")]         # the worker's lines, not the agent's notes
    assert [line[:3] for line in log] == ["zzz", "[po", "aft", "eee", "[po", "end"], [line[:40] for line in log]
    assert log[1] == log[4] == f"[podrun: dropped {20_000_000 - 65536} more bytes of the line cut above]"

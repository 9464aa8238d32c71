"""The root cause of a failed run, with real workers: the failing worker's own last lines (not another rank's
secondary error), what the others said, and the exception torch's @record wrote to TORCHELASTIC_ERROR_FILE."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

from podrun.launch.stacks import rank_ranges
from tests.launch.helpers import podrun, run_dir, summary
from tests.ports import free_port

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

# rank 1 raises while rank 0 waits in all_reduce; rank 0 then gets gloo's error and says a lot about it
GLOO_FAIL = textwrap.dedent("""
    import datetime, os, signal, sys, traceback
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    if dist.get_rank() == 1:
        raise RuntimeError("rank1-own-failure")
    # rank 0 outlives the teardown's SIGTERM, so its secondary error is printed whatever the timing
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        dist.all_reduce(torch.ones(1))
    except Exception:
        traceback.print_exc()
        for i in range(12):
            print(f"rank0-secondary {i}", file=sys.stderr, flush=True)
        sys.exit(1)
""")

RECORD_FAIL = textwrap.dedent("""
    import os, sys, time
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        if os.environ["RANK"] == "1":
            raise ValueError("bad shard 17 in rank " + os.environ["RANK"])
        time.sleep(60)

    main()
""")


def test_root_cause_shows_the_failing_workers_own_lines_then_the_others(tmp_path):
    script = tmp_path / "two_ranks.py"
    script.write_text(GLOO_FAIL)
    cp = podrun("launch", "--devices-per-host", "2", "--master-port", str(free_port(2)), "--grace", "10",
                "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, str(script), timeout=150)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    rc = summary(tmp_path / "runs")["root_cause"]
    assert (rc["instance"], rc["local_rank"]) == (0, 1), rc
    own = "\n".join(rc["last_lines"])
    assert "RuntimeError: rank1-own-failure" in own, rc["last_lines"]
    assert "rank0-secondary" not in own and "gloo" not in own.lower(), rc["last_lines"]
    (other,) = rc["others"]
    assert (other["instance"], other["local_rank"]) == (0, 0)
    assert "rank0-secondary 11" in other["last_lines"], other
    # on the console: the exception's line first, with the rank and host, in the root cause's headline; its
    # traceback once (the live stream's, not again under the root cause); then, under their own heading, the others'
    headline = next(line for line in cp.stderr.splitlines() if "root cause:" in line)
    assert headline.endswith("root cause: instance 0 on localhost, local rank 1: RuntimeError: rank1-own-failure"), \
        headline
    assert cp.stderr.count('raise RuntimeError("rank1-own-failure")') == 1, cp.stderr
    err = cp.stderr[cp.stderr.index("root cause:"):]
    assert err.index("rank1-own-failure") < err.index("what the other workers said") < err.index("rank0-secondary 11")
    assert "exited with code 1; its last lines are above (and in " in err, err
    # every line that names the failure names its rank
    (ending,) = [line for line in cp.stderr.splitlines() if "ending the run on every host" in line]
    assert ending.endswith("(instance 0 on localhost, local rank 1)"), ending


def test_record_error_file_message_is_in_the_root_cause(tmp_path):
    script = tmp_path / "record_fail.py"
    script.write_text(RECORD_FAIL)
    cp = podrun("launch", "--devices-per-host", "2", "--master-port", str(free_port(2)),
                "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, str(script), timeout=150)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    rd = run_dir(tmp_path / "runs")
    rc = summary(tmp_path / "runs")["root_cause"]
    assert rc["local_rank"] == 1
    error = rc["error"]
    assert error["message"] == "ValueError: bad shard 17 in rank 1", error
    assert any('raise ValueError("bad shard 17 in rank "' in line for line in error["traceback"]), error
    assert error["file"] == str(rd / "errors" / "worker-0-1.json")
    assert json.loads((rd / "errors" / "worker-0-1.json").read_text())["message"]["message"] == error["message"]
    assert "ValueError: bad shard 17 in rank 1" in cp.stderr[cp.stderr.index("root cause:"):]


SAME_ERROR = textwrap.dedent("""
    import os, pathlib, sys, time
    here = pathlib.Path(sys.argv[1])
    (here / f"up-{os.environ['RANK']}").touch()
    while len(list(here.glob("up-*"))) < 3:     # every rank is up before any says its error
        time.sleep(0.01)
    print(f"train.py (rank {os.environ['RANK']}): error: digitz: dataset path does not exist", file=sys.stderr)
    (here / f"said-{os.environ['RANK']}").touch()
    while len(list(here.glob("said-*"))) < 3:   # and every rank has said it before any exits (the first exit
        time.sleep(0.01)                        # ends the others: one stopped before its line would say nothing)
    sys.exit(2)
""")


def test_an_error_every_rank_says_is_shown_once_with_the_ranks_that_said_it(tmp_path):
    """The same refusal from every rank (but for its rank number) is the root cause's lines once, and one line
    naming the others that said it; summary.json keeps each one's own lines."""
    script = tmp_path / "same.py"
    script.write_text(SAME_ERROR)
    cp = podrun("launch", "--devices-per-host", "3", "--runs-dir", str(tmp_path / "runs"), "--", sys.executable,
                str(script), str(tmp_path), timeout=120)
    assert cp.returncode == 2, cp.stdout + cp.stderr
    err = cp.stderr[cp.stderr.index("root cause:"):]
    assert err.count("dataset path does not exist") == 1, err
    assert "what the other workers said" not in err, err
    (same,) = [line for line in err.splitlines() if line.endswith("said the same")]
    rc = summary(tmp_path / "runs")["root_cause"]
    others = sorted(o["local_rank"] for o in rc["others"])
    assert len(others) == 2 and f"local ranks {rank_ranges(others)} said" in same, (same, rc)

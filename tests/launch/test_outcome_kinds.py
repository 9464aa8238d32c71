"""Outcomes are values: rewording a message changes no decision (the run's status, whether a host's snapshots
outlive its agent, what an elastic notice quotes from a preflight failure)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from podrun.errors import PreflightError
from podrun.host.agent import Agent, StopKind
from podrun.launch.supervisor import FailureKind
from podrun.wire.agent_args import AgentArgs, RunAttempt
from tests.launch.helpers import end, local_pids, marker, podrun, podrun_popen, run_dir, wait_until
from tests.ports import free_port

# A real local launch whose controller words an exit as "lost": the status must still be "failed" (a worker that
# exits 255, ssh's code for a lost connection, is no lost host).
REWORDED_LAUNCH = textwrap.dedent("""
    import sys
    from podrun.launch import supervisor
    supervisor._describe_code = lambda code: f"lost its way with code {code}"
    from podrun.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_reworded_exit_message_leaves_the_status_failed(tmp_path):
    runs = tmp_path / "runs"
    cp = subprocess.run([sys.executable, "-c", REWORDED_LAUNCH, "launch", "--devices-per-host", "1", "--master-port",
                         str(free_port()), "--runs-dir", str(runs), "--json", "--", sys.executable, "-c",
                         "import sys; sys.exit(255)"], capture_output=True, text=True, timeout=120)
    assert cp.returncode == 255, cp.stdout + cp.stderr
    summary = json.loads((run_dir(runs) / "summary.json").read_text())
    assert summary["root_cause"]["reason"].startswith("lost its way"), summary["root_cause"]   # the rewording ran
    assert summary["status"] == "failed" and summary["root_cause"]["kind"] == "exited", summary


def test_the_status_of_each_failure_kind():
    assert [k.status for k in FailureKind] == ["failed", "failed", "lost", "hung", "failed", "failed"]


def test_an_agent_decides_on_the_kind_of_its_stop_not_its_words():
    def agent() -> Agent:
        args = AgentArgs(RunAttempt("r", "/r", "/r/plan.json", "a", 1), 0, ("true",), grace=1.0, stdin_timeout=None)
        return Agent(args, 0, [{}])

    lost = agent()
    lost.request_stop(StopKind.CONTROLLER_LOST, "the link went quiet")       # no "lost the controller" in it
    assert lost.run_over()
    failed = agent()
    failed.request_stop(StopKind.WORKER_FAILED, "lost the controller, said a confused worker")
    assert not failed.run_over()
    signalled = agent()
    signalled.request_stop(StopKind.SIGNALLED, "a word that says nothing", signal.SIGTERM)
    assert signalled.run_over()
    after_failure = agent()                    # the teardown that follows a worker's failure: a restart may come
    after_failure.first_failure = 1
    after_failure.request_stop(StopKind.SIGNALLED, "received SIGTERM", signal.SIGTERM)
    assert not after_failure.run_over()


def test_a_preflight_failure_carries_its_problems_apart_from_its_wording():
    exc = PreflightError(["h1: no interface eth9", "h2: port 29500 busy"], "fix them", headline="anything at all")
    assert exc.problems == ("h1: no interface eth9", "h2: port 29500 busy")
    assert exc.message.splitlines() == ["anything at all:", "  - h1: no interface eth9", "  - h2: port 29500 busy"]
    assert exc.hint == "fix them" and exc.exit_code == 2


def test_a_stalled_controller_is_the_root_cause_its_agents_give(tmp_path):
    """The controller stops (SIGSTOP, as a starved machine's can) for longer than the agents' bound (--keepalive 2):
    each agent hears no heartbeat, ends its workers and says so on its typed stop line. Resumed, the controller
    takes its own stall out of the hosts' silence (it declares no host lost for the time it did not listen) and
    names the agents' reason as the root cause: kind controller-lost, the silence and the bound, exit 255; not the
    workers' SIGTERM exits that followed, and no bare exit 143 without a cause."""
    m = marker()
    runs = tmp_path / "runs"
    p = podrun_popen("launch", "--devices-per-host", "2", "--keepalive", "2", "--master-port", str(free_port()),
                     "--runs-dir", str(runs), "--", sys.executable, "-c", f"import time; time.sleep(120)  # {m}")

    def workers() -> list[int]:
        """The workers (``python -c``; the controller's command line names the marker too)."""
        out = []
        for q in local_pids(m):
            try:
                if Path(f"/proc/{q}/cmdline").read_bytes().split(b"\0")[1:2] == [b"-c"]:
                    out.append(q)
            except OSError:
                pass
        return out
    try:
        assert wait_until(lambda: len(workers()) == 2, 60), p.stderr
        # an agent gives a controller it never heard from a minute (it may still be starting other hosts): have it
        # hear one first. `podrun stack` answers once the controller's S reached every agent on its stdin.
        cp = podrun("stack", "--runs-dir", str(runs), timeout=60)
        assert cp.returncode == 0, cp.stderr
        os.kill(p.pid, signal.SIGSTOP)
        try:
            assert wait_until(lambda: not workers(), 60)      # the agents ended them on their own
        finally:
            os.kill(p.pid, signal.SIGCONT)
        out, err = p.communicate(timeout=60)
    finally:
        end(p)
    assert p.returncode == 255, err
    s = json.loads((run_dir(runs) / "summary.json").read_text())
    root = s["root_cause"]
    assert (root["kind"], s["status"]) == ("controller-lost", "failed"), s
    assert "heard no heartbeat from the controller for 2 s" in root["reason"] and "--keepalive" in root["reason"]
    assert all(i["status"] != "lost" for i in s["instances"]), s["instances"]
    assert "heard no heartbeat from the controller for 2 s" in err, err

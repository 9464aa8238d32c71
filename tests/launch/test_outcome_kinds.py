"""Outcomes are values: rewording a message changes no decision (the run's status, whether a host's snapshots
outlive its agent, what an elastic notice quotes from a preflight failure)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

from podrun.errors import PreflightError
from podrun.host.agent import Agent, StopKind
from podrun.launch.supervisor import FailureKind
from tests.launch.helpers import run_dir
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
    assert [k.status for k in FailureKind] == ["failed", "failed", "lost", "hung", "failed"]


def test_an_agent_decides_on_the_kind_of_its_stop_not_its_words():
    def agent() -> Agent:
        return Agent(0, ["true"], [{}], grace=1.0, stdin_watch=False, stdin_timeout=0.0)

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
    after_failure.worker_failed = True
    after_failure.request_stop(StopKind.SIGNALLED, "received SIGTERM", signal.SIGTERM)
    assert not after_failure.run_over()


def test_a_preflight_failure_carries_its_problems_apart_from_its_wording():
    exc = PreflightError(["h1: no interface eth9", "h2: port 29500 busy"], "fix them", headline="anything at all")
    assert exc.problems == ("h1: no interface eth9", "h2: port 29500 busy")
    assert exc.message.splitlines() == ["anything at all:", "  - h1: no interface eth9", "  - h2: port 29500 busy"]
    assert exc.hint == "fix them" and exc.exit_code == 2

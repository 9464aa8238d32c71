"""A second local user on a shared node, as the attacker (real processes; the second user is `nobody`, reached
with setpriv): directories it made in the run's way are refused, a killed controller leaves no zygote, agent
or socket behind, and what podrun writes out of a run holds no secret a worker printed."""
from __future__ import annotations

import json
import os
import signal
import stat
import sys
from pathlib import Path

import pytest

from tests.attacker import as_nobody, shared  # noqa: F401 - the fixture
from tests.harness.podrun_proc import ssh_launch_args, started
from tests.launch.helpers import local_pids, marker, podrun, wait_until
from tests.ports import free_port

pytestmark = pytest.mark.timeout(180)


def launch(runs, *args):
    return podrun("launch", "--devices-per-host", "1", "--master-port", str(free_port(2)), "--runs-dir", str(runs),
                  *args, timeout=120)


def refused(cp, path: Path, owner: str = "nobody") -> None:
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert "Traceback" not in cp.stderr and "ran" not in cp.stdout, cp.stderr
    first = cp.stderr.splitlines()[0]
    assert str(path) in first and owner in first, cp.stderr


def test_a_runs_dir_the_other_user_made_is_refused(shared):
    runs = shared / "runs"
    as_nobody(f"mkdir -m 777 {runs}")
    cp = launch(runs, "--run-id", "r1", "--", "echo", "ran")
    refused(cp, runs)
    assert os.listdir(runs) == []


def test_a_run_dir_the_other_user_made_is_refused_and_nothing_is_written_into_it(shared):
    runs = shared / "runs"
    runs.mkdir(mode=0o777)
    os.chmod(runs, 0o777)
    as_nobody(f"mkdir -m 777 {runs}/r1 {runs}/r1/stacks")
    os.chmod(runs, 0o755)                 # the runs dir is this user's again; the run dir inside is not
    cp = launch(runs, "--run-id", "r1", "--", "echo", "ran")
    refused(cp, runs / "r1")
    assert sorted(os.listdir(runs / "r1")) == ["stacks"] and os.listdir(runs / "r1" / "stacks") == []


def test_a_stacks_dir_the_other_user_made_in_a_prepared_run_dir_is_refused(shared):
    runs = shared / "runs"
    runs.mkdir()
    (runs / "r1").mkdir(mode=0o777)
    os.chmod(runs / "r1", 0o777)          # a run directory prepared (as `podrun submit` does), open for a while
    as_nobody(f"mkdir -m 777 {runs}/r1/stacks")
    os.chmod(runs / "r1", 0o755)
    cp = launch(runs, "--run-id", "r1", "--", "echo", "ran")
    refused(cp, runs / "r1" / "stacks")
    assert os.listdir(runs / "r1" / "stacks") == [] and not (runs / "r1" / "summary.json").exists()


def test_a_symlinked_run_dir_is_refused(shared):
    runs = shared / "runs"
    runs.mkdir(mode=0o777)
    os.chmod(runs, 0o777)
    as_nobody(f"mkdir -m 777 {shared}/theirs && ln -s {shared}/theirs {runs}/r1")
    os.chmod(runs, 0o755)
    cp = launch(runs, "--run-id", "r1", "--", "echo", "ran")
    refused(cp, runs / "r1")
    assert "symbolic link" in cp.stderr and os.listdir(shared / "theirs") == []


def test_a_parent_of_the_runs_dir_the_other_user_swapped_for_a_link_is_refused(shared):
    """The parents podrun makes for --runs-dir are checked as it makes them: one that is there already as the
    other user's link is refused, and nothing lands where it points."""
    as_nobody(f"mkdir -m 777 {shared}/theirs && ln -s {shared}/theirs {shared}/a")
    cp = launch(shared / "a" / "b" / "runs", "--run-id", "r1", "--", "echo", "ran")
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    assert os.listdir(shared / "theirs") == []


def test_every_file_of_a_run_is_private_whoever_writes_it(tmp_path):
    """torch's @record error file (written by the worker, not by podrun), the logs, the records: 0600 files and
    0700 directories, though this user's umask is 022."""
    runs = tmp_path / "runs"
    os.umask(0o022)
    cp = launch(runs, "--run-id", "p", "--", sys.executable, str(FAILING), "--no-secret")
    assert cp.returncode == 1, cp.stderr
    d = runs / "p"
    assert (d / "errors" / "worker-0-0.json").is_file(), sorted(str(p) for p in d.rglob("*"))
    modes = {str(p.relative_to(d)): oct(stat.S_IMODE(p.lstat().st_mode)) for p in d.rglob("*")}
    assert all(m == ("0o700" if (d / p).is_dir() else "0o600") for p, m in modes.items()), modes
    assert oct(stat.S_IMODE(d.stat().st_mode)) == "0o700"


FAILING = Path(__file__).parent / "scripts" / "leaky.py"
TOKEN = "hf_" + "Q7" * 15
PASSWORD = "pw-" + "z9" * 8


def test_a_workers_secrets_stay_out_of_the_summary_the_json_and_the_root_cause(tmp_path):
    runs = tmp_path / "runs"
    console = launch(runs, "--run-id", "c", "--", sys.executable, str(FAILING))
    as_json = launch(runs, "--run-id", "j", "--json", "--", sys.executable, str(FAILING))
    assert console.returncode == 1 and as_json.returncode == 1, console.stderr + as_json.stderr
    assert TOKEN in console.stdout + console.stderr      # the worker's own output streams as it was written
    cause = console.stderr[console.stderr.index("podrun: run c failed"):]
    summary = json.loads(as_json.stdout)
    assert summary["root_cause"]["error"]["message"].startswith("RuntimeError: failed with <redacted>")
    assert "<redacted>" in "".join(summary["root_cause"]["last_lines"])
    for where, text in (("console root cause", cause), ("--json", as_json.stdout),
                        ("summary.json", (runs / "c" / "summary.json").read_text()),
                        ("summary.json (--json run)", (runs / "j" / "summary.json").read_text())):
        assert TOKEN not in text and PASSWORD not in text, (where, text)
    assert "last lines" in cause and "<redacted>" in cause, cause


def _sleeper(runs, m: str, *extra: str):
    """`podrun launch EXTRA` of a worker that says up and sleeps 300 s (m on its command line), for a with block."""
    return started("launch", *extra, "--runs-dir", runs, "--hang-timeout", "off", "--master-port", free_port(2), "--",
                   sys.executable, "-c", "import time; print('up', flush=True); time.sleep(300)", m)


def test_kill_9_of_the_controller_ends_the_zygote_and_the_agents_within_2_s(tmp_path):
    """A --warm run that can restart: its controller killed with -9 while the zygote serves; the zygote, its
    watcher and the agent are gone within the promised 2 s, and nothing of the run listens any more."""
    m = marker()
    runs = tmp_path / "runs"
    with _sleeper(runs, m, "--devices-per-host", "2", "--max-restarts", "1") as p:
        sock = wait_until(lambda: next(runs.glob("*/zygote/*.sock"), None), 120)
        assert sock is not None, "the zygote never listened"
        rd = sock.parent.parent
        ours = wait_until(lambda: local_pids(str(rd)) if len(local_pids(str(rd))) >= 3 else None, 30)
        assert ours, local_pids(str(rd))        # the agent and the zygote (and its watcher)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        gone = wait_until(lambda: not local_pids(str(rd)) and not local_pids(m), 2.0, 0.02)
        assert gone, (local_pids(str(rd)), local_pids(m))
        assert wait_until(lambda: not (rd / "zygote").exists() and not (rd / "control.sock").exists(), 5), \
            sorted(os.listdir(rd))


def test_a_stale_control_socket_is_not_trusted_and_is_removed(tmp_path):
    """kill -9 of a controller (no zygote to clean up after it) leaves control.sock: `podrun stack` says the run
    is not running and removes it, and picks no dead run when asked for the newest."""
    m = marker()
    runs = tmp_path / "runs"
    with _sleeper(runs, m, "--devices-per-host", "1", "--run-id", "dead") as p:
        assert wait_until(lambda: (runs / "dead" / "control.sock").exists() and local_pids(m), 60)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
    assert wait_until(lambda: not local_pids(m), 10)
    assert (runs / "dead" / "control.sock").exists()
    newest = podrun("stack", "--runs-dir", str(runs), timeout=60)
    assert newest.returncode == 2 and "no running launch" in newest.stderr, newest.stderr
    assert not (runs / "dead" / "control.sock").exists()
    named = podrun("stack", "--runs-dir", str(runs), "dead", timeout=60)
    assert named.returncode == 2 and "is not running" in named.stderr and "Traceback" not in named.stderr


ALLREDUCE = Path(__file__).resolve().parents[1] / "launch" / "scripts" / "torchrun_allreduce.py"


@pytest.mark.parametrize("how", ["local warm", "local cold", "ssh"])
def test_code_the_other_user_planted_in_a_shared_working_directory_never_runs(how, shared, tmp_path, request):
    """The other user plants ``podrun/__init__.py`` and ``torch.py`` in a shared (1777) working directory; a run of
    2 torch workers there (this user's script, kept elsewhere) on this machine warm (its zygote, its store host
    forked), cold (the store host started) and over ssh (the agents, the zygote and the store host started on the
    host) imports neither: podrun's helpers start without the working directory on their path (podrun.pystart),
    and the run succeeds."""
    plant = {"podrun/__init__.py": "ran-podrun", "torch.py": "ran-torch"}
    as_nobody(f"mkdir {shared}/podrun && " + " && ".join(
        f"printf '%s\\n' \"open('{shared}/{mark}', 'w').write('ran')\" > {shared}/{path}"
        for path, mark in plant.items()))
    args = ["--workdir", str(shared), *(["--no-warm"] if how == "local cold" else []), "--", sys.executable,
            str(ALLREDUCE)]
    if how == "ssh":
        hosts = request.getfixturevalue("ssh_hosts")
        argv = ssh_launch_args(hosts, tmp_path / "runs", free_port(2), *args, names=hosts.hosts[:1], devices=2)
    else:
        argv = ["launch", "--devices-per-host", "2", "--master-port", str(free_port(2)), "--runs-dir",
                str(tmp_path / "runs"), *args]
    cp = podrun(*argv, timeout=150, cwd=str(tmp_path))
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stdout.count("ALLREDUCE") == 2, cp.stdout
    assert sorted(p.name for p in shared.iterdir() if p.name.startswith("ran-")) == [], cp.stdout + cp.stderr


def test_a_recipe_or_cluster_spec_of_the_other_user_named_like_podruns_own_never_runs(shared, tmp_path):
    """The other user makes ``resnet18_cifar10/`` (podrun's recipe.yaml, a train.py that leaves a marker) and
    ``cluster_specs/local.yaml`` in a shared working directory: ``podrun launch resnet18_cifar10`` there, or that
    folder given by path, and ``podrun plan --cluster local`` are refused, exit 2, one paragraph naming the path, its
    owner and mode; the train.py never runs."""
    import shutil

    from podrun.specs import project_root

    own = project_root()
    stage = shared / "stage"           # this user's, readable by the other
    stage.mkdir(mode=0o755)
    shutil.copy(own / "recipes" / "resnet18_cifar10" / "recipe.yaml", stage / "recipe.yaml")
    shutil.copy(own / "cluster_specs" / "local.yaml", shared / "local.yaml")     # podrun's tree may be private
    (stage / "train.py").write_text(f"open('{shared}/ran-recipe', 'w').write('ran')\n")
    runs = ["--runs-dir", str(tmp_path / "runs"), "--master-port", str(free_port(2)), "--devices-per-host", "1"]
    for plant, argv, path in (
            (f"mkdir {shared}/resnet18_cifar10 && cp {stage}/*.* {shared}/resnet18_cifar10/",
             ["launch", *runs, "resnet18_cifar10", "--data", "digits", "--steps", "1"], shared / "resnet18_cifar10"),
            ("true", ["launch", *runs, str(shared / "resnet18_cifar10"), "--data", "digits"],
             shared / "resnet18_cifar10"),
            (f"mkdir {shared}/cluster_specs && cp {shared}/local.yaml {shared}/cluster_specs/",
             ["plan", "--cluster", "local", "resnet18_cifar10"], shared / "cluster_specs")):
        as_nobody(plant)
        cp = podrun(*argv, cwd=str(shared), env={"PODRUN_DATA_DIR": str(tmp_path)})
        assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stdout + cp.stderr
        first = cp.stderr.splitlines()[0]
        assert str(path) in first and "nobody" in first and "mode 0" in first, cp.stderr
        assert f"podrun's own by its path: {own}" in cp.stderr, cp.stderr
    assert not (shared / "ran-recipe").exists()

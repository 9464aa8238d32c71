"""poprun engine: contract tests with a FAKE poprun on PATH (poprun ships only with the Poplar SDK)."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from podrun.errors import PlanError
from podrun.launch.engines.poprun import PoprunOptions, PoprunTransport, poprun_command
from podrun.wire.worker_env import POPDIST_NAMES, popdist_env

FAKE = Path(__file__).resolve().parent / "fake_poprun.py"


def ipu_plan(pod: int):
    from podrun.cli.options import resolve_plan

    return resolve_plan("recipes/efficientnet_b4", pod=pod, environ={})[0]


@pytest.fixture
def fake_poprun_path(tmp_path, monkeypatch):
    """A directory on PATH holding an executable named poprun: the FAKE."""
    d = tmp_path / "bin"
    d.mkdir()
    exe = d / "poprun"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_POPRUN_RECORD", str(tmp_path / "poprun-argv.json"))
    return d


def make_request(plan, tmp_path, command, **kw):
    from podrun.launch.request import LaunchRequest, instances_of
    from podrun.rundir.layout import write_plan

    kw.setdefault("poprun", PoprunOptions(vipu_server_host="vipu.test", vipu_partition="p-test"))

    run_dir = tmp_path / "run"
    plan_path = write_plan(run_dir, plan)
    return LaunchRequest(run_id="fake-poprun", run_dir=str(run_dir), plan=plan, plan_path=str(plan_path),
                         command=tuple(command), python=sys.executable, workdir=str(tmp_path),
                         master_addr="127.0.0.1", master_port=29500, transport="poprun", grace=2.0,
                         instances=instances_of(plan), **kw)


def run_supervised(req):
    from podrun.launch.supervisor import Supervisor

    lines = []
    sup = Supervisor(req, PoprunTransport(req), workers_per_instance=1,
                     sink=lambda i, host, lr, stream, text: lines.append((i, stream, text)))
    return sup.run(), lines


def test_fake_poprun_command_flags_pod64_and_pod256():
    """The contract: the flags poprun users know, with values from the plan."""
    p64 = ipu_plan(64)
    cmd = poprun_command(p64, ["python", "train.py"], PoprunOptions(
        vipu_server_host="vipu.example", vipu_partition="part64", vipu_cluster="c1",
        mpi_global_args="--tag-output", mpi_local_args="-x LD_LIBRARY_PATH", only_output_from_instance=0,
        print_topology=True, offline_mode=True))
    assert cmd[0] == "poprun" and cmd[-2:] == ["python", "train.py"]
    assert "--num-instances=4" in cmd and "--num-replicas=32" in cmd and "--ipus-per-replica=2" in cmd
    assert "--host=" + ",".join(dict.fromkeys(p64.hosts)) in cmd
    for flag in ("--vipu-server-host=vipu.example", "--vipu-partition=part64", "--vipu-cluster=c1",
                 "--numa-aware=1", "--mpi-global-args=--tag-output", "--mpi-local-args=-x LD_LIBRARY_PATH",
                 "--only-output-from-instance=0", "--print-topology=yes", "--offline-mode=on"):
        assert flag in cmd, flag
    assert not any(a.startswith("--num-ilds") for a in cmd)       # one POD64 = one IPU-Link domain
    p256 = ipu_plan(256)
    cmd = poprun_command(p256, ["x"])
    assert "--num-instances=16" in cmd and "--num-replicas=128" in cmd and "--num-ilds=4" in cmd


def test_fake_poprun_bad_input_is_plan_error():
    p = ipu_plan(16)
    with pytest.raises(PlanError, match="only-output-from-instance 3"):
        poprun_command(p, ["x"], PoprunOptions(only_output_from_instance=3))
    from podrun.cli.options import resolve_plan

    cpu = resolve_plan(None, environ={})[0]
    with pytest.raises(PlanError, match="IPU plan") as e:
        poprun_command(cpu, ["x"])
    assert e.value.exit_code == 2


def test_fake_poprun_popdist_env_names_match_plan_env():
    """popdist's names, one per popdist query, are the view of the contract that IPU workers get."""
    from podrun.wire.worker_env import worker_env

    p = ipu_plan(64)
    env = popdist_env(p, 3)
    assert tuple(env) == POPDIST_NAMES
    assert env["POPDIST_REPLICA_INDEX_OFFSET"] == "24" and env["POPDIST_NUM_LOCAL_REPLICAS"] == "8"
    w = worker_env(p, 3, 0, run_id="r", run_dir="/r", plan_path="/r/plan.json", master_addr="a", master_port=1)
    assert {k: str(w[k]) for k in POPDIST_NAMES} == env


def test_fake_poprun_dry_run_describes_the_poprun_line(tmp_path, fake_poprun_path):
    req = make_request(ipu_plan(64), tmp_path, ["python", "train.py"])
    t = PoprunTransport(req, PoprunOptions(vipu_partition="p"))
    ((label, line),) = t.describe()
    assert label == "poprun"
    assert line.startswith("poprun --num-instances=4 --num-replicas=32 --ipus-per-replica=2")
    assert "podrun.host.agent" in line and "--index-from-env" in line and "--no-stdin-watch" in line
    assert t.preflight() == []


def test_fake_poprun_line_names_the_env_and_holds_no_value(tmp_path, fake_poprun_path):
    """--env with the FAKE poprun: its line exports the names to every instance (-x NAME in --mpi-local-args) and
    holds no value; the values are in poprun's environment, and every instance's agent has them."""
    code = "import os; print('GOT', os.environ['MY_PLAIN'])"
    req = make_request(ipu_plan(64), tmp_path, [sys.executable, "-c", code], env=(("MY_PLAIN", "S3CRET-plain-value"),))
    t = PoprunTransport(req, PoprunOptions(mpi_local_args="-x LD_LIBRARY_PATH"))
    ((_, line),) = t.describe()
    assert "'--mpi-local-args=-x LD_LIBRARY_PATH -x MY_PLAIN'" in line and "S3CRET" not in line
    outcome, lines = run_supervised(req)
    assert outcome.exit_code == 0, lines
    assert "S3CRET" not in json.dumps(json.loads((tmp_path / "poprun-argv.json").read_text())["argv"])
    assert sum(text == "GOT S3CRET-plain-value" for _, _, text in lines) == req.plan.instances, lines


def test_fake_poprun_missing_is_a_preflight_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    req = make_request(ipu_plan(16), tmp_path, ["true"])
    (problem,) = PoprunTransport(req).preflight()
    assert "poprun" in problem.message and "PATH" in problem.message


@pytest.mark.timeout(60)
def test_fake_poprun_runs_agents_with_popdist_and_podrun_env(tmp_path, fake_poprun_path):
    """poprun starts the instance agents; every instance sees popdist's and podrun's variables."""
    plan = ipu_plan(64)
    code = ("import json,os; print('ENV '+json.dumps({k:v for k,v in os.environ.items() "
            "if k.startswith(('POPDIST_','PODRUN_','RANK','WORLD_SIZE'))}))")
    req = make_request(plan, tmp_path, [sys.executable, "-c", code])
    outcome, lines = run_supervised(req)
    assert outcome.exit_code == 0, lines
    rec = json.loads((tmp_path / "poprun-argv.json").read_text())
    assert rec["options"]["num-instances"] == "4" and rec["options"]["ipus-per-replica"] == "2"
    envs = {}
    for i, stream, text in lines:
        if text.startswith("ENV "):
            envs[i] = json.loads(text[4:])
    assert sorted(envs) == [0, 1, 2, 3], lines
    for i, e in envs.items():
        assert e["POPDIST_INSTANCE_INDEX"] == e["PODRUN_INSTANCE_INDEX"] == str(i)
        assert e["POPDIST_NUM_TOTAL_REPLICAS"] == e["PODRUN_NUM_REPLICAS"] == "32"
        assert e["POPDIST_REPLICA_INDEX_OFFSET"] == e["PODRUN_REPLICA_OFFSET"] == str(8 * i)
        assert e["POPDIST_NUM_IPUS_PER_REPLICA"] == "2" and e["WORLD_SIZE"] == "4"


@pytest.mark.timeout(60)
def test_fake_poprun_fail_fast_exit_code(tmp_path, fake_poprun_path):
    code = ("import os,sys,time; i=os.environ['PODRUN_INSTANCE_INDEX']; "
            "sys.exit(5) if i == '2' else time.sleep(60)")
    req = make_request(ipu_plan(64), tmp_path, [sys.executable, "-c", code])
    outcome, _ = run_supervised(req)
    assert outcome.exit_code == 5
    assert outcome.root_cause is not None and outcome.root_cause["instance"] == 2


def test_fake_poprun_refuses_what_real_poprun_refuses(tmp_path):
    """The stand-in's command line against the guide's options: an option poprun does not document, and a POD run
    naming no V-IPU partition, are refused (exit 1) before any instance starts; the documented spellings pass."""
    import subprocess

    def fake(*argv):
        return subprocess.run([sys.executable, str(FAKE), *argv], capture_output=True, text=True, timeout=30)

    bad = fake("--vipu-partition=p", "--no-such-option=1", "true")
    assert bad.returncode == 1 and "unrecognised option '--no-such-option=1'" in bad.stderr
    assert fake("--num-instances", "1", "true").returncode == 1                 # no partition, not offline
    ok = fake("--num-instances", "1", "--vipu-server-host", "v", "--vipu-partition=p", "-H", "localhost",
              "--numa-aware=1", "--offline-mode=off", "true")
    assert ok.returncode == 0, ok.stderr
    assert fake("--offline-mode=on", "true").returncode == 0
    # every option podrun's poprun line uses is one the stand-in (and the guide) knows
    line = poprun_command(ipu_plan(256), ["true"], PoprunOptions(
        vipu_server_host="v", vipu_partition="p", vipu_cluster="c", mpi_global_args="--tag-output",
        mpi_local_args="-x A", only_output_from_instance=0, print_topology=True, offline_mode=True))
    from tests.engines.fake_poprun import parse

    opts, command = parse(line[1:])
    assert command == ["true"] and opts["num-ilds"] == "4" and opts["vipu-partition"] == "p"


def test_vipu_comes_from_the_option_then_the_pod_env_then_the_spec():
    from podrun.launch.engines.poprun import resolve_vipu
    from podrun.specs.cluster import VipuSpec

    class Spec:
        vipu, path = VipuSpec(server_host="spec-host", partition="spec-part"), "pod.yaml"

    env = {"IPUOF_VIPU_API_HOST": "env-host", "IPUOF_VIPU_API_PARTITION_ID": "env-part"}
    got, where = resolve_vipu(PoprunOptions(vipu_partition="opt-part"), env, Spec())
    assert (got.vipu_server_host, got.vipu_partition) == ("env-host", "opt-part")
    assert where == {"vipu_server_host": "$IPUOF_VIPU_API_HOST", "vipu_partition": "--vipu-partition"}
    got, where = resolve_vipu(PoprunOptions(), {}, Spec())
    assert (got.vipu_server_host, got.vipu_partition) == ("spec-host", "spec-part")
    assert "pod.yaml" in where["vipu_partition"]

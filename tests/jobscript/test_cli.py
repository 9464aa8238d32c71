"""`podrun script` and `podrun hosts` through the real entry point: output, files, JSON, exit codes."""
from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"


def test_script_to_file_is_executable_and_names_the_submit_command(podrun_cli, tmp_path):
    out_path = tmp_path / "job.sh"
    code, out, err = podrun_cli("script", "--scheduler", "uge", "--cluster", "abci", "--nodes", "2",
                                "--group", "gaa50000", "resnet50", "--data", "/groups/gaa50000/imagenet", "-o",
                                str(out_path))
    assert code == 0, err
    assert out_path.read_text().startswith("#!/bin/bash\n#$ -N podrun-resnet50\n")
    assert out_path.stat().st_mode & stat.S_IXUSR
    assert f"submit with: qsub -terse -g gaa50000 {out_path}" in out


def test_scheduler_defaults_to_the_cluster_spec_and_mismatch_is_noted(podrun_cli):
    code, out, err = podrun_cli("script", "--cluster", "abci", "--nodes", "2", "resnet50", "--data", "/data/imagenet")
    assert code == 0, err
    assert "#$ -l rt_F=2" in out and err == ""
    code, out, err = podrun_cli("script", "--scheduler", "slurm", "--cluster", "abci", "--nodes", "2", "resnet50",
                                "--data", "/data/imagenet")
    assert code == 0 and "#SBATCH --nodes=2" in out
    assert "cluster 'abci' is scheduled by uge" in err


def test_uge_job_names_refuse_grid_engine_separators(podrun_cli):
    code, _, err = podrun_cli("script", "--cluster", "abci", "--nodes", "1", "--job-name", "a:b", "resnet50")
    assert code == 2 and "may not contain / : @" in err


def test_script_json(podrun_cli, tmp_path):
    code, out, err = podrun_cli("script", "--scheduler", "slurm", "--cluster", "dgx-h100", "--nodes", "2",
                                "--json", "resnet50", "--data", "/data/imagenet")
    assert code == 0, err
    d = json.loads(out)
    assert d["scheduler"] == "slurm" and d["path"] is None and d["submit"] == ["sbatch", "--parsable", "JOB_SCRIPT"]
    assert d["script"].startswith("#!/bin/bash\n#SBATCH --job-name=podrun-resnet50\n#SBATCH --nodes=2\n")
    assert (d["nodes"], d["devices_per_node"], d["device_kind"]) == (2, 8, "gpu")
    assert d["launch"][:6] == [*_launch(sys.executable), "--transport", "srun"]
    p = tmp_path / "j.sh"
    code, out, _ = podrun_cli("script", "--scheduler", "uge", "--cluster", "abci", "--group", "g1", "--nodes", "1",
                              "--json", "-o", str(p), "resnet50", "--data", "/data/imagenet")
    d = json.loads(out)
    assert (d["path"], d["script"], d["submit"]) == (str(p), None, ["qsub", "-terse", "-g", "g1", str(p)])


def _launch(python: str) -> list[str]:
    """The job's `podrun launch` as `python -m podrun launch` runs it, started as a safe helper (podrun.pystart):
    never a podrun/ from the job's working directory (tests/security/test_python_starts.py runs it beside one)."""
    from podrun import pystart

    return pystart.safe(python, "launch", module="podrun", root=None)


def test_job_runs_the_interpreter_that_wrote_it_or_job_python(podrun_cli):
    """The exec line runs `<interpreter> -c BOOT launch` (podrun's CLI as `-m podrun` runs it, without the working
    directory on the path), never a bare `podrun` looked up on PATH, nor `-m podrun`."""
    for sched in ("slurm", "pbs", "uge"):
        pe = ["--pe", "mpi"] if sched == "uge" else []
        code, out, err = podrun_cli("script", "--scheduler", sched, *pe, "--nodes", "2", "--", "python", "t.py")
        assert code == 0, err
        assert f"exec {shlex.join(_launch(sys.executable))} " in out and f"{sys.executable} -m" not in out, out
        code, out, err = podrun_cli("script", "--scheduler", sched, *pe, "--nodes", "2", "--job-python",
                                    "/opt/my venv/bin/python", "--", "python", "t.py")
        assert code == 0, err
        assert f"exec '/opt/my venv/bin/python' -c {shlex.quote(_launch('')[2])} launch " in out, out


@pytest.mark.parametrize(
    "argv, part",
    [
        (["--scheduler", "lsf", "resnet50"], "'lsf' is not one of 'slurm', 'pbs', 'uge'"),
        (["resnet50"], "no --scheduler given and cluster 'local' names none"),
        (["--scheduler", "slurm"], "give a RECIPE"),
        (["--scheduler", "slurm", "resnet50", "extra"], "unexpected argument"),
        (["--scheduler", "slurm", "--job-name", "a b", "resnet50"], "job script job name 'a b'"),
        (["--scheduler", "slurm", "--partition", "x\n#SBATCH --uid=0", "resnet50"], "newline"),
        (["--scheduler", "pbs", "--time", "90", "resnet50"], "time limit '90' has no unit"),
        (["--scheduler", "slurm", "--env", "NOEQUALS", "resnet50"], "is not NAME=VALUE"),
        (["--scheduler", "slurm", "--module", "x;y", "resnet50"], "not a module name"),
        (["--scheduler", "slurm", "no_such_recipe"], "unknown recipe"),
        (["--scheduler", "slurm", "--group", "g1", "resnet50"], "Grid Engine's `qsub -g`"),
        (["--scheduler", "pbs", "--pe", "mpi", "resnet50"], "parallel environment"),
        (["--scheduler", "slrum", "resnet50"], "did you mean 'slurm'?"),
        (["--scheduler", "sgee", "resnet50"], "did you mean 'sge'?"),
        # the job's launch would refuse it after the queue wait: a long run on synthetic data nobody asked for
        (["--scheduler", "slurm", "--cluster", "abci", "--nodes", "2", "resnet50"], "would train on synthetic data"),
        (["--scheduler", "slurm", "resnet18_cifar10", "--epochs", "x"], "train.py would refuse its arguments"),
        (["--scheduler", "slurm", "resnet18_cifar10", "--bogus"], "No such option '--bogus'"),
    ],
)
def test_bad_input_exits_2_with_one_paragraph(podrun_cli, argv, part):
    code, out, err = podrun_cli("script", *argv)
    assert code == 2
    assert part in err, err
    assert "Traceback" not in err and out == ""


def test_malformed_nodelist_in_the_env_exits_2(podrun_cli, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "g[0001-0003")
    for cmd in (["hosts"], ["script", "--scheduler", "slurm", "resnet18_cifar10"]):
        code, _, err = podrun_cli(*cmd)
        assert code == 2 and "SLURM_JOB_NODELIST" in err and "never closed" in err, err


def test_plan_larger_than_the_allocation_names_both_counts(podrun_cli, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "g[0001-0002]")
    code, _, err = podrun_cli("script", "--scheduler", "slurm", "--hosts", "a,b,c", "--global-batch", "96",
                              "resnet18_cifar10")
    assert code == 2
    assert "needs 3 host(s)" in err and "(SLURM_JOB_NODELIST) has 2" in err, err
    code, _, err = podrun_cli("script", "--scheduler", "slurm", "--cluster", "abci", "--nodes", "3", "resnet50")
    assert code == 2 and "3 hosts" in err and "only 2" in err, err


def test_script_inside_an_allocation_uses_its_hosts(podrun_cli, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "g[0001-0004]")
    code, out, err = podrun_cli("script", "--scheduler", "slurm", "--cluster", "abci", "resnet50", "--data",
                                "/data/imagenet")
    assert code == 0, err
    assert "#SBATCH --nodes=4" in out and "#SBATCH --gpus-per-node=4" in out


def test_hosts_json_from_each_source(podrun_cli, monkeypatch, tmp_path):
    def hosts(*argv):
        code, out, err = podrun_cli("hosts", "--json", *argv)
        assert code == 0, err
        return json.loads(out)

    d = hosts("--cluster", "abci", "--nodes", "3")
    assert (d["source"], d["scheduler"], d["nodelist"]) == ("cluster spec abci", "none", "g[0001-0003]")
    assert d["hosts"] == [{"name": f"g000{i}", "slots": None} for i in (1, 2, 3)]
    assert hosts("--hosts", "h1:4,h2:4")["hosts"] == [{"name": "h1", "slots": 4}, {"name": "h2", "slots": 4}]
    hf = tmp_path / "hostfile"
    hf.write_text("n1 slots=2\nn2 slots=2\n")
    d = hosts("--hostfile", str(hf))
    assert d["source"] == f"--hostfile {hf}" and [h["name"] for h in d["hosts"]] == ["n1", "n2"]

    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[08-10],login")
    d = hosts()
    assert (d["source"], d["scheduler"]) == ("SLURM_JOB_NODELIST", "slurm")
    assert [h["name"] for h in d["hosts"]] == ["gpu08", "gpu09", "gpu10", "login"]
    assert hosts("--hosts", "x1")["source"] == "--hosts"            # --hosts wins over the allocation
    monkeypatch.delenv("SLURM_JOB_NODELIST")

    nf = tmp_path / "nodefile"
    nf.write_text("p1\np1\np2\np2\n")
    monkeypatch.setenv("PBS_NODEFILE", str(nf))
    d = hosts("--cluster", "abci")
    assert (d["source"], d["scheduler"], d["devices_per_host"]) == ("PBS_NODEFILE", "pbs", 4)
    assert d["hosts"] == [{"name": "p1", "slots": None, "scheduler_slots": 2},
                          {"name": "p2", "slots": None, "scheduler_slots": 2}]
    monkeypatch.delenv("PBS_NODEFILE")

    pe = tmp_path / "pe"
    pe.write_text("g0007 40 gpu@g0007 UNDEFINED\ng0009 40 gpu@g0009 UNDEFINED\n")
    monkeypatch.setenv("PE_HOSTFILE", str(pe))
    d = hosts("--cluster", "abci")
    assert (d["source"], d["scheduler"], d["nodelist"]) == ("PE_HOSTFILE", "uge", "g[0007,0009]")


def test_hosts_text(podrun_cli, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    code, out, err = podrun_cli("hosts")
    assert code == 0, err
    assert out.splitlines()[0].startswith("2 host(s) from SLURM_JOB_NODELIST (slurm allocation)")
    assert out.splitlines()[1:] == ["  n1", "  n2"]


def test_golden_scripts_pass_bash_syntax_check():
    files = sorted(GOLDEN.glob("*.sh"))
    assert len(files) >= 5, "golden files are missing"
    proc = subprocess.run(["bash", "-n", *map(str, files)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_commands_import_neither_torch_nor_paramiko():
    code = ("import sys, podrun.cli.script_cmd, podrun.cli.hosts_cmd, podrun.jobscript; "
            "bad = [m for m in ('torch', 'paramiko') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ})
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_script_inside_an_allocation_plans_its_hosts_and_outside_plans_nodes(podrun_cli, monkeypatch):
    """No cluster named: inside an allocation the script is for its hosts; outside, for --nodes N
    hosts (default 1) of --devices-per-host workers (default 1) that the scheduler will allocate."""
    monkeypatch.setenv("SLURM_JOB_NODELIST", "g[0001-0003]")
    code, out, err = podrun_cli("script", "--scheduler", "slurm", "--json", "--", "python", "t.py")
    assert code == 0, err
    assert json.loads(out)["nodes"] == 3
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    code, out, err = podrun_cli("script", "--scheduler", "slurm", "--json", "--nodes", "4", "--", "python", "t.py")
    assert code == 0, err
    d = json.loads(out)
    assert (d["nodes"], d["devices_per_node"]) == (4, 1)
    code, out, err = podrun_cli("script", "--scheduler", "slurm", "--json", "--", "python", "t.py")
    assert code == 0 and json.loads(out)["nodes"] == 1, err


def test_recipe_options_after_the_recipe_and_the_sge_alias(podrun_cli):
    """`script RECIPE --data digits` passes the recipe's options on as `launch RECIPE --data digits` does (the same
    bytes as after --); the command's own options after the recipe stay its own (-o, --nodes); `--scheduler sge`
    is Grid Engine's script."""
    base = ["--cluster", "dgx-h100", "--nodes", "2", "--json"]
    code, out, err = podrun_cli("script", "--scheduler", "slurm", *base, "resnet18_cifar10", "--data", "digits",
                                "--nodes", "2", "--steps=3", "--quiet", "--", "--seed", "1")
    assert code == 0, err
    code2, out2, _ = podrun_cli("script", "--scheduler", "slurm", *base, "resnet18_cifar10", "--",
                                "--data", "digits", "--steps=3", "--quiet", "--seed", "1")
    assert json.loads(out) == json.loads(out2)
    assert json.loads(out)["launch"][-7:] == ["--", "--data", "digits", "--steps=3", "--quiet", "--seed", "1"]
    sge = [podrun_cli("script", "--scheduler", name, "--pe", "mpi", *base, "resnet50")
           for name in ("sge", "uge", "SGE")]
    assert [c for c, _, _ in sge] == [0, 0, 0] and sge[0][1] == sge[1][1] == sge[2][1]
    assert json.loads(sge[0][1])["scheduler"] == "uge"


def test_submit_takes_every_option_script_takes_and_a_plain_script(podrun_cli, tmp_path, monkeypatch):
    """One option table for script and submit: every option of `script` but its -o is one of `submit`'s, and
    `submit --dry-run` writes the same directives and launch line `script` writes for them (--directive, --resource,
    --log-dir, --workdir); `submit ... ddp.py ARGS` runs the script as `launch ddp.py ARGS` does (everything after
    it is its own), where it said `recipe ddp.py is not a folder`."""
    from podrun.cli.script_cmd import script
    from podrun.cli.submit_cmd import submit

    names = lambda cmd: {o for p in cmd.params for o in getattr(p, "opts", ())}     # noqa: E731
    assert names(script) - {"-o", "--output"} <= names(submit), names(script) - names(submit)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ddp.py").write_text("print('hi')\n")
    logs = tmp_path / "logs"
    job = ["--scheduler", "uge", "--nodes", "2", "--resource", "rt_X", "--directive", "-l USE_BEEOND=1",
           "--log-dir", str(logs), "--workdir", "/scratch/w", "ddp.py", "--lr", "0.1", "--nodes", "9"]
    code, out, err = podrun_cli("submit", "--dry-run", "--json", "--runs-dir", str(tmp_path / "runs"), *job)
    assert code == 0, err
    text = Path(json.loads(out)["script"]).read_text()
    code, out, err = podrun_cli("script", *job)
    assert code == 0, err
    for line in ("#$ -l rt_X=2", "#$ -l USE_BEEOND=1", f"#$ -o {logs}/", "cd /scratch/w"):
        assert line in text.splitlines() and line in out.splitlines(), (line, text)
    exec_line = next(x for x in text.splitlines() if x.startswith("exec "))
    assert shlex.split(exec_line)[-5:] == ["ddp.py", "--lr", "0.1", "--nodes", "9"], exec_line
    assert shlex.split(exec_line)[shlex.split(exec_line).index("--nodes") + 1] == "2", exec_line


def test_a_job_on_synthetic_data_past_a_node_hour_is_noted_when_written(podrun_cli, tmp_path):
    """ABCI 3.0, 2 nodes, resnet50 with no --data: under the one-hour refusal (about 49 min) but 1.6 node-hours on
    synthetic data: script and submit write the job and say so on stderr, with the estimate; with --data, or a run
    of a few steps, nothing is said."""
    base = ["--scheduler", "pbs", "--cluster", "abci3", "--nodes", "2", "--group", "gxx"]
    for cmd in (["script"], ["submit", "--dry-run", "--runs-dir", str(tmp_path / "runs")]):
        code, out, err = podrun_cli(*cmd, *base, "resnet50")
        assert code == 0 and out, err
        assert "note: no --data given: resnet50 trains on synthetic data" in err and "node-hours" in err, err
        for quiet in (["--data", "/groups/gxx/imagenet"], ["--steps", "20"]):
            code, _, err = podrun_cli(*cmd, *base, "resnet50", *quiet)
            assert code == 0 and "synthetic" not in err, err

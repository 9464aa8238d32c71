"""The pure writers: hostile values survive quoting (bash -n, shlex, real bash), determinism, refusals."""
from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from podrun.errors import PodrunError
from podrun.jobscript import JobRequest, format_time, parse_time, render, submit_argv

HOSTILE = [
    "two words", "it's", 'say "hi"', "$(touch PWNED)", "`touch PWNED`", "${HOME}", "a;touch PWNED",
    "x && touch PWNED", "#not-a-comment", "--", "\\", "*", "~", "", "-l rt_F=999", "ünïcödé",
]


def _req(scheduler="slurm", **kw):
    base = dict(scheduler=scheduler, job_name="podrun-test", nodes=3, devices_per_node=4, device_kind="gpu",
                command=("podrun", "launch", "recipes/x"))
    if scheduler == "uge" and "pe" not in kw and "resource" not in kw:
        base["resource"] = "rt_F"        # a Grid Engine job asks for its nodes one way or the other
    base.update(kw)
    return JobRequest(**base)


def _exec_line(script: str) -> str:
    lines = [line for line in script.splitlines() if line.startswith("exec ")]
    assert len(lines) == 1, script
    return lines[0]


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "uge"])
def test_hostile_argv_round_trips_through_shlex_and_bash_n(scheduler, tmp_path):
    argv = ("podrun", "launch", *HOSTILE)
    env = {"PODRUN_NOTE": "$(touch PWNED) `x` 'q' \"d\"", "EMPTY": ""}
    script = render(_req(scheduler, command=argv, env=env, workdir="/tmp/dir with 'quote'"))
    assert shlex.split(_exec_line(script))[1:] == list(argv)
    path = tmp_path / "job.sh"
    path.write_text(script)
    bash = shutil.which("bash")
    assert bash, "bash is needed to check the scripts' syntax"
    proc = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "uge"])
def test_real_bash_receives_the_exact_argv_and_env(scheduler, tmp_path):
    """Run the rendered script in bash with printf in podrun's place: every byte arrives as written."""
    argv = ("printf", "%s\\0", *HOSTILE)
    env = {"PODRUN_NOTE": "$(touch PWNED) `touch PWNED` 'q' \"d\" $HOME"}
    work = tmp_path / "work dir $(x)"
    work.mkdir()
    script = render(_req(scheduler, command=argv, env=env, workdir=str(work)))
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = subprocess.run(["bash", str(path)], capture_output=True, cwd=tmp_path, timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().split("\0")[:-1] == list(HOSTILE)
    assert not list(tmp_path.rglob("PWNED")) and not list(work.rglob("PWNED"))
    # the env value is exported verbatim too
    script2 = render(_req(scheduler, command=("sh", "-c", 'printf %s "$PODRUN_NOTE"; pwd'), env=env, workdir=str(work)))
    path.write_text(script2)
    out = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=20).stdout
    assert out == env["PODRUN_NOTE"] + str(work) + "\n"


def test_pbs_default_cd_is_the_submit_directory(tmp_path):
    path = tmp_path / "job.sh"
    path.write_text(render(_req("pbs", command=("pwd",))))
    out = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=20,
                         env={"PBS_O_WORKDIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path)


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "uge"])
def test_render_is_deterministic(scheduler):
    kw = dict(env={"B": "2", "A": "1"}, modules=("cuda/12.1",), time_limit="1-02:03:04", log_dir="logs")
    a, b = render(_req(scheduler, **kw)), render(_req(scheduler, **kw))
    assert a == b and a.encode() == b.encode()
    assert a.endswith("\n") and "\r" not in a
    # env keeps the order given (exports may refer to nothing, so order is the caller's)
    assert a.index("export B=2") < a.index("export A=1")


# each field's unsafe values and the part of the refusal that says why
UNSAFE = {
    "job_name": [("x\n#SBATCH --uid=0", "newline"), ("my job", "' '"), ("a#b", "'#'"),
                 ("-x", "cannot go on a scheduler directive line")],
    "partition": [("gpu\r", "newline"), ("a'b", "\"'\"")],
    "account": [("$(id)", "'$'")],
    "log_dir": [("logs dir", "' '")],
    "output": [("out`x`.log", "'`'")],
    "time_limit": [("90", "has no unit"), ("1:70:00", "below 60"), ("soon", "not a duration"),
                   (0, "must be positive")],
    "nodes": [(0, "positive integer")],
    "device_kind": [("tpu", "unknown device kind")],
    "scheduler": [("lsf", "unknown scheduler")],
    "modules": [(("cuda; rm -rf /",), "not a module name")],
    "env": [((("1BAD", "x"),), "not a shell variable name"), ((("OK", "a\nb"),), "newline")],
    "command": [(("podrun", "a\nb"), "newline")],
    "directives": [(("--exclusive\n#SBATCH --uid=0",), "newline"), (("exclusive",), "must start with an option"),
                   (("-l a'b",), "\"'\"")],
}


@pytest.mark.parametrize("field, value, part", [(f, v, part) for f, cases in UNSAFE.items() for v, part in cases])
def test_unsafe_values_are_refused_with_the_field_named(field, value, part):
    with pytest.raises(PodrunError) as err:
        render(_req(**{field: value}))
    assert part in err.value.message, err.value.message
    assert err.value.exit_code == 2


def test_uge_output_may_use_grid_engine_pseudo_variables():
    text = render(_req("uge", output="logs/$JOB_NAME.o$JOB_ID"))
    assert "#$ -o logs/$JOB_NAME.o$JOB_ID" in text and "#$ -j y" in text
    with pytest.raises(PodrunError):
        render(_req("slurm", output="logs/$JOB_ID"))
    with pytest.raises(PodrunError):
        render(_req("uge", output="logs/$(id)"))


@pytest.mark.parametrize(
    "value, seconds",
    [(3600, 3600), ("01:30:00", 5400), ("90m", 5400), ("2h", 7200), ("45s", 45), ("1d", 86400),
     ("10:00", 600), ("2-00:00:00", 172800), ("1-12", 129600), ("100:00:00", 360000)],
)
def test_parse_time(value, seconds):
    assert parse_time(value) == seconds


def test_format_time_keeps_long_hours():
    assert format_time(5400) == "01:30:00" and format_time(360000) == "100:00:00"


def test_submit_argv():
    """One submit command per scheduler, printing the job id alone; the account stays a directive."""
    assert submit_argv(_req("slurm", account="proj"), "job.sh") == ["sbatch", "--parsable", "job.sh"]
    assert submit_argv(_req("pbs", account="proj"), "job.sh") == ["qsub", "job.sh"]
    assert submit_argv(_req("uge", group="gaa50000"), "job.sh") == ["qsub", "-terse", "-g", "gaa50000", "job.sh"]
    assert submit_argv(_req("uge"), "job.sh") == ["qsub", "-terse", "job.sh"]


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "uge"])
def test_submit_comment_is_the_submit_argv(scheduler):
    req = _req(scheduler, group="g1" if scheduler == "uge" else None)
    assert f"# submit: {' '.join(submit_argv(req, 'SCRIPT'))}; " in render(req)


@pytest.mark.parametrize("scheduler", ["slurm", "pbs"])
def test_pe_is_grid_engine_only_and_group_is_abci_s(scheduler):
    """ABCI's group: Grid Engine's `qsub -g` (ABCI 1.0), PBS's `#PBS -P` (ABCI 3.0); Slurm has none. A group with
    shell or directive characters is refused (exit 2) for every scheduler."""
    if scheduler == "slurm":
        with pytest.raises(PodrunError, match="qsub -g"):
            render(_req(scheduler, group="g1"))
    else:
        assert "#PBS -P g1" in render(_req(scheduler, group="g1")).splitlines()
    with pytest.raises(PodrunError, match="parallel environment"):
        render(_req(scheduler, pe="mpi"))
    with pytest.raises(PodrunError, match="group") as e:
        render(_req("pbs", group="g1; rm -rf ~"))
    assert e.value.exit_code == 2


def test_uge_parallel_environment_replaces_the_abci_resource():
    s = render(_req("uge", pe="podrun")).splitlines()
    assert "#$ -pe podrun 3" in s and not any(line.startswith("#$ -l rt_F") for line in s)
    assert not any("ABCI" in line for line in s)
    s = render(_req("uge")).splitlines()
    assert "#$ -l rt_F=3" in s and not any(line.startswith("#$ -pe") for line in s)
    assert not any("ABCI" in line or "V100" in line for line in s)     # no comment but the request's own
    with pytest.raises(PodrunError, match="pe"):
        render(_req("uge", pe="mpi 4"))
    for kw in ({"resource": None}, {"pe": "mpi", "resource": "rt_F"}):     # neither, or both
        with pytest.raises(PodrunError, match="parallel environment or a resource") as e:
            render(_req("uge", **kw))
        assert e.value.exit_code == 2
    with pytest.raises(PodrunError, match="--resource 'rt_F' is a Grid Engine resource request"):
        render(_req("pbs", resource="rt_F"))


def test_directive_lines_per_scheduler():
    s = render(_req("slurm", time_limit="2h", partition="gpu", account="proj", cpus_per_node=64))
    for line in ["#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --cpus-per-task=64", "#SBATCH --time=02:00:00", "#SBATCH --partition=gpu",
                 "#SBATCH --account=proj", "#SBATCH --no-requeue", "#SBATCH --output=%x-%j.out"]:
        assert line in s.splitlines(), line
    assert "--gpus-per-node" not in render(_req("slurm", device_kind="ipu"))
    p = render(_req("pbs", cpus_per_node=40, queue="workq", time_limit="30m", log_dir="logs"))
    for line in ["#PBS -l select=3:ncpus=40:ngpus=4:mpiprocs=1", "#PBS -l walltime=00:30:00", "#PBS -q workq",
                 "#PBS -o logs/", "#PBS -e logs/", 'cd "$PBS_O_WORKDIR"']:
        assert line in p.splitlines(), line
    assert "ngpus" not in render(_req("pbs", device_kind="cpu"))
    u = render(_req("uge", time_limit="1h", group="gaa50000"))
    for line in ["#$ -l rt_F=3", "#$ -l h_rt=01:00:00", "#$ -cwd", "#$ -N podrun-test"]:
        assert line in u.splitlines(), line
    assert "qsub -terse -g gaa50000 SCRIPT" in u


def test_cpu_bind_goes_on_the_jobs_launch_line_checked_against_the_nodes_cores(capsys):
    from podrun.cli.main import main

    base = ["script", "--scheduler", "slurm", "--cluster", "dgx-h100", "--nodes", "2"]
    assert main([*base, "--cpu-bind", "auto", "--", "python", "train.py"]) == 0
    assert "--instances-per-host 1 --cpu-bind auto -- python train.py" in capsys.readouterr().out
    for bad, why in (("0;1", "is not a core"), ("0-200", "1 core set(s) for 8 worker(s)"),
                     (",".join(f"{i * 14 + 1}-{i * 14 + 14}" for i in range(8)), "112")):   # cores are 0-111
        assert main([*base, "--cpu-bind", bad, "--", "python", "train.py"]) == 2, bad
        out = capsys.readouterr()
        assert why in out.err and "#SBATCH" not in out.out, (bad, out)


def test_pbs_job_starts_one_agent_per_instance_through_mpirun(capsys):
    """PBS's job starts its instances' agents through Open MPI's mpirun, which reads the job's slots from
    PBS_NODEFILE: the chunk asks one line (mpiprocs) per agent. ABCI 3.0's spec names its default resource-type
    queue (rt_HF), which sets each node's CPUs and GPUs, and the directive ssh between the nodes needs (an Open MPI
    built without PBS's TM interface starts its daemons over ssh), each with a comment naming the spec's field;
    srun, which reaches no node over ssh there, asks none. A queue of that name on no cluster spec is a queue."""
    from podrun.cli.main import main

    assert main(["script", "--cluster", "abci3", "--nodes", "2", "--instances-per-host", "2", "--",
                 "python", "t.py"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "#PBS -l select=2:mpiprocs=2" in lines and "#PBS -v USE_SSH=1" in lines and "#PBS -q rt_HF" in lines
    assert "# queue rt_HF: cluster spec abci3's default (jobs.queue)" in lines, lines
    assert "# -v USE_SSH=1: the job's launch reaches its nodes over ssh (cluster spec abci3: jobs.ssh_directives)" \
        in lines, lines
    assert " --transport mpirun --cluster abci3 --nodes 2 --devices-per-host 8 --instances-per-host 2 -- " in \
        _exec_line("\n".join(lines))
    assert main(["script", "--cluster", "abci3", "--nodes", "2", "--queue", "rt_HG", "--transport", "srun",
                 "--", "python", "t.py"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "#PBS -l select=2:mpiprocs=1" in lines and "#PBS -q rt_HG" in lines
    assert not any("USE_SSH" in line or "jobs.queue)" in line for line in lines), lines
    assert main(["script", "--scheduler", "pbs", "--cluster", "abci", "--nodes", "2", "--queue", "rt_HF",
                 "--", "python", "t.py"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "#PBS -l select=2:ncpus=40:ngpus=4:mpiprocs=1" in lines and not any("USE_SSH" in line for line in lines)

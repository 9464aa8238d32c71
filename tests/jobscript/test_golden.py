"""Golden job scripts per scheduler x cluster, and the body's `podrun launch` reproducing the same plan.

Regenerate after an intended change with PODRUN_UPDATE_GOLDEN=1 pytest tests/jobscript/test_golden.py
and review the diff.

A golden file is what the writer wrote; the schedulers' own parsers check them where one runs here:
the Slurm ones with the real sbatch (tests/jobscript/test_slurm_real.py), the Grid Engine ones with the
real qsub (tests/uge/test_submit_uge.py). PBS has no server here: the PBS goldens (pbs_*.sh) are checked by
no PBS qsub, but by the placement rule below (directives before the first command), by PBS Professional's
documented directive grammar (test_pbs_golden_follows_the_documented_directive_grammar) and by their body
reproducing the plan.
"""
from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from podrun import pystart
from podrun.jobscript import compress_hostlist

GOLDEN = Path(__file__).parent / "golden"
# the interpreter is a parameter of the writer: a fixed one keeps the golden files the same on every machine
PYTHON = "/opt/venv/bin/python3"

CASES = {
    "slurm_dgx-h100": ["--scheduler", "slurm", "--cluster", "dgx-h100", "--nodes", "4", "--time", "2h",
                       "--partition", "gpu", "--account", "proj01", "--env", "NCCL_DEBUG=WARN", "resnet50"],
    "slurm_local": ["--scheduler", "slurm", "--cluster", "local", "--hosts", "node1,node2,node3",
                    "--devices-per-host", "2", "--global-batch", "192", "--time", "10m", "resnet18_cifar10", "--", "--epochs", "1"],
    "slurm_ipu-pod64": ["--scheduler", "slurm", "--pod", "64", "--time", "1-00:00:00", "--partition", "pod64",
                        "--vipu-server-host", "vipu-ctrl", "--vipu-partition", "pod64-p1", "efficientnet_b4",
                        "--data", "/localdata/imagenet"],
    "pbs_abci3": ["--scheduler", "pbs", "--cluster", "abci3", "--nodes", "2", "--group", "gaa50000",
                  "--time", "2h", "--module", "hpcx", "resnet50"],
    "uge_abci_ssh": ["--scheduler", "uge", "--cluster", "abci", "--nodes", "4", "--group", "gaa50000",
                     "--transport", "ssh", "--time", "1h", "resnet50", "--data", "/groups/gaa50000/imagenet"],
    "pbs_abci": ["--scheduler", "pbs", "--cluster", "abci", "--nodes", "2", "--time", "01:00:00",
                 "--queue", "gpu", "--cpus-per-node", "40", "--log-dir", "logs", "resnet50", "--data",
                 "/scratch/imagenet"],
    "uge_abci": ["--scheduler", "uge", "--cluster", "abci", "--nodes", "512", "--group", "gaa50000",
                 "--time", "1h", "--module", "cuda/12.2", "--module", "hpcx/2.12",
                 "--directive", "-l USE_SSH=1", "--job-name", "rn50-81920", "resnet50"],
    "pbs_command": ["--scheduler", "pbs", "--nodes", "1", "--devices-per-host", "2", "--workdir", "/scratch/my run",
                    "--", "python", "train.py", "--note", "it's $(not) run"],
    "uge_pe": ["--scheduler", "uge", "--nodes", "3", "--pe", "mpi", "--ssh-config", "/home/me/.ssh/cluster",
               "--queue", "all.q", "--env", "NCCL_DEBUG=INFO", "--", "python", "train.py"],
}
CASES = {name: ["--job-python", PYTHON, *argv] for name, argv in CASES.items()}
# `PYTHON -m podrun launch` as a safe helper (podrun.pystart): never a podrun/ from the job's working directory
EXEC = f"exec {shlex.join(pystart.safe(PYTHON, 'launch', module='podrun', root=None))} "


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_script(name, podrun_cli):
    code, out, err = podrun_cli("script", *CASES[name])
    assert code == 0, err
    path = GOLDEN / f"{name}.sh"
    if os.environ.get("PODRUN_UPDATE_GOLDEN"):
        path.write_text(out)
    assert path.exists(), f"golden file {path} is missing: run with PODRUN_UPDATE_GOLDEN=1 and review it"
    assert out == path.read_text(), f"{name}: the script differs from {path}"
    code2, out2, _ = podrun_cli("script", *CASES[name])
    assert (code2, out2) == (0, out)               # deterministic


@pytest.mark.parametrize("name", sorted(CASES))
def test_directives_come_before_the_first_command(name):
    """sbatch and PBS's qsub stop reading directives at the first line that is not a comment: a directive
    below it would be ignored without a word (Grid Engine reads '#$' lines anywhere)."""
    lines = (GOLDEN / f"{name}.sh").read_text().splitlines()
    prefix = {"slurm": "#SBATCH", "pbs": "#PBS", "uge": "#$"}[name.split("_")[0]]
    first = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    assert any(line.startswith(prefix + " ") for line in lines[:first]), lines[:first]
    assert not [line for line in lines[first:] if line.startswith(prefix)], name


def _launch_options(script: str):
    line = next(line for line in script.splitlines() if line.startswith(EXEC))
    argv = shlex.split(line)[5:]
    opts, positional, dashdash = {}, [], []
    if "--" in argv:
        i = argv.index("--")
        argv, dashdash = argv[:i], argv[i + 1:]
    it = iter(argv)
    for a in it:
        if a.startswith("--"):
            opts[a[2:].replace("-", "_")] = next(it)
        else:
            positional.append(a)
    return opts, positional, dashdash


def want_transport(args, scheduler):
    """The job's podrun launch --transport: the one asked for; none for poprun (an IPU-POD); Open MPI's tight
    integration on ABCI's Grid Engine (rt_F, no --pe); else the scheduler's own (PBS: Open MPI's mpirun)."""
    if "--transport" in args:
        return args[args.index("--transport") + 1]
    if "--pod" in args:
        return None
    if scheduler == "uge" and "--pe" not in args:
        return "mpirun"
    return {"slurm": "srun", "pbs": "mpirun", "uge": "ssh"}[scheduler]


@pytest.mark.parametrize("name", sorted(CASES))
def test_body_reproduces_the_plan_inside_the_allocation(name, podrun_cli, tmp_path):
    """Resolve the body's `podrun launch` options with the hosts the scheduler would hand the job
    (a real SLURM_JOB_NODELIST / PBS_NODEFILE / PE_HOSTFILE): the plan is the one `podrun plan` showed."""
    from podrun.cli.options import resolve_plan

    args = CASES[name]
    code, out, err = podrun_cli("script", *args)
    assert code == 0, err
    scheduler = args[args.index("--scheduler") + 1]
    opts, positional, dashdash = _launch_options(out)
    assert opts.pop("transport", None) == want_transport(args, scheduler)
    want_ssh_config = args[args.index("--ssh-config") + 1] if "--ssh-config" in args else None
    abci_ssh = scheduler == "uge" and "--pe" not in args and want_transport(args, scheduler) == "ssh"
    if want_ssh_config is None and abci_ssh:
        want_ssh_config = "$ssh_config"         # ABCI's job-local ssh config: its sshd's port 2299
    assert opts.pop("ssh_config", None) == want_ssh_config
    for flag in ("--vipu-server-host", "--vipu-partition"):     # the POD's V-IPU, for poprun
        assert opts.pop(flag[2:].replace("-", "_"), None) == (args[args.index(flag) + 1] if flag in args else None)
    # --env reaches the workers of every host: as launch --env NAME (its value from the script's export above, never
    # on launch's command line) unless srun carries the job's env there
    want_env = args[args.index("--env") + 1].split("=")[0] if "--env" in args and scheduler != "slurm" else None
    assert opts.pop("env", None) == want_env
    recipe = positional[0] if positional else None
    assert len(positional) <= 1
    # the plan podrun script planned, as the user asked for it (outside any allocation)
    kw = {}
    for key in ("--cluster", "--nodes", "--devices-per-host", "--hosts", "--pod", "--global-batch",
                "--local-batch", "--grad-accum", "--instances-per-host"):
        if key in args:
            value = args[args.index(key) + 1]
            name = "hosts_opt" if key == "--hosts" else key[2:].replace("-", "_")
            kw[name] = value if name in ("cluster", "hosts_opt") else int(value)
    from podrun.jobscript.build import allocation_plan_options
    from podrun.plan.inputs import PlanOptions

    # no cluster named: N hosts of an allocation to come
    want, *_ = resolve_plan(recipe, allocation_plan_options(PlanOptions(**kw)), environ={})
    # the hosts the scheduler hands the job: other names than planned, the same count
    names = [f"c{i:04d}" for i in range(1, len(want.hosts) + 1)]
    if scheduler == "slurm":
        environ = {"SLURM_JOB_NODELIST": compress_hostlist(names)}
    elif scheduler == "pbs":
        (tmp_path / "nodefile").write_text("".join(f"{n}\n" for n in names))
        environ = {"PBS_NODEFILE": str(tmp_path / "nodefile")}
    else:
        (tmp_path / "pe").write_text("".join(f"{n} 40 gpu@{n} UNDEFINED\n" for n in names))
        environ = {"PE_HOSTFILE": str(tmp_path / "pe")}
    launch_kw = {k: int(v) if k != "cluster" else v for k, v in opts.items()}
    got, _, _, src = resolve_plan(recipe, environ=environ, **launch_kw)
    assert src.source in environ
    assert list(got.hosts) == names
    for field in ("cluster", "recipe", "device_kind", "devices_per_host", "devices", "devices_per_replica",
                  "replicas", "instances_per_host", "instances", "local_batch", "grad_accum", "global_batch",
                  "learning_rate"):
        assert getattr(got, field) == getattr(want, field), field
    if "--" in args:
        assert dashdash == args[args.index("--") + 1:]


@pytest.mark.parametrize("name", ["slurm_local", "pbs_command"])
def test_body_runs_as_a_podrun_launch_dry_run_in_the_allocation(name, podrun_cli, monkeypatch, tmp_path):
    """The exec line itself, with --dry-run --json added, through the real `podrun launch`: it picks the
    scheduler's hosts and the planned batch decomposition."""
    import json

    monkeypatch.chdir(tmp_path)
    code, out, err = podrun_cli("script", *CASES[name])
    assert code == 0, err
    line = next(line for line in out.splitlines() if line.startswith(EXEC))
    argv = shlex.split(line)[4:]              # launch ...
    nodes = int(argv[argv.index("--nodes") + 1])
    names = [f"c{i:02d}" for i in range(1, nodes + 1)]
    if name.startswith("slurm"):
        monkeypatch.setenv("SLURM_JOB_NODELIST", compress_hostlist(names))
    else:
        (tmp_path / "nodefile").write_text("".join(f"{n}\n" for n in names))
        monkeypatch.setenv("PBS_NODEFILE", str(tmp_path / "nodefile"))
    code, out, err = podrun_cli(argv[0], "--dry-run", "--json", "--runs-dir", str(tmp_path / "runs"), *argv[1:])
    assert code == 0, err
    record = json.loads(out)
    assert record["transport"] == argv[argv.index("--transport") + 1]
    assert [i["host"] for i in record["instances"]] == names
    workers = [w for i in record["instances"] for w in i["workers"]]
    assert len(workers) == nodes * int(argv[argv.index("--devices-per-host") + 1])
    if "--global-batch" in argv:
        assert {w["PODRUN_GLOBAL_BATCH"] for w in workers} == {argv[argv.index("--global-batch") + 1]}
        assert {w["PODRUN_LOCAL_BATCH"] for w in workers} == {argv[argv.index("--local-batch") + 1]}
        assert {w["PODRUN_GRAD_ACCUM"] for w in workers} == {argv[argv.index("--grad-accum") + 1]}


# PBS Professional's qsub options a `#PBS` line may hold (the PBS Professional Reference Guide, "qsub"): the option
# letter and the grammar of its value. -l is resource=value; select= a chunk: N[:resource=value]...
_RES = r"[A-Za-z_][A-Za-z0-9_.]*"
_PBS_VALUE = {
    "N": r"[A-Za-z0-9_.+\-]{1,236}", "S": r"/[\w./\-]+", "q": r"[\w.@\-]+", "P": r"[\w.\-]+", "A": r"[\w.\-]+",
    "o": r"[\w.:/%\-]+", "e": r"[\w.:/%\-]+", "j": r"oe|eo|n", "r": r"[yn]", "V": r"", "m": r"[abe]+|n",
    "k": r"[oed]+|n", "v": rf"{_RES}=[^,\s]*(,{_RES}=[^,\s]*)*",
    "l": rf"select=\d+(:{_RES}=[\w.\-]+)*|place=(free|pack|scatter|vscatter)(:(excl|shared|exclhost))?"
         rf"|walltime=\d+:[0-5]\d:[0-5]\d|{_RES}=[\w.:\-]+",
}


@pytest.mark.parametrize("name", sorted(n for n in CASES if n.startswith("pbs_")))
def test_pbs_golden_follows_the_documented_directive_grammar(name):
    """No PBS server runs here: each `#PBS` line of a PBS golden is `#PBS -X value` with an option PBS's qsub
    documents and a value of its grammar (one select chunk per node, the group as -P, the queue as -q)."""
    import re

    lines = [x for x in (GOLDEN / f"{name}.sh").read_text().splitlines() if x.startswith("#PBS")]
    seen = []
    for line in lines:
        m = re.fullmatch(r"#PBS -([A-Za-z])(?: (\S+))?", line)
        assert m and m.group(1) in _PBS_VALUE, f"{name}: {line!r} is no documented qsub option"
        assert re.fullmatch(_PBS_VALUE[m.group(1)], m.group(2) or ""), f"{name}: {line!r}: bad value"
        seen.append(m.group(1))
    assert seen.count("N") == 1 and seen.count("r") == 1 and "l" in seen
    args = CASES[name]
    if "--group" in args:
        assert f"#PBS -P {args[args.index('--group') + 1]}" in lines

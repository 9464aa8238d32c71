"""Pure job-script writers: JobRequest -> the text of a Slurm, PBS or Grid Engine (ABCI) batch script."""
from __future__ import annotations

from shlex import quote as _q

from podrun.jobscript.job import SCHEDULER_TABLE, JobRequest, format_time, validate
from podrun.pystart import is_helper


_MODULES_INIT = (
    "if ! command -v module >/dev/null 2>&1 && [ -f /etc/profile.d/modules.sh ]; then\n"
    "  . /etc/profile.d/modules.sh\n"
    "fi"
)


def _body(req: JobRequest, cd_default: str | None) -> list[str]:
    """The shell part, shared by every scheduler: strict mode, cd, modules, exports, exec the command."""
    lines = [""]
    if req.modules:
        # module scripts often read unset variables: load them before `set -u`
        lines += ["set -eo pipefail", _MODULES_INIT]
        lines += [f"module load {_q(m)}" for m in req.modules]
        lines += ["set -u"]
    else:
        lines += ["set -euo pipefail"]
    if req.workdir is not None:
        lines.append(f"cd {_q(req.workdir)}")
    elif cd_default:
        lines.append(cd_default)
    lines += [f"export {k}={_q(v)}" for k, v in req.env]
    command = [_q(a) for a in req.command]
    if req.ssh_port is not None and "--ssh-config" not in req.command:
        # the sshd between the job's nodes listens on ssh_port: an ssh config in the job's own TMPDIR says so
        # first (the first value ssh reads wins), then the user's own
        lines += ['ssh_config="$(mktemp "${TMPDIR:-/tmp}/podrun-ssh.XXXXXX")"',
                  f"printf 'Host *\\n  Port %s\\n' {req.ssh_port} > \"$ssh_config\"",
                  'if [ -f ~/.ssh/config ]; then cat ~/.ssh/config >> "$ssh_config"; fi']
        at = req.command.index("launch", 1) + 1               # after podrun's `launch`, however PYTHON starts it
        command[at:at] = ["--ssh-config", '"$ssh_config"']
    if is_helper(req.command):
        lines.append("# PYTHON -m podrun launch, but never a podrun/ from the working directory: the -c boot takes it "
                     "off the import path")
    lines.append("exec " + " ".join(command))
    return lines


def _script(req: JobRequest, prefix: str, directives: list[str], how: str, cd: str | None = None) -> str:
    """The whole script: ``directives`` then --directive's, each after ``prefix``; the request's comments (the
    plan's, what it takes from the cluster spec); how it is submitted (``how``: how the job finds its hosts); the
    body (``cd``: its default cd)."""
    head = ["#!/bin/bash"] + [f"{prefix} {x}" for x in (*directives, *req.directives)]
    head += [f"# {c}" if c else "#" for c in req.comments]
    head.append(f"# submit: {' '.join(submit_argv(req, 'SCRIPT'))}; {how}")
    return "\n".join(head + _body(req, cd)) + "\n"


def _slurm(req: JobRequest) -> str:
    d = [f"--job-name={req.job_name}", f"--nodes={req.nodes}", "--ntasks-per-node=1"]
    d += [f"--gpus-per-node={req.devices_per_node}"] if req.device_kind == "gpu" else []
    d += [f"--cpus-per-task={req.cpus_per_node}"] if req.cpus_per_node is not None else []
    d += [f"--time={format_time(req.time_seconds)}"] if req.time_seconds is not None else []
    d += [f"--partition={req.effective_partition}"] if req.effective_partition else []
    d += [f"--account={req.account}"] if req.account else []
    log = req.log_dir.rstrip("/") + "/" if req.log_dir else ""
    d += [f"--output={req.output or log + '%x-%j.out'}", f"--error={req.error or log + '%x-%j.err'}", "--no-requeue"]
    how = f"over {req.launch_transport}" if req.launch_transport else "through its engine"
    return _script(req, "#SBATCH", d, f"podrun launch starts the instances {how} on the hosts of $SLURM_JOB_NODELIST")


def _pbs(req: JobRequest) -> str:
    chunk = f"select={req.nodes}"
    typed = req.queue_sets_node       # the queue sets each node's CPUs and GPUs (ABCI 3.0's guide: users cannot)
    if req.cpus_per_node is not None and not typed:
        chunk += f":ncpus={req.cpus_per_node}"
    if req.device_kind == "gpu" and not typed:
        chunk += f":ngpus={req.devices_per_node}"
    # one PBS_NODEFILE line per agent: the slots Open MPI's mpirun reads from PBS and starts one agent in each
    chunk += f":mpiprocs={req.agents_per_node}"
    d = [f"-N {req.job_name}", "-S /bin/bash", f"-l {chunk}", "-l place=scatter"]
    d += [f"-P {req.group}"] if req.group is not None else []         # ABCI 3.0: the group charged
    d += list(req.site_directives)
    d += _qsub_directives(req, "walltime", req.effective_queue, join="-j oe")
    d.append("-r n")
    return _script(req, "#PBS", d, _reads_hosts(req), cd='cd "$PBS_O_WORKDIR"')


def _qsub_directives(req: JobRequest, wall: str, queue: str | None, join: str) -> list[str]:
    """PBS / Grid Engine wall time (-l ``wall``=), -q, -A and -o/-e (a log directory gets a trailing /); only -o
    given: ``join`` stderr into it."""
    d = [] if req.time_seconds is None else [f"-l {wall}={format_time(req.time_seconds)}"]
    d += [f"-q {queue}"] if queue else []
    d += [f"-A {req.account}"] if req.account else []
    log = req.log_dir.rstrip("/") + "/" if req.log_dir else None
    out, err = req.output or log, req.error or log
    d += [f"-o {out}"] if out else []
    if err:
        d.append(f"-e {err}")
    elif out:
        d.append(join)
    return d


def _uge(req: JobRequest) -> str:
    d = [f"-N {req.job_name}", "-S /bin/bash", "-cwd"]
    d.append(f"-pe {req.pe} {req.nodes}" if req.pe is not None else f"-l {req.resource}={req.nodes}")
    d += _qsub_directives(req, "h_rt", req.queue, join="-j y")
    d += list(req.site_directives)
    return _script(req, "#$", d, _reads_hosts(req))


_RENDERERS = {"slurm": _slurm, "pbs": _pbs, "uge": _uge}


def render(req: JobRequest) -> str:
    """The batch script for req.scheduler: deterministic bytes, every shell value quoted."""
    return _RENDERERS[validate(req).scheduler](req)


def submit_argv(req: JobRequest, script_path: str) -> list[str]:
    """The one command that submits the script, printing the job id alone: `sbatch --parsable PATH`,
    `qsub PATH` (PBS prints the id anyway), `qsub -terse [-g GROUP] PATH` (Grid Engine; ABCI takes the
    group on the command line only). The account is a directive in the script, not repeated here."""
    validate(req)
    if req.scheduler == "slurm":
        return ["sbatch", "--parsable", script_path]
    if req.scheduler == "uge":
        return ["qsub", "-terse"] + (["-g", req.group] if req.group is not None else []) + [script_path]
    return ["qsub", script_path]


def _reads_hosts(req: JobRequest) -> str:
    names = " / ".join(f"${v}" for v in SCHEDULER_TABLE[req.scheduler].hosts_from)
    return f"podrun launch reads the hosts from {names}"

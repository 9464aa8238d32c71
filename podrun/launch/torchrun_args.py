"""torchrun's command line in podrun's words, pure: what to launch (recipe, script, module, command) and torchrun's options mapped onto podrun launch's own."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Callable

from podrun.errors import LaunchError

COMMAND_NOT_FOUND = 127           # the shell's exit code for a command it cannot find, kept for one found missing early
RDZV_DEFAULT_PORT = 29400          # torchrun's port for an --rdzv-endpoint given without one
RECIPE, SCRIPT, MODULE, COMMAND = "recipe", "script", "module", "command"


@dataclass(frozen=True)
class Target:
    """What the workers run: a recipe (its train.py), a Python script or module run by --python, or a command."""

    kind: str                       # RECIPE | SCRIPT | MODULE | COMMAND
    name: str                       # the recipe name or folder, the script's path, the module, the command's program
    args: tuple[str, ...] = ()      # what follows it: the recipe's, script's or module's arguments, the command's

    def worker_command(self, python: str, recipe_script: str | None = None) -> list[str]:
        """The argv every worker runs (``recipe_script``: the recipe's train.py, absolute)."""
        if self.kind == RECIPE:
            return [python, recipe_script or self.name, *self.args]
        if self.kind == SCRIPT:
            return [python, self.name, *self.args]
        if self.kind == MODULE:
            return [python, "-m", self.name, *self.args]
        return [self.name, *self.args]


def classify(args: list[str] | tuple[str, ...], *, dashdash: bool, module: bool = False, no_python: bool = False,
             is_recipe_dir: Callable[[str], bool], is_file: Callable[[str], bool]) -> Target:
    """The target of `podrun launch [OPTIONS] [--] TARGET ARGS...`, as torchrun reads its TRAINING_SCRIPT.

    ``dashdash``: the user wrote ``--`` before the target. ``module``: -m/--module; ``no_python``: --no-python.
    A folder with recipe.yaml is a recipe; with -m the target is a module; with --no-python a command; a path
    ending in .py is a script, with or without ``--``; without ``--`` an existing file is a script and anything
    else a recipe name or path (the recipe loader explains a miss); after ``--`` anything else is a command.
    """
    args = list(args)
    if not args:
        raise LaunchError("nothing to launch",
                          hint="give a recipe (podrun launch recipes/NAME), a script (podrun launch train.py), "
                               "a module (podrun launch -m pkg.train) or a command after -- "
                               "(podrun launch -- ./run.sh)")
    if module and no_python:
        raise LaunchError("-m/--module and --no-python contradict each other (a module needs Python)",
                          hint="drop one: -m runs `python -m MODULE`, --no-python runs the target as a command")
    first, rest = args[0], tuple(args[1:])
    if module:
        return Target(MODULE, first, rest)
    if no_python:
        return Target(COMMAND, first, rest)
    if not dashdash and is_recipe_dir(first):
        return Target(RECIPE, first, recipe_args(rest))
    if first.endswith(".py") or (not dashdash and is_file(first)):
        return Target(SCRIPT, first, rest)
    if dashdash:
        return Target(COMMAND, first, rest)
    return Target(RECIPE, first, recipe_args(rest))


def recipe_args(args: tuple[str, ...]) -> tuple[str, ...]:
    """A recipe's arguments with ``--`` taken out wherever it stands: podrun owns the recipes' parser, and a
    torchrun or mpirun user writes ``recipe --data x -- --steps 30`` meaning the same as without it."""
    if "--" not in args:
        return args
    i = args.index("--")
    return args[:i] + args[i + 1:]


def command_hint(program: str, workdir: str, *, on_path: Callable[[str], bool],
                 is_file: Callable[[str], bool]) -> LaunchError | None:
    """The error for a command whose program this machine cannot start from ``workdir`` (None: it can):
    a bare name not on PATH, naming the file of that name in the working directory when there is one."""
    if os.sep in program or on_path(program):
        return None
    here = os.path.join(workdir, program)
    if is_file(here):
        how = (f"podrun launch {program} (a Python script, run by --python as torchrun runs it)"
               if _looks_python(program) else f"-- ./{program}")
        return LaunchError(f"cannot start {program!r}: it is not on PATH, and a command after -- runs as the "
                           f"shell would run it; the file {here} is in the working directory",
                           hint=f"write {how}", exit_code=COMMAND_NOT_FOUND)
    return LaunchError(f"cannot start {program!r}: no such command on PATH",
                       hint="give its path (./NAME or /path/NAME), or a script: podrun launch train.py",
                       exit_code=COMMAND_NOT_FOUND)


def _looks_python(program: str) -> bool:
    return program.endswith(".py")


# --- torchrun's options --------------------------------------------------------------------------

@dataclass(frozen=True)
class TorchrunOptions:
    """torchrun's options as given on podrun launch's command line (None: not given)."""

    nproc_per_node: str | None = None   # N | auto | cpu | gpu
    nnodes: str | None = None           # N | MIN:MAX
    standalone: bool = False
    rdzv_endpoint: str | None = None    # HOST[:PORT]
    rdzv_id: str | None = None
    node_rank: int | None = None
    log_dir: str | None = None
    redirects: str | None = None
    tee: str | None = None


@dataclass(frozen=True)
class OwnOptions:
    """podrun launch's own options that torchrun's map onto (None: not given)."""

    devices_per_host: int | None = None
    nodes: int | None = None
    elastic_min: int | None = None
    max_restarts: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    run_id: str | None = None
    runs_dir: str | None = None


def reconcile(tr: TorchrunOptions, own: OwnOptions, *, cpu_count: int) -> OwnOptions:
    """podrun's options with torchrun's mapped in (the table in docs/launch.md). A torchrun option and
    podrun's own option of the same meaning must agree; one podrun has no meaning for is refused, saying why."""
    out = own
    if tr.node_rank is not None:
        raise LaunchError(
            f"--node-rank {tr.node_rank}: podrun places the instances itself; one podrun launch on one machine "
            "starts every host's instance and gives each its GROUP_RANK",
            hint="run podrun launch once (not once per node), naming the hosts with --hosts h1,h2 or --hostfile")
    if tr.nproc_per_node is not None:
        out = _set(out, "devices_per_host", _nproc(tr.nproc_per_node, cpu_count),
                   f"--nproc-per-node {tr.nproc_per_node}", "--devices-per-host")
    if tr.nnodes is not None:
        low, high = _nnodes(tr.nnodes)
        out = _set(out, "nodes", high, f"--nnodes {tr.nnodes}", "--nodes")
        if low != high:
            out = _set(out, "elastic_min", low, f"--nnodes {tr.nnodes}", "--elastic")
    if tr.standalone:
        if out.nodes is not None and out.nodes != 1:
            raise LaunchError(f"--standalone runs one node, and --nnodes/--nodes asks for {out.nodes}",
                              hint="drop --standalone to run on several hosts")
        if tr.rdzv_endpoint is not None:
            raise LaunchError("--standalone picks its own rendezvous port on this machine; drop --rdzv-endpoint",
                              hint="or drop --standalone and keep --rdzv-endpoint")
        out = replace(out, nodes=1)
        out = _set(out, "master_port", 0, "--standalone", "--master-port")
    if tr.rdzv_endpoint is not None:
        host, port = parse_endpoint(tr.rdzv_endpoint)
        out = _set(out, "master_addr", host, f"--rdzv-endpoint {tr.rdzv_endpoint}", "--master-addr")
        out = _set(out, "master_port", port, f"--rdzv-endpoint {tr.rdzv_endpoint}", "--master-port")
    if tr.rdzv_id is not None:
        out = _set(out, "run_id", tr.rdzv_id, f"--rdzv-id {tr.rdzv_id}", "--run-id")
    if tr.log_dir is not None:
        out = _set(out, "runs_dir", tr.log_dir, f"--log-dir {tr.log_dir}", "--runs-dir")
    if tr.redirects is not None and tr.redirects != "0":
        raise LaunchError(
            f"--redirects {tr.redirects}: podrun shows every worker's output on the console and also writes it to "
            "the run directory (instance-N.log); it has no mode that takes output off the console",
            hint="drop --redirects (podrun's logs are already in the run directory), or send the console to "
                 "/dev/null; --only-output-from-instance N shows stdout of one instance only")
    if tr.tee is not None:
        _check_streams("--tee", tr.tee)
    return out


def _set(out: OwnOptions, field: str, value, theirs: str, ours: str) -> OwnOptions:
    have = getattr(out, field)
    if have is not None and have != value:
        raise LaunchError(f"{theirs} means {ours} {value}, and {ours} {have} is given too",
                          hint=f"give one of them ({theirs} is torchrun's spelling of podrun's {ours})")
    return replace(out, **{field: value})


def _nproc(value: str, cpu_count: int) -> int | None:
    """--nproc-per-node: N workers; auto: the cluster spec's devices (this machine: one worker per core, as
    torchrun's auto without an accelerator); cpu: this machine's cores, as torchrun counts them; gpu: the
    cluster spec's devices, which must be GPUs (check_nproc_kind)."""
    from podrun.specs.limits import MAX_PER_HOST

    text = value.strip()
    if text.isascii() and text.isdigit():
        if len(text) > 12 or not 1 <= int(text) <= MAX_PER_HOST:
            raise LaunchError(f"--nproc-per-node {text[:20]}{'...' if len(text) > 20 else ''}: a node runs at least "
                              f"one worker and at most {MAX_PER_HOST}",
                              hint=f"give N in 1..{MAX_PER_HOST}, or auto, cpu or gpu")
        return int(text)
    if text in ("auto", "gpu"):
        return None
    if text == "cpu":
        return cpu_count
    raise LaunchError(f"--nproc-per-node {value!r} is not a number of workers",
                      hint="give N (workers per host), auto (the cluster's devices per host), cpu (this machine's "
                           "cores) or gpu (the cluster's GPUs per host)")


def check_nproc_kind(tr: TorchrunOptions, device_kind: str, cluster_name: str) -> None:
    """--nproc-per-node gpu on a cluster whose devices are not GPUs is refused, as torchrun refuses it without CUDA."""
    if tr.nproc_per_node is not None and tr.nproc_per_node.strip() == "gpu" and device_kind != "gpu":
        raise LaunchError(f"--nproc-per-node gpu: cluster {cluster_name!r} has {device_kind} devices, not GPUs",
                          hint="use --nproc-per-node auto (the cluster's devices) or N, or a GPU cluster (--cluster)")


def _nnodes(value: str) -> tuple[int, int]:
    parts = value.split(":")
    try:
        if len(parts) not in (1, 2) or not all(p.strip().isascii() for p in parts):
            raise ValueError
        low, high = int(parts[0]), int(parts[-1])
    except ValueError:
        raise LaunchError(f"--nnodes {value!r} is neither N nor MIN:MAX",
                          hint="e.g. --nnodes 2 (two hosts) or --nnodes 1:2 (elastic: start on 2, go on down to 1)"
                          ) from None
    if low < 1 or high < low:
        raise LaunchError(f"--nnodes {value}: need 1 <= MIN <= MAX", hint="e.g. --nnodes 1:2")
    return low, high


def parse_endpoint(value: str) -> tuple[str, int]:
    """HOST[:PORT] ([V6]:PORT for IPv6) -> (host, port); no port: torchrun's 29400."""
    text = value.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else None
        if not sep or (rest and port_text is None):
            raise LaunchError(f"--rdzv-endpoint {value!r} is not HOST:PORT", hint="e.g. --rdzv-endpoint [fd00::1]:29400")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, None
    if not host:
        raise LaunchError(f"--rdzv-endpoint {value!r} names no host", hint="e.g. --rdzv-endpoint node1:29400")
    if ":" in host and not text.startswith("["):
        raise LaunchError(f"--rdzv-endpoint {value!r} is not one HOST:PORT",
                          hint="give one host and one port, e.g. --rdzv-endpoint node1:29400 (an IPv6 address in "
                               "brackets: [fd00::1]:29400)")
    if port_text is None:
        return host, RDZV_DEFAULT_PORT
    if not (port_text.isascii() and port_text.isdigit()) or len(port_text) > 5 or not 1 <= int(port_text) <= 65535:
        raise LaunchError(f"--rdzv-endpoint {value!r}: {port_text!r} is not a TCP port",
                          hint="give a port in 1..65535, e.g. --rdzv-endpoint node1:29400")
    return host, int(port_text)


def _check_streams(option: str, value: str) -> None:
    """torchrun's stream spec: 0-3, or LOCAL_RANK:0-3 pairs separated by commas."""
    parts = [p.strip() for p in value.split(",")]
    ok = value.strip() in ("0", "1", "2", "3") or all(
        len(p.split(":")) == 2 and p.split(":")[0].isdigit() and p.split(":")[1] in ("0", "1", "2", "3")
        for p in parts)
    if not ok:
        raise LaunchError(f"{option} {value!r} is not a stream choice",
                          hint="torchrun's form: 0 none, 1 stdout, 2 stderr, 3 both, or per local rank (0:3,1:1)")

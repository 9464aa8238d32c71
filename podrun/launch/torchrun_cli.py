"""torchrun's own command line, pure: what to launch (recipe, script, module, command), its options as given."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Mapping

from podrun import pystart
from podrun.errors import LaunchError

COMMAND_NOT_FOUND = 127           # the shell's exit code for a command it cannot find, kept for one found missing early
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
            return pystart.target(python, "script", recipe_script or self.name, self.args)
        if self.kind in (SCRIPT, MODULE):
            return pystart.target(python, self.kind, self.name, self.args)
        return [self.name, *self.args]


def classify(args: list[str] | tuple[str, ...], *, dashdash: bool, module: bool = False, no_python: bool = False,
             run_path: bool = False, is_recipe_dir: Callable[[str], bool], is_file: Callable[[str], bool],
             option_names: frozenset[str] = frozenset()) -> Target:
    """The target of `podrun launch [OPTIONS] [--] TARGET ARGS...`, as torchrun reads its TRAINING_SCRIPT.

    ``dashdash``: the user wrote ``--`` before the target. ``module``: -m/--module; ``no_python``: --no-python;
    ``run_path``: --run-path (the target is a Python file, whatever -m or --no-python say, as under torchrun).
    Without ``--``, a target that starts with ``-`` is an option podrun does not know (``option_names``: those
    it knows, for the did-you-mean), never a recipe, script, module or command.
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
    first, rest = args[0], tuple(args[1:])
    if not dashdash and first.startswith("-") and first != "-":
        import difflib

        name = first.split("=", 1)[0]
        close = difflib.get_close_matches(name, sorted(option_names), n=1, cutoff=0.75)
        raise LaunchError(f"no such option: {name} (neither podrun launch's nor torchrun's)",
                          hint=(f"did you mean {close[0]}? " if close else "")
                          + "podrun launch --help lists them; an argument meant for the script goes after it")
    if run_path:
        return Target(SCRIPT, first, rest)
    if module and no_python:
        raise LaunchError("-m/--module and --no-python contradict each other (a module needs Python)",
                          hint="drop one: -m runs `python -m MODULE`, --no-python runs the target as a command")
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
               if program.endswith(".py") else f"-- ./{program}")
        return LaunchError(f"cannot start {program!r}: it is not on PATH, and a command after -- runs as the "
                           f"shell would run it; the file {here} is in the working directory",
                           hint=f"write {how}", exit_code=COMMAND_NOT_FOUND)
    return LaunchError(f"cannot start {program!r}: no such command on PATH",
                       hint="give its path (./NAME or /path/NAME), or a script: podrun launch train.py",
                       exit_code=COMMAND_NOT_FOUND)


# --- torchrun's options --------------------------------------------------------------------------

# torchrun's options read from PET_<NAME> when not given (torch.distributed.argparse_util env/check_env): every
# one but --logs-specs and --numa-binding; the flags take 0 or 1. The names are the click parameters' names.
PET_VALUES = ("nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf",
              "max_restarts", "monitor_interval", "start_method", "event_log_handler", "role", "log_dir", "redirects",
              "tee", "local_ranks_filter", "duplicate_stdout_filters", "duplicate_stderr_filters", "node_rank",
              "master_addr", "master_port", "local_addr", "signals_to_handle", "shutdown_timeout")
PET_FLAGS = ("standalone", "module", "no_python", "run_path", "virtual_local_rank")


def pet_name(name: str) -> str:
    """torchrun's variable for an option: PET_ and the option's name in capitals (nproc_per_node: PET_NPROC_PER_NODE)."""
    return f"PET_{name.upper()}"


def pet_values(environ, given) -> dict[str, object]:
    """torchrun's options read from PET_<NAME> (``environ``) for those not on the command line (``given``: the
    parameter names given there): flag > PET_ > default, as torchrun reads them. A flag's variable must be an
    integer (torchrun's bool(int(...))); an empty variable counts as not set."""
    out: dict[str, object] = {}
    for name in (*PET_VALUES, *PET_FLAGS):
        var = pet_name(name)
        text = environ.get(var)
        if name in given or text is None or text == "":
            continue
        if name in PET_FLAGS:
            try:
                out[name] = int(text) != 0
            except ValueError:
                raise LaunchError(f"{var}={text!r} is not 0 or 1 (torchrun's --{name.replace('_', '-')} from the "
                                  "environment)", hint=f"set {var}=1 or {var}=0, or unset it") from None
        else:
            out[name] = text
    return out


@dataclass(frozen=True)
class TorchrunOptions:
    """torchrun's options as given on podrun launch's command line or in PET_ variables (None: not given).
    ``spelled``: how the user wrote each given option, by parameter name (``--nproc_per_node``,
    ``PET_NPROC_PER_NODE``), for messages in the user's words; podrun's own options are there too."""

    nproc_per_node: str | None = None   # N | auto | cpu | gpu
    nnodes: str | None = None           # N | MIN:MAX
    standalone: bool = False
    rdzv_endpoint: str | None = None    # HOST[:PORT]
    rdzv_id: str | None = None
    node_rank: str | None = None
    log_dir: str | None = None
    redirects: str | None = None
    tee: str | None = None
    rdzv_backend: str | None = None     # c10d | static
    rdzv_conf: str | None = None        # KEY=VALUE,...
    monitor_interval: str | None = None
    start_method: str | None = None
    event_log_handler: str | None = None
    role: str | None = None
    run_path: bool = False
    local_ranks_filter: str | None = None
    duplicate_stdout_filters: str | None = None
    duplicate_stderr_filters: str | None = None
    local_addr: str | None = None
    logs_specs: str | None = None
    numa_binding: str | None = None
    signals_to_handle: str | None = None
    shutdown_timeout: str | None = None
    virtual_local_rank: bool = False
    spelled: Mapping[str, str] = field(default_factory=dict, compare=False)

    def said(self, name: str, value: object = None) -> str:
        """The option ``name`` as the user gave it: ``--nproc_per_node 2``, ``PET_NPROC_PER_NODE=2``, ``--standalone``
        (``value`` None: the spelling alone)."""
        how = self.spelled.get(name) or "--" + name.replace("_", "-")
        if value is None or value is True:
            return f"{how}=1" if how.startswith("PET_") and value is True else how
        return f"{how}={value}" if how.startswith("PET_") else f"{how} {value}"

    def from_env(self, name: str) -> bool:
        return self.spelled.get(name, "").startswith("PET_")


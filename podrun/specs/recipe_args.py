"""A recipe's command line as the controller knows it before anything starts (recipes/*/train.py parse it through
podrun.train.recipe_main): the parser, the check of its arguments, what they need on each worker and how long they
run. Torch-free: `podrun launch` and `podrun plan` read it."""
from __future__ import annotations

import argparse
import shlex
from typing import Sequence

from podrun.errors import SpecError

RECIPE_MAIN = "podrun.train.recipe_main"   # the module whose main() a recipe's train.py runs
KEEP_CHECKPOINTS = 2                       # --keep-checkpoints' default (TrainConfig.keep_checkpoints)


def parser(recipe_name: str, default_data: str = "synthetic", cls=argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = cls(
        prog=f"{recipe_name}/train.py",
        description=f"Train the {recipe_name} recipe. Runs standalone, under torchrun, srun, mpirun or podrun launch.")
    a = p.add_argument
    a("--data", default=default_data, help="digits | synthetic | a CIFAR-10 folder | an ImageNet-style folder | "
                                          f"its shards from podrun data pack (default {default_data})")
    a("--epochs", type=float, default=None, help="epochs (default: the plan's, else the recipe's)")
    a("--steps", type=int, default=None, help="stop after this many weight updates")
    a("--deterministic", action="store_true", help="deterministic algorithms (slower)")
    a("--seed", type=int, default=0, help="the same on every worker: equal initial weights without a broadcast")
    a("--checkpoint-every", type=int, default=0, metavar="STEPS", help="checkpoint every N updates (and at the end)")
    a("--checkpoint-dir", default=None, help="default: <run dir>/checkpoints")
    a("--keep-checkpoints", type=int, default=KEEP_CHECKPOINTS, metavar="N",
      help=f"keep the newest N checkpoints (default {KEEP_CHECKPOINTS}); 0: none once the run finishes")
    a("--no-resume", action="store_true", help="ignore existing checkpoints and snapshots")
    a("--no-snapshots", action="store_true",
      help="keep no in-memory snapshot after each update (under podrun launch a restart then resumes from disk)")
    a("--no-inplace", action="store_true",
      help="after a lost host under podrun launch --elastic, restart every worker instead of recovering in place")
    a("--run-dir", default=None, help="default: $PODRUN_RUN_DIR, else runs/<recipe>-<time>")
    a("--amp", default=None, choices=["auto", "off", "bf16", "fp16"],
      help="mixed precision (default: the recipe's precision on CUDA, off on CPU)")
    a("--channels-last", action="store_true", help="NHWC memory format (faster convs on GPU)")
    a("--compile", action="store_true", help="torch.compile the model")
    a("--fsdp", action="store_true", help="shard parameters, gradients and optimizer state (FSDP) instead of DDP")
    a("--local-batch", type=int, default=None, help="default: $PODRUN_LOCAL_BATCH, else global / workers")
    a("--grad-accum", type=int, default=None, help="default: $PODRUN_GRAD_ACCUM, else 1")
    a("--global-batch", type=int, default=None, help="default: $PODRUN_GLOBAL_BATCH, else the recipe's")
    a("--lr", type=float, default=None,
      help="peak learning rate (default: the plan's, else recipe lr scaled by its rule)")
    a("--warmup-epochs", type=float, default=None)
    a("--image-size", type=int, default=None, help="default: the recipe's dataset.image_size")
    a("--norm", choices=["batch", "group"], default=None, help="model normalisation (default: the recipe's)")
    a("--device", default="auto", choices=["auto", "cpu", "cuda", "ipu"])
    a("--eval-every", type=int, default=1, metavar="EPOCHS", help="0: only at the end")
    a("--log-every", type=int, default=10, metavar="STEPS")
    a("--threads", type=int, default=None, help="CPU threads per worker")
    a("--loader-workers", type=int, default=None, metavar="N",
      help="loader processes per worker that decode and augment images (default: its share of the host's cores "
           "for an image folder, 0 for data held in memory)")
    a("--bad-samples", choices=["fail", "skip"], default="fail",
      help="an image that does not decode: stop with its path (fail, the default) or skip it, counted (skip)")
    a("--stage", action="store_true",
      help="copy --data's tar shards (podrun data pack) to each host's node-local disk ($SLURM_TMPDIR, "
           "$SGE_LOCALDIR, $PBS_LOCALDIR or the cluster spec's local_disk:) once per job, and read them there")
    a("--synthetic-size", type=int, default=None, help="samples per synthetic epoch (default: 20 global batches)")
    a("--quiet", action="store_true", help="no console line per step")
    return p


def option_table() -> dict[str, bool]:
    """The recipe parser's options, each spelling -> whether it takes a value (what `podrun script` and `submit`
    read after a recipe as the recipe's, as launch passes them on)."""
    return {s: a.nargs != 0 for a in parser("recipe")._actions for s in a.option_strings if s not in ("-h", "--help")}


LONG_RUN_HOURS = 1.0        # a recipe run estimated longer than this is announced before it starts


def check_recipe(rspec, argv: Sequence[str]) -> argparse.Namespace | None:
    """check_args for a recipe spec whose train.py runs RECIPE_MAIN's parser; its arguments as that train.py reads
    them (None: a train.py with a parser of its own, which podrun does not check)."""
    import os

    script = os.path.abspath(os.path.join(rspec.path, rspec.train_script))
    data = default_data(script)
    if data is None:
        return None
    check_args(os.path.basename(os.path.abspath(rspec.path)), argv, os.path.relpath(script))
    return parse_known(argv, data)


# a job on synthetic data nobody asked for that the planner estimates past this many node-hours is said when its
# script is written (each node charged for the run's wall time): 49 min on 2 nodes is 1.6 node-hours
SYNTHETIC_NODE_HOURS = 1.0


def refuse_long_synthetic(argv: Sequence[str], args: argparse.Namespace | None, plan) -> str | None:
    """For a job script: the refusal of a long run on synthetic data nobody asked for, which the job's launch would
    give after the queue wait (``args``: check_recipe's; None refuses nothing); else the notice to print on stderr
    for one whose node-hours (the estimate's hours x the plan's hosts) pass SYNTHETIC_NODE_HOURS, however short its
    wall time (None: none to say)."""
    if args is None:
        return None
    notice, refusal = synthetic_data(argv, args, plan, LONG_RUN_HOURS)
    if refusal is not None:
        raise refusal
    hours = _hours(args, plan) if notice is not None else None
    nodes = len(dict.fromkeys(plan.hosts))
    if hours is None or hours[0] * nodes <= SYNTHETIC_NODE_HOURS:
        return None
    from podrun.human import human_seconds

    return (f"{notice}; the planner estimates {human_seconds(hours[0] * 3600)} on {nodes} node(s) "
            f"({hours[0] * nodes:,.1f} node-hours, {hours[1]} on cluster {plan.cluster})")


class _Refusal(argparse.ArgumentParser):
    """The recipe parser, raising instead of printing its usage and exiting."""

    def error(self, message):
        raise _ArgsError(message)


class _ArgsError(Exception):
    pass


def check_args(recipe_name: str, argv: Sequence[str], script: str) -> None:
    """Parse a recipe's arguments as its train.py will (on the controller, before anything starts): a
    SpecError (exit 2) naming the recipe and what is wrong, instead of every rank printing its usage."""
    try:
        parser(recipe_name, cls=_Refusal).parse_args(list(argv))
    except _ArgsError as exc:
        raise SpecError(f"{recipe_name}/train.py would refuse its arguments ({shlex.join(argv) or 'none'}): {exc}",
                        hint=f"python {script} --help lists its options") from None


DATA_NAMES = ("digits", "synthetic")        # the data sets --data names rather than a folder


def check_local_data(recipe_name: str, data: str, workdir: str) -> None:
    """``--data`` for workers on this machine: a data set's name, or a folder that exists (relative to ``workdir``);
    else a SpecError (exit 2) before anything starts, with the name it most likely meant, instead of every rank
    refusing it after the start."""
    import difflib
    import os

    if data in DATA_NAMES or os.path.exists(os.path.join(workdir, data)):
        return
    near = difflib.get_close_matches(data, DATA_NAMES, n=1)
    raise SpecError(f"{recipe_name}/train.py --data {data!r}: no data set of that name and no such path in {workdir}",
                    hint=(f"did you mean --data {near[0]}? " if near else "") +
                    f"pass {REAL_DATA}; or --data synthetic")


def default_data(script: str) -> str | None:
    """For a recipe's train.py that runs RECIPE_MAIN's main(): the ``default_data`` it passes (read from its
    source without running it; "synthetic" when it passes none). None for a train.py with a parser of its own."""
    import ast

    try:
        with open(script, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    shared = any(isinstance(n, ast.ImportFrom) and n.module == RECIPE_MAIN or
                 isinstance(n, ast.Import) and any(a.name == RECIPE_MAIN for a in n.names) for n in ast.walk(tree))
    if not shared:
        return None
    return next((str(node.value.value) for node in ast.walk(tree) if isinstance(node, ast.keyword)
                 and node.arg == "default_data" and isinstance(node.value, ast.Constant)), "synthetic")


def parse_known(argv: Sequence[str], default: str = "synthetic") -> argparse.Namespace:
    """A recipe's arguments as its train.py reads them (unknown ones ignored; check_args refuses those)."""
    return parser("recipe", default).parse_known_args(list(argv))[0]


def needed_modules(args: argparse.Namespace) -> list[str]:
    """What a recipe's train.py imports on every worker: podrun's own yaml, the ``train`` extra's torch and
    numpy, and scikit-learn for ``--data digits``."""
    return ["yaml", "torch", "numpy"] + (["sklearn"] if args.data == "digits" else [])


def _hours(args: argparse.Namespace, plan) -> tuple[float, str] | None:
    """The planner's hours for the run ``args`` ask (and what: "20 steps", "90 epochs"); None where no estimate
    applies (the offline digits set is small whatever the recipe)."""
    est = plan.estimate
    if args.data == "digits" or est.images_per_second <= 0:
        return None
    if args.steps is not None:
        return args.steps * est.step_seconds / 3600, f"{args.steps} steps"
    epochs = args.epochs if args.epochs is not None else plan.epochs
    return (est.time_to_train_hours * epochs / plan.epochs if plan.epochs > 0 else 0.0), f"{epochs:g} epochs"


def data_given(argv: Sequence[str]) -> bool:
    """Whether a recipe's arguments name --data (as --data X or --data=X)."""
    return any(a == "--data" or a.startswith("--data=") for a in argv)


REAL_DATA = ("--data DIR after the recipe (a CIFAR-10 folder: data_batch_1..5, test_batch; or an ImageNet-style "
             "folder: train/<class>/*.jpg), or --data digits for the small offline set")


def long_run(argv: Sequence[str], args: argparse.Namespace, plan, threshold_hours: float) -> str | None:
    """What to say before a run the planner estimates longer than ``threshold_hours`` (None: shorter, or no
    estimate applies). ``argv``: the recipe's arguments, ``args`` as parsed (parse_known), ``plan``: the run's Plan."""
    hours = _hours(args, plan)
    if hours is None or hours[0] <= threshold_hours:
        return None
    est = plan.estimate
    data = f"--data {args.data}" if data_given(argv) else f"{args.data} data (no --data given)"
    return (f"the planner estimates {hours[0]:,.2f} h for {hours[1]} of {plan.recipe} on cluster {plan.cluster} "
            f"({est.images_per_second:,.0f} img/s, {est.step_seconds:,.1f} s per step of global batch "
            f"{plan.global_batch}), on {data}; for a short run give --steps N or --epochs E after the recipe, "
            "and --global-batch B before it for shorter steps")


def synthetic_data(argv: Sequence[str], args: argparse.Namespace, plan, threshold_hours: float) \
        -> tuple[str | None, SpecError | None]:
    """A recipe given no --data that trains on synthetic data (its default): the notice to say before it starts,
    and, for a run the planner estimates longer than ``threshold_hours``, the refusal (exit 2) that only an explicit
    ``--data synthetic`` lifts. (None, None) where --data was given or the default is a real data set."""
    if data_given(argv) or args.data != "synthetic":
        return None, None
    notice = (f"no --data given: {plan.recipe} trains on synthetic data (random images: its loss and accuracy say "
              f"nothing of the model); for real data pass {REAL_DATA}")
    hours = _hours(args, plan)
    if hours is None or hours[0] <= threshold_hours:
        return notice, None
    from podrun.human import human_seconds

    return notice, SpecError(
        f"no --data given: {plan.recipe} would train on synthetic data for {human_seconds(hours[0] * 3600)} "
        f"({hours[1]} on cluster {plan.cluster}: the planner's estimate)",
        hint=f"pass {REAL_DATA}; --data synthetic to train on synthetic data anyway; --steps N or --epochs E "
             "after the recipe for a short run")

"""The shared command line of recipes/*/train.py: arguments + recipe.yaml + plan.json -> TrainConfig -> train()."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any, Sequence

from podrun.errors import PodrunError
from podrun.train.config import TrainConfig


def parser(recipe_name: str, default_data: str = "synthetic", cls=argparse.ArgumentParser) -> argparse.ArgumentParser:
    p = cls(
        prog=f"{recipe_name}/train.py",
        description=f"Train the {recipe_name} recipe. Runs standalone, under torchrun, srun, mpirun or podrun launch.")
    a = p.add_argument
    a("--data", default=default_data, help="digits | synthetic | a CIFAR-10 folder | an ImageNet-style folder "
                                          f"(default {default_data})")
    a("--epochs", type=float, default=None, help="epochs (default: the plan's, else the recipe's)")
    a("--steps", type=int, default=None, help="stop after this many weight updates")
    a("--deterministic", action="store_true", help="deterministic algorithms (slower)")
    a("--seed", type=int, default=0, help="the same on every worker: equal initial weights without a broadcast")
    a("--checkpoint-every", type=int, default=0, metavar="STEPS", help="checkpoint every N updates (and at the end)")
    a("--checkpoint-dir", default=None, help="default: <run dir>/checkpoints")
    a("--keep-checkpoints", type=int, default=TrainConfig.keep_checkpoints, metavar="N",
      help=f"keep the newest N checkpoints (default {TrainConfig.keep_checkpoints}); 0: none once the run finishes")
    a("--no-resume", action="store_true", help="ignore existing checkpoints and snapshots")
    a("--no-snapshots", action="store_true",
      help="keep no in-memory snapshot after each update (under podrun launch a restart then resumes from disk)")
    a("--run-dir", default=None, help="default: $PODRUN_RUN_DIR, else runs/<recipe>-<time>")
    a("--amp", default=None, choices=["auto", "off", "bf16", "fp16"],
      help="mixed precision (default: the recipe's precision on CUDA, off on CPU)")
    a("--channels-last", action="store_true", help="NHWC memory format (faster convs on GPU)")
    a("--compile", action="store_true", help="torch.compile the model")
    a("--fsdp", action="store_true", help="shard parameters, gradients and optimizer state (FSDP) instead of DDP")
    a("--local-batch", type=int, default=None, help="default: $PODRUN_LOCAL_BATCH, else global / workers")
    a("--grad-accum", type=int, default=None, help="default: $PODRUN_GRAD_ACCUM, else 1")
    a("--global-batch", type=int, default=None, help="default: $PODRUN_GLOBAL_BATCH, else the recipe's")
    a("--lr", type=float, default=None, help="peak learning rate (default: the plan's, else recipe lr scaled by its rule)")
    a("--warmup-epochs", type=float, default=None)
    a("--image-size", type=int, default=None, help="default: the recipe's dataset.image_size")
    a("--norm", choices=["batch", "group"], default=None, help="model normalisation (default: the recipe's)")
    a("--device", default="auto", choices=["auto", "cpu", "cuda", "ipu"])
    a("--eval-every", type=int, default=1, metavar="EPOCHS", help="0: only at the end")
    a("--log-every", type=int, default=10, metavar="STEPS")
    a("--threads", type=int, default=None, help="CPU threads per worker")
    a("--synthetic-size", type=int, default=None, help="samples per synthetic epoch (default: 20 global batches)")
    a("--quiet", action="store_true", help="no console line per step")
    return p


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
        from podrun.errors import SpecError

        raise SpecError(f"{recipe_name}/train.py would refuse its arguments ({shlex.join(argv) or 'none'}): {exc}",
                        hint=f"python {script} --help lists its options") from None


def default_data(script: str) -> str | None:
    """For a recipe's train.py that runs this module's main(): the ``default_data`` it passes (read from its
    source without running it; "synthetic" when it passes none). None for a train.py with a parser of its own."""
    import ast

    try:
        with open(script, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    shared = any(isinstance(n, ast.ImportFrom) and n.module == __name__ or
                 isinstance(n, ast.Import) and any(a.name == __name__ for a in n.names) for n in ast.walk(tree))
    if not shared:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "default_data" and isinstance(node.value, ast.Constant):
            return str(node.value.value)
    return "synthetic"


def parse_known(argv: Sequence[str], default: str = "synthetic") -> argparse.Namespace:
    """A recipe's arguments as its train.py reads them (unknown ones ignored; check_args refuses those)."""
    return parser("recipe", default).parse_known_args(list(argv))[0]


def needed_modules(args: argparse.Namespace) -> list[str]:
    """What a recipe's train.py imports on every worker: podrun's own yaml, the ``train`` extra's torch and
    numpy, and scikit-learn for ``--data digits``."""
    return ["yaml", "torch", "numpy"] + (["sklearn"] if args.data == "digits" else [])


def long_run(argv: Sequence[str], args: argparse.Namespace, plan, threshold_hours: float) -> str | None:
    """What to say before a run the planner estimates longer than ``threshold_hours`` (None: shorter, or no
    estimate applies: the offline digits set is small whatever the recipe). ``argv``: the recipe's arguments,
    ``args`` as parsed (parse_known), ``plan``: the run's Plan."""
    est = plan.estimate
    if args.data == "digits" or est.images_per_second <= 0:
        return None
    if args.steps is not None:
        hours, what = args.steps * est.step_seconds / 3600, f"{args.steps} steps"
    else:
        epochs = args.epochs if args.epochs is not None else plan.epochs
        hours = est.time_to_train_hours * epochs / plan.epochs if plan.epochs > 0 else 0.0
        what = f"{epochs:g} epochs"
    if hours <= threshold_hours:
        return None
    given = any(a == "--data" or a.startswith("--data=") for a in argv)
    data = f"--data {args.data}" if given else f"{args.data} data (no --data given)"
    return (f"the planner estimates {hours:,.2f} h for {what} of {plan.recipe} on cluster {plan.cluster} "
            f"({est.images_per_second:,.0f} img/s, {est.step_seconds:,.1f} s per step of global batch "
            f"{plan.global_batch}), on {data}; for a short run give --steps N or --epochs E after the recipe, "
            "and --global-batch B before it for shorter steps")


def build_config(recipe, args: argparse.Namespace, plan: dict | None, overrides: dict[str, Any] | None = None):
    """TrainConfig from the recipe (podrun.specs.RecipeSpec), the plan (dict or None) and the arguments."""
    ds, opt, sch = recipe.dataset, recipe.optimizer, recipe.schedule
    from podrun import models

    known = models.options(recipe.model.name)
    image_size = args.image_size or ds.image_size
    model_kwargs: dict[str, Any] = {}
    for key, value in (("norm", recipe.model.norm), ("stem", recipe.model.stem),
                       ("classifier", recipe.model.classifier), ("norm", args.norm)):
        if value and key in known and (key != "norm" or value in ("batch", "group")):
            model_kwargs[key] = value
    if "image_size" in known:
        model_kwargs["image_size"] = image_size
    num_classes = ds.num_classes
    if args.data == "digits":
        num_classes = max(num_classes, 10)
    global_batch = args.global_batch
    if global_batch is None and args.local_batch is None and not os.environ.get("PODRUN_GLOBAL_BATCH"):
        global_batch = recipe.global_batch
    lr, warmup, epochs = args.lr, args.warmup_epochs, args.epochs
    if plan is not None:
        lr = plan["learning_rate"] if lr is None else lr
        warmup = plan["warmup_epochs"] if warmup is None else warmup
        epochs = plan["epochs"] if epochs is None and args.steps is None else epochs
    if epochs is None and args.steps is None:
        epochs = recipe.epochs
    precision = recipe.precision
    amp = args.amp or {"fp16": "fp16", "bf16": "bf16", "amp": "auto", "fp32": "off"}[precision]
    if amp == "fp16" and args.amp is None:
        amp = "auto_fp16"
    cfg = TrainConfig(
        model=recipe.model.name, model_kwargs=model_kwargs, name=recipe.name, data=args.data,
        image_size=image_size, num_classes=num_classes,
        synthetic_size=0 if args.synthetic_size is None else args.synthetic_size, epochs=epochs, steps=args.steps,
        local_batch=args.local_batch, grad_accum=args.grad_accum, global_batch=global_batch,
        lr=lr, warmup_epochs=warmup, lr_base=recipe.lr.base, lr_reference_batch=recipe.lr.reference_batch,
        lr_rule=recipe.lr.rule, warmup_base=sch.warmup_epochs, warmup_rule=recipe.lr.warmup_rule,
        optimizer=opt.name, momentum=opt.momentum, weight_decay=opt.weight_decay, nesterov=opt.nesterov,
        eeta=opt.eeta, eps=None if opt.name in ("rmsprop", "sgd", "lars") else opt.eps, betas=tuple(opt.betas),
        rho=opt.alpha, exclude_bias_and_norm=opt.exclude_bias_and_norm,
        schedule=sch.name, power=sch.power, end_factor=sch.end_factor, gamma=sch.gamma,
        step_epochs=(sch.milestones[0] if sch.milestones else None),
        label_smoothing=recipe.label_smoothing, mixup=recipe.mixup, cutmix=recipe.cutmix,
        amp=amp, channels_last=args.channels_last, compile=args.compile, fsdp=args.fsdp,
        deterministic=args.deterministic, seed=args.seed, device=args.device, threads=args.threads,
        run_dir=args.run_dir, checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints, resume=not args.no_resume, snapshots=not args.no_snapshots,
        eval_every=args.eval_every,
        log_every=args.log_every, console=not args.quiet,
    )
    for k, v in (overrides or {}).items():
        setattr(cfg, k, v)
    return cfg


def main(recipe_dir: str, argv: Sequence[str] | None = None, default_data: str = "synthetic",
         overrides: dict[str, Any] | None = None) -> int:
    """Entry point of a recipe's train.py; PodrunError -> one paragraph on stderr and its exit code."""
    name = os.path.basename(os.path.abspath(recipe_dir))
    args = parser(name, default_data).parse_args(argv)
    try:
        from podrun.runtime.env import read_plan, read_worker_info
        from podrun.specs import load_recipe
        from podrun.train.runner import train

        recipe = load_recipe(recipe_dir)
        info = read_worker_info()
        plan = read_plan(info)
        cfg = build_config(recipe, args, plan, overrides)
        if cfg.amp == "auto_fp16":  # the recipe's 16-bit precision: fp16 + loss scaling on GPU, off on CPU
            from podrun.runtime.distributed import select_device

            cfg.amp = "fp16" if select_device(cfg.device, info).kind in ("cuda", "ipu") else "off"
        if cfg.synthetic_size == 0:      # 0: twenty global batches
            world = info.world_size
            first = lambda *vs: next(v for v in vs if v is not None)  # noqa: E731 - 0 is a value, None is absent
            cfg.synthetic_size = 20 * first(cfg.global_batch, first(cfg.local_batch, info.local_batch, 8) * world
                                            * first(cfg.grad_accum, info.grad_accum, 1))
        summary = train(cfg, info)
    except PodrunError as exc:
        rank = os.environ.get("RANK", "0")
        msg = f"{name}/train.py (rank {rank}): error: {exc.message}"
        if exc.hint:
            msg += f"\n  hint: {exc.hint}"
        print(msg, file=sys.stderr, flush=True)
        return exc.exit_code
    missing = summary.get("not_written") or []
    if missing and info.rank == 0:
        print(f"{name}/train.py: not written in {summary['run_dir']}: {'; '.join(missing)}", file=sys.stderr,
              flush=True)
    if summary.get("val_accuracy") is not None and not args.quiet and info.rank == 0:
        kept = summary.get("checkpoints")
        where = f", {len(kept)} checkpoint(s) in {summary.get('checkpoint_dir')}" if kept else ""
        print(f"done: {summary['steps']} steps, val_accuracy {summary['val_accuracy']:.4f}, "
              f"{summary['seconds']:.1f}s, run dir {summary['run_dir']}{where}"
              f"{'; NOT written: ' + '; '.join(missing) if missing else ''}", flush=True)
    return 0

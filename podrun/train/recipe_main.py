"""The shared command line of recipes/*/train.py: arguments + recipe.yaml + plan.json -> TrainConfig -> train()."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

from podrun.errors import PodrunError
from podrun.specs.recipe_args import parser
from podrun.train.config import TrainConfig


def model_kwargs(recipe, image_size: int, norm: str | None = None) -> dict[str, Any]:
    """The model's options from the recipe (podrun.specs.RecipeSpec) and --norm ``norm``, for inputs of
    ``image_size`` pixels: those its model takes (a norm other than batch or group left out)."""
    from podrun import models

    known, m = models.options(recipe.model.name), recipe.model
    kw = {key: value for key, value in (("norm", m.norm), ("stem", m.stem), ("classifier", m.classifier),
                                        ("norm", norm))
          if value and key in known and (key != "norm" or value in ("batch", "group"))}
    return {**kw, "image_size": image_size} if "image_size" in known else kw


def build_config(recipe, args: argparse.Namespace, plan: dict | None, overrides: dict[str, Any] | None = None):
    """TrainConfig from the recipe (podrun.specs.RecipeSpec), the plan (dict or None) and the arguments."""
    ds, opt, sch = recipe.dataset, recipe.optimizer, recipe.schedule
    image_size = args.image_size or ds.image_size
    num_classes = max(ds.num_classes, 10) if args.data == "digits" else ds.num_classes
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
    amp = args.amp or {"fp16": "fp16", "bf16": "bf16", "amp": "auto", "fp32": "off"}[recipe.precision]
    if amp == "fp16" and args.amp is None:
        amp = "auto_fp16"
    cfg = TrainConfig(
        model=recipe.model.name, model_kwargs=model_kwargs(recipe, image_size, args.norm), name=recipe.name,
        data=args.data, image_size=image_size, num_classes=num_classes,
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
        inplace=not args.no_inplace,
        eval_every=args.eval_every, loader_workers=args.loader_workers, bad_samples=args.bad_samples,
        stage=args.stage,
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
        _end_if_abandoned(exc.exit_code)
        return exc.exit_code
    _end_if_abandoned(_report(name, args, info, summary))
    return 0


def _end_if_abandoned(code: int) -> None:
    """A worker that abandoned a gloo group (in-place recovery) ends here, by os._exit: gloo's teardown would wait
    on the dead peer."""
    if "podrun.runtime.inplace" not in sys.modules:
        return
    from podrun.runtime import inplace

    if inplace.abandoned_any():
        inplace.end_process(code)


def _report(name: str, args, info, summary: dict) -> int:
    """The end of training on the console (rank 0); 0."""
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

"""Summarise a run's metrics.jsonl and draw its loss, accuracy and throughput curves (matplotlib Agg, lazily)."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from podrun.errors import PodrunError
from podrun.train.metrics import METRICS_FILE, latest_by_step, read_metrics


def load(run_dir: str | Path) -> list[dict]:
    p = Path(run_dir)
    f = p if p.is_file() else p / METRICS_FILE
    if not p.exists():
        raise PodrunError(f"{p}: no such run directory", hint="pass a run directory, e.g. runs/<run-id>")
    if not f.is_file():
        raise PodrunError(f"{p}: no {METRICS_FILE} in this run directory",
                          hint="metrics are written by the recipes' train.py (podrun.train); did the run start?")
    records = read_metrics(f)
    if not any(r.get("kind") == "step" for r in records):
        raise PodrunError(f"{f}: no training steps recorded yet")
    return records


def summarize(records: list[dict]) -> dict[str, Any]:
    steps = latest_by_step(records, "step")
    evals = latest_by_step(records, "eval")
    starts = [r for r in records if r.get("kind") == "run" and r.get("event") in ("start", "resume")]
    ends = [r for r in records if r.get("kind") == "run" and r.get("event") == "end"]
    first = starts[0] if starts else {}
    skip = min(len(steps) - 1, max(1, len(steps) // 10))  # drop warm-up steps
    steady = steps[skip:] or steps
    tail = steps[-min(len(steps), 10):]
    out: dict[str, Any] = {
        "steps": steps[-1]["step"],
        "total_steps": first.get("total_steps"),
        "finished": bool(ends) and ends[-1].get("step") == steps[-1]["step"],
        "restarts": sum(1 for r in starts if r.get("event") == "resume"),
        "epochs": steps[-1]["epoch"] + 1,
        "world_size": first.get("world_size"),
        "instances": first.get("instances"),
        "local_batch": first.get("local_batch"),
        "grad_accum": first.get("grad_accum"),
        "global_batch": first.get("global_batch"),
        "device": first.get("device"),
        "first_loss": steps[0]["loss"],
        "final_loss": statistics.fmean(r["loss"] for r in tail),
        "final_train_accuracy": statistics.fmean(r["accuracy"] for r in tail),
        "images_per_sec_median": statistics.median(r["images_per_sec"] for r in steady),
        "images_per_sec_instance_median": statistics.median(r.get("images_per_sec_instance", 0) for r in steady),
        "train_seconds": sum(r.get("step_seconds", 0.0) for r in steps),
    }
    if evals:
        out["final_val_accuracy"] = evals[-1]["val_accuracy"]
        out["best_val_accuracy"] = max(r["val_accuracy"] for r in evals)
        out["final_val_loss"] = evals[-1]["val_loss"]
    return out


def plot(records: list[dict], path: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = latest_by_step(records, "step")
    evals = latest_by_step(records, "eval")
    xs = [r["step"] for r in steps]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    ax[0].plot(xs, [r["loss"] for r in steps], label="train loss")
    if evals:
        ax[0].plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", label="val loss")
    ax[0].set_xlabel("step")
    ax[0].set_title("loss")
    ax[0].legend()
    ax[1].plot(xs, [r["accuracy"] for r in steps], label="train (per step)", alpha=0.6)
    if evals:
        ax[1].plot([r["step"] for r in evals], [r["val_accuracy"] for r in evals], "o-", label="validation")
    ax[1].set_ylim(0, 1)
    ax[1].set_xlabel("step")
    ax[1].set_title("accuracy")
    ax[1].legend()
    ax[2].plot(xs, [r["images_per_sec"] for r in steps], label="total")
    ax[2].plot(xs, [r.get("images_per_sec_instance", 0) for r in steps], label="per instance")
    ax[2].set_xlabel("step")
    ax[2].set_title("images/s")
    ax[2].legend()
    for r in records:
        if r.get("kind") == "run" and r.get("event") == "resume":
            for a in ax:
                a.axvline(r["step"], color="grey", ls=":", lw=1)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

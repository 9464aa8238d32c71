"""`podrun report RUN_DIR`: print a run's training summary and draw its loss, accuracy and throughput curves."""
from __future__ import annotations

import click


@click.command("report")
@click.argument("run_dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="PNG to draw the curves to (default: RUN_DIR/report.png).")
@click.option("--no-plot", is_flag=True, help="Print the summary only.")
def report(run_dir: str, as_json: bool, output: str | None, no_plot: bool) -> None:
    """Summarise a run and draw its loss, accuracy and throughput curves."""
    from pathlib import Path

    from podrun.cli.render import console, print_json
    from podrun.train.report import load, plot, summarize

    records = load(run_dir)
    summary = summarize(records)
    if not no_plot:
        base = Path(run_dir)
        target = Path(output) if output else (base if base.is_dir() else base.parent) / "report.png"
        summary["plot"] = str(plot(records, target, title=str(run_dir)))
    if as_json:
        print_json(summary)
        return
    c = console()
    state = "finished" if summary["finished"] else "not finished"
    c.print(f"[bold]{run_dir}[/bold]: {summary['steps']}/{summary['total_steps']} steps ({state}), "
            f"{summary['epochs']} epoch(s), {summary['restarts']} restart(s)")
    c.print(f"  decomposition: {summary['world_size']} workers on {summary['instances']} instance(s), "
            f"local batch {summary['local_batch']} x GA {summary['grad_accum']} -> global batch "
            f"{summary['global_batch']} ({summary['device']})")
    c.print(f"  loss {summary['first_loss']:.4f} -> {summary['final_loss']:.4f}, "
            f"train accuracy {summary['final_train_accuracy']:.3f}")
    if "final_val_accuracy" in summary:
        c.print(f"  validation accuracy {summary['final_val_accuracy']:.4f} "
                f"(best {summary['best_val_accuracy']:.4f}), loss {summary['final_val_loss']:.4f}")
    c.print(f"  throughput {summary['images_per_sec_median']:.1f} img/s total (median), "
            f"{summary['images_per_sec_instance_median']:.1f} per instance; {summary['train_seconds']:.1f}s training")
    if "plot" in summary:
        c.print(f"  curves: {summary['plot']}")

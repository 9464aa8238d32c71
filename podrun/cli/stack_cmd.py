"""`podrun stack [RUN]`: every rank's Python stack of a running launch, merged, without stopping it."""
from __future__ import annotations

import click


@click.command("stack")
@click.argument("run", required=False)
@click.option("--runs-dir", default="runs", show_default=True,
              help="Where run directories are (RUN may be a run id there, or a run directory's path).")
@click.option("--json", "as_json", is_flag=True, help="Print every worker's stacks (all threads) as JSON.")
def stack(run: str | None, runs_dir: str, as_json: bool) -> None:
    """Show the stacks of every worker of RUN (default: the newest run in --runs-dir that is running),
    identical stacks grouped by rank, the odd ranks out first. The run goes on unharmed."""
    import errno
    import os
    from pathlib import Path

    from podrun.cli.render import print_json
    from podrun.errors import LaunchError
    from podrun.launch.watch import SOCKET_NAME, ask

    if run is None:
        base = Path(runs_dir)
        live = sorted((d for d in base.glob("*") if (d / SOCKET_NAME).exists()),
                      key=lambda d: d.stat().st_mtime) if base.is_dir() else []
        if not live:
            raise LaunchError(f"no running launch in {base} (no run directory there has a {SOCKET_NAME})",
                              hint="give the run: podrun stack RUN_DIR, or --runs-dir where it runs")
        target = live[-1]
    else:
        target = Path(run) if os.sep in run or Path(run).is_dir() else Path(runs_dir) / run
    if not target.is_dir():
        raise LaunchError(f"{target}: no such run directory", hint="give a run directory or a run id in --runs-dir")
    try:
        reply = ask(str(target), {"ask": "stacks"})
    except (OSError, ValueError) as exc:
        gone = isinstance(exc, OSError) and exc.errno in (errno.ENOENT, errno.ECONNREFUSED)
        raise LaunchError(f"run {target.name} is not running: no podrun launch listens on {target / SOCKET_NAME}"
                          if gone else f"cannot ask run {target.name} for its stacks: {exc}",
                          hint="podrun stack works while podrun launch runs; an ended run's last stacks (if it "
                               "hung) are in its stacks/ directory") from None
    if "error" in reply:
        raise LaunchError(f"run {target.name}: {reply['error']}")
    if as_json:
        print_json(reply)
        return
    print(f"run {reply['run_id']}: the stacks of {reply['ranks']} worker(s), odd ranks first "
          f"(every thread in {reply['stacks_dir']}/rank-N.txt)")
    for line in reply["lines"]:
        print(f"  {line}")

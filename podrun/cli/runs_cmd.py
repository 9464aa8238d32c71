"""`podrun runs`: the local runs under a runs directory, newest first."""
from __future__ import annotations

import click


@click.command("runs")
@click.option("--runs-dir", default="runs", show_default=True, help="Where podrun launch wrote its runs.")
@click.option("--json", "as_json", is_flag=True, help="Print the runs as JSON.")
def runs(runs_dir: str, as_json: bool) -> None:
    """List the runs under --runs-dir, newest first: id, status, steps, wall time, goodput, directory."""
    from podrun.cli.render import console, print_json
    from podrun.human import human_seconds
    from podrun.rundir.listing import list_runs

    rows = list_runs(runs_dir)
    if as_json:
        print_json(rows)
        return
    out = console()
    if not rows:
        out.print(f"no runs in {runs_dir}", markup=False)
        return
    table = [("id", "status", "steps", "wall", "goodput", "dir")]
    for r in rows:
        status = r["status"] if r["exit_code"] is None else f"{r['status']} ({r['exit_code']})"
        table.append((r["id"], status, "-" if r["steps"] is None else str(r["steps"]),
                      "-" if r["wall_s"] is None else human_seconds(r["wall_s"]),
                      "-" if r["goodput"] is None else f"{r['goodput']:.0%}", r["dir"]))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:      # plain columns, the directory last and whole (a path is never cut)
        out.print("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1], markup=False)

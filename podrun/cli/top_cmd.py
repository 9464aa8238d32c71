"""`podrun top [RUN]`: a live view of a running launch from any shell that can read its run directory (the rendering;
podrun.live.top finds the run and gets its state)."""
from __future__ import annotations

import click

REFRESH_S = 1.0


def _num(v, fmt: str = "{:.3g}", none: str = "-") -> str:
    from podrun.rundir.metrics import is_number

    return fmt.format(v) if is_number(v) else none


def render(s: dict, width: int | None = None):
    """The view of state ``s`` as a rich renderable: a head of progress and goodput, a row per host, the root cause."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from podrun.human import human_seconds
    from podrun.redaction import escape_controls as esc
    from podrun.rundir.layout import SPLIT_PARTS

    acc = s.get("account") or {}
    step, total = s.get("step"), s.get("total")
    where = f"step {_num(step, '{}')}/{_num(total, '{}')}" if step is not None else "no step yet"
    left = s.get("time_left_s")
    head = [f"run {esc(str(s.get('run_id')))}", "running" if s.get("running") else str(s.get("status") or "not running"),
            where, f"loss {_num(s.get('loss'))}", f"{_num(s.get('samples_per_sec'), '{:.1f}')} samples/s",
            f"goodput {_num((acc.get('goodput') or 0) * 100 if acc.get('goodput') is not None else None, '{:.0f}')}%",
            f"left {human_seconds(left) if isinstance(left, (int, float)) else '-'}",
            f"restarts {s.get('restarts', 0)}",
            f"hosts {s.get('hosts_running', 0)} running, {s.get('hosts_lost', 0)} lost"]
    table = Table(box=None, pad_edge=False, expand=False)
    for col in ("host", "state", "busy s", "in/comp/comm/opt s", "heard s ago", "note"):
        table.add_column(col, no_wrap=col != "note", overflow="fold")
    for h in s.get("hosts") or []:
        sp = h.get("split") or {}
        split = "/".join(_num(sp.get(k), "{:.2f}") for k in SPLIT_PARTS) if sp else "-"
        note = "lost" if h.get("state") == "lost" else "slow" if h.get("slow") else ""
        table.add_row(esc(str(h.get("host"))), esc(str(h.get("state"))), _num(h.get("busy_s"), "{:.3f}"), split,
                      _num(h.get("heartbeat_age_s"), "{:.1f}"), note)
    parts = [Text(" · ".join(head)), table]
    if s.get("slow_ranks"):
        parts.append(Text(f"slow rank(s): {', '.join(map(str, s['slow_ranks']))} "
                          f"(ratio {_num(s.get('slow_ratio'), '{:.2f}')})"))
    if s.get("root_cause"):
        parts.append(Text(f"root cause: {esc(str(s['root_cause']))}"))
    parts.append(Text(f"from the {'controller' if s.get('source') == 'controller' else 'run directory records'}"
                      + ("; q leaves" if width is None else "")))
    return Group(*parts)


@click.command("top")
@click.argument("run", required=False)
@click.option("--runs-dir", default="runs", show_default=True,
              help="Where run directories are (RUN may be a run id there, or a run directory's path).")
@click.option("--once", is_flag=True, help="Show the view once and leave.")
@click.option("--json", "as_json", is_flag=True, help="Print the run's live state once as JSON.")
def top(run: str | None, runs_dir: str, once: bool, as_json: bool) -> None:
    """A live view of RUN (default: the newest running launch in --runs-dir): progress and time left, goodput, a
    row per host (state, busy time, step split, heartbeat age, slow or lost), the latest root cause; q leaves. It
    asks the run's controller over its control socket, or reads the run directory's records where none answers."""
    import sys

    from podrun.cli.render import print_json
    from podrun.live.top import find, state
    from podrun.redaction import redact_record

    target = find(run, runs_dir)
    if as_json:
        print_json(redact_record(state(target)))
        return
    from rich.console import Console

    console = Console()
    if once or not sys.stdin.isatty():
        console.print(render(redact_record(state(target)), console.width))
        return
    _watch(console, target, state)


def _watch(console, target, state) -> None:
    """Redraw every REFRESH_S until q (or Ctrl-C); the terminal in cbreak mode meanwhile."""
    import select
    import sys
    import termios
    import tty

    from rich.live import Live

    from podrun.redaction import redact_record

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        with Live(render(redact_record(state(target))), console=console, auto_refresh=False, screen=False) as live:
            while True:
                ready, _, _ = select.select([fd], [], [], REFRESH_S)
                if ready and sys.stdin.read(1) in ("q", "Q"):
                    return
                live.update(render(redact_record(state(target))), refresh=True)
    except KeyboardInterrupt:
        return
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)

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

    from podrun.cli.render import print_json
    from podrun.errors import LaunchError
    from podrun.launch import control
    from podrun.live.top import find
    from podrun.wire.control import STACKS, Ask
    from podrun.rundir.layout import CONTROL_SOCKET
    from podrun.wire.owner import remove_if_stale
    from podrun.redaction import escape_controls as esc, redact_record

    target = find(run, runs_dir, "stack")
    name = esc(target.name)
    not_running = LaunchError(f"run {name} is not running: no podrun launch listens on {esc(str(target / CONTROL_SOCKET))}",
                              hint="podrun stack works while podrun launch runs; an ended run's last stacks (if it "
                                   "hung) are in its stacks/ directory")
    if remove_if_stale(str(target)):
        raise not_running
    try:
        reply = control.ask(str(target), Ask(STACKS))
    except (OSError, ValueError) as exc:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENAMETOOLONG):
            raise not_running from None
        raise LaunchError(f"cannot ask run {name} for its stacks: {esc(str(exc))[:300]}",
                          hint="podrun stack works while podrun launch runs") from None
    if isinstance(reply, dict) and "error" in reply:
        raise LaunchError(f"run {name}: {esc(str(reply['error']))[:300]}")
    problem = reply_problem(reply)
    if problem is not None:
        raise LaunchError(f"run {name}: the control socket {esc(str(target / CONTROL_SOCKET))} answered {problem}",
                          hint="is a podrun launch of this version listening there?")
    reply = redact_record(reply)
    if as_json:
        print_json(reply)
        return
    print(f"run {esc(str(reply['run_id']))}: the stacks of {reply['ranks']} worker(s), odd ranks first "
          f"(every thread in {esc(str(reply['stacks_dir']))}/rank-N.txt)")
    for line in reply["lines"]:
        print(f"  {esc(line)}")


def reply_problem(reply) -> str | None:
    """What is wrong with a control-socket reply (None: a reply `podrun stack` can show)."""
    if not isinstance(reply, dict):
        return f"{type(reply).__name__}, not a JSON object"
    ranks = reply.get("ranks")
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 0:
        return "no count of ranks"
    lines = reply.get("lines")
    if not isinstance(lines, list) or not all(isinstance(x, str) for x in lines):
        return "no lines of stacks"
    if not isinstance(reply.get("run_id"), str) or not isinstance(reply.get("stacks_dir"), str):
        return "no run id or stacks directory"
    if not isinstance(reply.get("groups", []), list):
        return "groups that are not a list"
    return None

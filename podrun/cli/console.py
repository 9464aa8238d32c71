"""podrun launch's console: the workers' lines with their prefixes, podrun's own notices, the --dry-run's print and
the run's end (its root cause, or its one end block), all on the terminal and fitted to it."""
from __future__ import annotations

import collections
import contextlib
import os
import re
import shlex
import shutil
import sys

import click

from podrun.rundir.summary import RunStatus, Summary

COLOURS = ("36", "33", "35", "32", "34", "31", "96", "93")


def say_outcome(summary: Summary, request, view, console=None) -> None:
    """The run's end on the console (its root cause or its line), the live view closed first; a closed pipe
    (`| head`) or terminal (SIGHUP) is no failure: the run directory has everything."""
    from podrun.rundir.report import end_lines

    figures = end_lines(request.run_dir) if summary.status in (RunStatus.OK, RunStatus.INTERRUPTED) else None
    view.close(say_end=figures is None)         # a training run's end block says its steps, from its metrics
    with contextlib.suppress(OSError):
        print_root_cause(summary, request, console.showed if console is not None else None, figures)


class Console:
    """The console writer of workers' lines: ``[instance host]`` (``[instance:local_rank host]``), coloured on a tty.
    The stream is looked up at each line (stderr with --json), so that a live progress line can redirect it.
    ``local_ranks`` (--local-ranks-filter): only those local ranks' lines, both streams, as torchrun's filter (the
    run directory's logs keep every line). Once the run is stopped by a signal (Ctrl-C), the workers' stderr (the
    tracebacks of their KeyboardInterrupt) goes to their logs only, unless ``debug``; their stdout still shows.
    A line not ended yet (a ``part``: a prompt, a ``\r`` bar) is shown with its prefix and no newline; the line that
    ends it prints only what follows, or on a terminal redraws it; a ``\r`` redraw is shown on a terminal only. The
    first one shown stops the live progress line of ``view`` (a render.ProgressView), which holds the terminal's
    output until each newline: its progress goes on as plain lines."""

    def __init__(self, plan, as_json: bool, local_ranks: frozenset[int] | None = None, debug: bool = False,
                 view=None, prefix: bool = True):
        from podrun.wire.worker_env import workers_per_instance

        self.as_json, self.local_ranks, self.debug, self.view = as_json, local_ranks, debug, view
        self.prefix = prefix                 # --no-prefix: workers' lines as they wrote them
        self.tty = (sys.stderr if as_json else sys.stdout).isatty() and "NO_COLOR" not in os.environ
        self.multi = workers_per_instance(plan) > 1
        self.hushed = False
        self.shown: dict[tuple, str] = {}     # (instance, local rank, stream) -> its unended line as shown
        self.open: tuple | None = None         # the key whose unended line the console's last output is
        self.recent: dict[tuple, collections.deque] = {}   # (instance, local rank) -> the last lines it showed

    def interrupted(self) -> None:
        self.hushed = not self.debug

    def _prefix(self, index, host, local_rank, stream) -> str | None:
        """The line's prefix, or None when the line is not shown."""
        if self.local_ranks is not None and index is not None and (local_rank or 0) not in self.local_ranks:
            return None
        if self.hushed and stream == "err" and index is not None:
            return None
        if not self.prefix and index is not None:
            return ""
        who = "?" if index is None else str(index)
        if local_rank is not None and self.multi:
            who += f":{local_rank}"
        if self.tty:
            return f"\x1b[{COLOURS[(0 if index is None else index) % len(COLOURS)]}m[{who} {host}]\x1b[0m"
        return f"[{who} {host}]"

    def _file(self, stream: str):
        return sys.stderr if stream == "err" or self.as_json else sys.stdout

    def _close_open(self) -> None:
        """End the unended line the console shows last, before anything else is written after it."""
        if self.open is not None:
            put(self._file(self.open[2]), "\n")
            self.open = None

    def notice(self, text: str) -> None:
        """podrun's own message, on a line of its own after an unended line shown last."""
        self._close_open()
        notice_line(text)

    def partial(self, index, host, local_rank, part) -> None:
        """A worker's line not ended yet (protocol.Part): shown, or extended or redrawn where it is shown last."""
        prefix = self._prefix(index, host, local_rank, part.stream)
        if prefix is None or (part.redraw and not self._file(part.stream).isatty()):   # a log or pipe: a bar's
            return                                                                      # final state only
        if getattr(self.view, "live", None) is not None:
            self.view.live.stop()            # rich's live line would end this line at once: plain progress lines
            self.view.live = None
        f = self._file(part.stream)
        key = (index, local_rank, part.stream)
        before, state = self.shown.get(key), part.state
        if part.redraw:          # a frame wider than the terminal would wrap, and \r would redraw its last row only
            room = shutil.get_terminal_size().columns - len(re.sub(r"\x1b\[[0-9;]*m", "", prefix)) - 2
            state = state[:max(room, 0)]
        put(f, self._shown_as(key, prefix, state, before, f, extend=not part.redraw))
        self.shown[key], self.open = state, key

    def _shown_as(self, key, prefix: str, text: str, before: str | None, f, extend: bool = True) -> str:
        """What shows ``text`` of ``key`` where its unended line ``before`` is the console's last output: the rest
        where ``text`` continues it (``extend``), else a redraw over it on a terminal; else the whole line, after
        the unended line shown last is ended."""
        if self.open == key and before is not None:
            if extend and text.startswith(before):
                return text[len(before):]                            # it continues what is shown
            if f.isatty():
                return f"\r\x1b[K{_with(prefix, text)}"             # a redraw (a bar's final state) over its frame
        self._close_open()
        return _with(prefix, text)

    def __call__(self, index, host, local_rank, stream, text) -> None:
        prefix = self._prefix(index, host, local_rank, stream)
        if prefix is None or (stream == "out" and LOG_ONLY.match(text)):
            return
        key = (index, local_rank, stream)
        before, f = self.shown.pop(key, None), self._file(stream)
        if before is not None and self.open != key and text.startswith(before):   # shown, then other lines came
            if text == before:
                return
            text = text[len(before):]                                            # the rest
        line = self._shown_as(key, prefix, text, before, f)
        self.open = None
        put(f, line + "\n")
        self.recent.setdefault((index, local_rank), collections.deque(maxlen=SHOWN_KEPT)).append(text)

    def showed(self, instance, local_rank, lines) -> bool:
        """Whether ``lines`` (a worker's last lines) are the last it showed on the console, in order."""
        seen = list(self.recent.get((instance, local_rank), ()))
        return bool(lines) and len(lines) <= len(seen) and seen[len(seen) - len(lines):] == list(lines)


# a podrun.train run's own end lines (its run-end record, the recipe's "done:"): in the instance logs and
# metrics.jsonl; on the console the run's end block says the same once
LOG_ONLY = re.compile(r"^(?:run end: step=|done: \d+ steps, val_accuracy )")
SHOWN_KEPT = 64          # lines kept per worker to tell whether a root cause's last lines were shown live


def _with(prefix: str, text: str) -> str:
    return f"{prefix} {text}" if prefix else text


def said_the_same(root: dict, others: list[dict]) -> tuple[str, list[dict]]:
    """The other workers whose last lines are the root cause's but for their own rank numbers, named by instance
    ("instance 0 on h1, local ranks 1-2"; one error said by every rank is shown once), and the others. A number is
    masked only where it is the rank of the worker that wrote the line ("[rank1]:", "(rank 1)" from rank 1): "peer
    rank 0 closed" from rank 1 and "peer rank 1 closed" from rank 0 are not the same line."""

    def words(lines, rank) -> list[str]:
        if not isinstance(rank, int) or rank < 0:
            return list(lines)
        own = re.compile(rf"(\brank[\s=:\[]*){rank}(?!\d)", re.IGNORECASE)
        return [own.sub(r"\1#", line) for line in lines]

    raw = list(root.get("last_lines") or [])
    mine = words(raw, root.get("rank"))
    same = [o for o in others if raw and (o["last_lines"] == raw or words(o["last_lines"], o.get("rank")) == mine)]
    if not same:
        return "", others
    from podrun.launch.stacks import rank_ranges

    by: dict = {}
    for o in same:
        by.setdefault((o["instance"], o["host"]), []).append(o.get("local_rank"))
    names = "; ".join(f"instance {i} on {h}" + ("" if None in lrs else
                                                f", local rank{'s' if len(lrs) > 1 else ''} {rank_ranges(sorted(lrs))}")
                      for (i, h), lrs in by.items())
    return names, [o for o in others if o not in same]


def put(f, text: str) -> None:
    """``text`` onto the text stream ``f`` whole, in one write of its bytes: print() writes a line and its newline
    separately, so another thread's line could land between them where stdout and stderr share a file; and a raw
    stream (PYTHONUNBUFFERED) takes only part of a write that a signal cuts short, whose rest is written after."""
    out = getattr(f, "buffer", None)
    if out is None:                  # a text-only stream (a test's StringIO)
        f.write(text)
        f.flush()
        return
    f.flush()                        # what went through ``f`` itself first
    data = memoryview(text.encode(f.encoding or "utf-8", f.errors or "strict"))
    while data:
        data = data[out.write(data):]
    out.flush()

def notice_line(text):
    from podrun.cli.render import fit, width_of
    from podrun.redaction import shown

    put(sys.stderr, fit(f"podrun: {shown(text)}", width_of(sys.stderr)) + "\n")


FULL_DRY_RUN_WORKERS = 4     # a --dry-run of at most this many workers is printed whole; a larger one as a summary


def print_dry_run(record: dict, shows: str = "auto") -> None:
    """--dry-run's text: the request's header, then every host's command and every worker's env ("all", or a small
    run), one host's (``shows`` a host), or a summary that fits a screen: the first and last instance in full and
    what differs between the others. Each command and env printed is exactly what runs."""
    from podrun.cli.render import fit, width_of

    width = width_of(sys.stdout)          # a terminal's; a file or pipe: each comment on one line

    def comment(text: str) -> None:        # a "# " line, wrapped at word boundaries; commands and env never are
        print("\n".join("# " + line for line in fit(text, None if width is None else width - 2).split("\n")))

    commands, instances = record["commands"], record["instances"]
    workers = sum(len(i["workers"]) for i in instances)
    hosts = list(dict.fromkeys(i["host"] for i in instances))
    if shows not in ("auto", "all") and shows not in hosts and shows not in {c["host"] for c in commands}:
        raise click.UsageError(f"--dry-run-host {shows}: not a host of the plan ({_some(hosts)})")
    comment(f"podrun launch --dry-run: run {record['run_id']} via {record['transport']}, "
          f"run dir {record['run_dir']}, --max-restarts {record['max_restarts']}")
    for note in record["notes"]:
        comment(note)
    comment(f"MASTER_ADDR {record['master_addr']}: {record['master_addr_source']}")
    hb = record["heartbeat"]
    comment(f"heartbeat every {hb['period_s']:g} s both ways; a host silent for {hb['bound_s']:g} s "
          f"({hb['misses']:g} missed) is lost, and an agent whose controller is silent that long ends its workers")
    if record["master_port"] == 0:
        comment(f"MASTER_PORT 0 below: podrun picks a free port on {record['master_addr']} when the run starts, and "
              "every worker gets that port (--master-port N fixes one)")
    if shows not in ("auto", "all"):
        commands = [c for c in commands if c["host"] == shows]
        instances = [i for i in instances if i["host"] == shows]
    elif shows == "auto" and workers > FULL_DRY_RUN_WORKERS and len(instances) > 1:
        comment(f"{len(instances)} instances on {len(hosts)} hosts ({_some(hosts)}), {workers} workers: the first and "
              "last in full; --dry-run-all prints every one, --dry-run-host HOST one host's")
        comment(_differs([shlex.split(c["command"]) for c in commands], "the hosts' commands differ in")[2:])
        comment(_differs([[f"{k}={v}" for k, v in e.items()] for i in instances for e in i["workers"]],
                         "the workers' env differs in")[2:])
        commands = commands[:1] + commands[-1:] if len(commands) > 1 else commands
        first, last = instances[0], instances[-1]
        instances = [{**first, "workers": first["workers"][:1]},
                     {**last, "workers": last["workers"][-1:], "first": len(last["workers"]) - 1}]
    for c in commands:
        print(f"\n# host {c['host']}: runs\n{c['command']}")
    if record["agent_env"]:
        print()
        comment("every agent's --env (on top of the host's; its workers inherit it), through "
                + record["agent_env_route"])
        print("\n".join(f"{k}={v}" for k, v in record["agent_env"].items()))
    for inst in instances:
        for lr, env in enumerate(inst["workers"], start=inst.get("first", 0)):
            print(f"\n# instance {inst['index']} on {inst['host']}, worker {lr}: env (on top of the host's)")
            print("\n".join(f"{k}={v}" for k, v in env.items()))


def _some(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:2])}, ..., {names[-1]}"


def _differs(rows: list[list[str]], what: str) -> str:
    """"# WHAT 3 of 17 items: RANK=0 .. RANK=7; ...": where rows (token lists) differ, by position, first to last;
    rows of different lengths are said to differ in length."""
    if len({len(r) for r in rows}) > 1:
        return f"# {what} length ({min(map(len, rows))} to {max(map(len, rows))} items)"
    cols = [sorted({r[k] for r in rows}) for k in range(len(rows[0]))] if rows else []
    def named(k: int, value: str) -> str:       # an option's value with the option: --instance 0
        before = rows[0][k - 1] if k > 0 else ""
        return f"{before} {value}" if before.startswith("-") and len(cols[k - 1]) == 1 else value

    diff = [f"{named(k, rows[0][k])} .. {named(k, rows[-1][k])}" if rows[0][k] != rows[-1][k]
            else f"{len(c)} values of {named(k, rows[0][k])}" for k, c in enumerate(cols) if len(c) > 1]
    shown = "; ".join(diff[:6]) + (f"; {len(diff) - 6} more" if len(diff) > 6 else "")
    return f"# {what} {len(diff)} of {len(cols)} items" + (f": {shown}" if diff else "")


def print_root_cause(summary: Summary, request, showed=None, figures: list[str] | None = None) -> None:
    """The run's end on stderr, from the (redacted) summary; every line through podrun.redaction.shown. ``showed``
    (instance, local rank, lines): whether the console showed those lines last, so that they are not said twice.
    ``figures``: a training run's end lines (podrun.rundir.report.end_lines), said in its one end block."""
    from podrun.redaction import shown
    from podrun.rundir.layout import instance_log
    from podrun.rundir.report import pointers      # torch-free: checkpoints kept, `podrun report RUN_DIR`

    rc, code, missing = summary.root_cause, summary.exit_code, summary.not_written
    unwritten = f"; NOT written: {', '.join(missing)}" if missing else ""

    from podrun.cli.render import fit, key_line, who, width_of

    width = width_of(sys.stderr)

    def say(text: str) -> None:     # podrun's own words fitted to a terminal; a worker's quoted lines as they are
        put(sys.stderr, (shown(text) if text.startswith("    ") else fit(shown(text), width)) + "\n")

    if summary.status in (RunStatus.OK, RunStatus.INTERRUPTED):
        ended = "finished: exit 0" if summary.status is RunStatus.OK else \
            f"interrupted (exit {code}); every instance ended"
        if figures:        # one block: how it ended, the figures, the checkpoints, the run directory once
            say(f"podrun: run {request.run_id} {ended}; {figures[0]}")
            for line in figures[1:]:
                say(f"  {line}")
            for line in pointers(request.run_dir).split("; "):
                say(f"  {line}" + (f" (logs, summary.json, metrics.jsonl){unwritten}" if line.startswith("report:")
                                   else ""))
            return
        say(f"podrun: run {request.run_id} {ended}; logs in {request.run_dir}{unwritten}; {pointers(request.run_dir)}")
        return
    if rc:
        # the key line (the @record error's message, else the exception's or error's last line) first, with the
        # rank; the reason (exit code) after it; the last lines once: not again when the console just showed them
        error, lines = rc.get("error"), rc.get("last_lines") or []
        key = error.get("message") if error and error.get("message") else key_line(lines)
        log = os.path.join(request.run_dir, instance_log(rc["instance"]))
        whose = "its" if rc.get("local_rank") is not None else "the instance's"
        said_live = bool(lines) and showed is not None and showed(rc["instance"], rc.get("local_rank"), lines)
        where = (f"{whose} last lines are above (and in {log})" if said_live else
                 f"{whose} last lines (in {log}):" if lines else "")
        recorded = f"@record's error file {error.get('file')}" if error else ""
        say(f"podrun: run {request.run_id} failed (exit {code}). root cause: {who(rc)}: {key or rc['reason']}")
        if key or recorded or lines:    # without a key line the reason was said: the last lines follow here
            said = (rc["reason"], recorded, where) if key else \
                (recorded, f"{whose} last lines (in {log}):" if lines else "")
            say("  " + "; ".join(x for x in said if x))
        if lines and not (key and said_live):
            for line in lines:
                say(f"    {line}")
        if rc.get("followers"):
            from podrun.launch.outcome import followers_line as line
            say(f"  {line(rc['followers'])}")
        same, others = said_the_same(rc, rc.get("others") or [])
        if same:
            say(f"  {same} said the same")
        if others:
            say("  what the other workers said last:")
            for o in others:
                say(f"    {who(o)}:")
                for line in o["last_lines"]:
                    say(f"      {line}")
    else:
        say(f"podrun: run {request.run_id} failed (exit {code})")
    where = f"logs in {request.run_dir}{unwritten}" if missing else f"logs and summary.json in {request.run_dir}"
    say(f"podrun: {where}; {pointers(request.run_dir)}")

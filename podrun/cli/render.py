"""Rendering shared by the commands: errors, JSON, tables (the only place besides cli/ commands that uses rich)."""
from __future__ import annotations

import json
import re
import sys

from podrun.human import human_number, human_seconds


def print_error(exc) -> None:
    """One paragraph on stderr: 'podrun: error: ...' then the hint; secrets redacted, control characters
    escaped (podrun.redaction.shown): a message may quote a worker's line or a name the user gave. Fitted to a
    terminal's width (fit)."""
    from podrun.redaction import shown

    msg = f"podrun: error: {exc.message}"
    if getattr(exc, "hint", None):
        msg += f"\n  hint: {exc.hint}"
    print(fit(shown(msg), width_of(sys.stderr)), file=sys.stderr)


def width_of(stream) -> int | None:
    """The width to fit podrun's text to on ``stream``: its terminal's columns; None (full width) for a file or a
    pipe, so that logs, --json and what is piped on keep each message on its line."""
    import shutil

    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        return None
    return shutil.get_terminal_size().columns if tty else None


# what is never broken across lines: a `quoted` span, a 'quoted' word group, a command (podrun/pip/python ... up to
# the next ; , or closing bracket)
_WHOLE = re.compile(r"`[^`]*`|'[^'\s][^']{0,60}'|\b(?:podrun (?:plan|calibrate|launch|resume|script|submit|status|"
                    r"cancel|hosts|stack|report|clusters|recipes|runs)|pip install|python3? -m|torchrun) [^;,()]*[^;,()\s]")
_NBSP = "\x00"


def fit(text: str, width: int | None, indent: str = "  ") -> str:
    """``text`` wrapped at word boundaries to ``width`` (None: as it is), each line on its own: a line's
    continuation indented past its own indent by ``indent``; paths, words and commands (_WHOLE) never broken."""
    if width is None or width < 20:
        return text
    import textwrap

    out = []
    for line in text.split("\n"):
        lead = line[:len(line) - len(line.lstrip(" "))]
        kept = _WHOLE.sub(lambda m: m.group(0).replace(" ", _NBSP), line)
        wrapped = textwrap.wrap(kept, width=width, subsequent_indent=lead + indent, break_long_words=False,
                                break_on_hyphens=False, drop_whitespace=True) or [""]
        out.extend(w.replace(_NBSP, " ") for w in wrapped)
    return "\n".join(out)


KEY_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Fault|Warning)(?::.*)?|.*\berror: .*)$")


def key_line(lines: list[str]) -> str | None:
    """The last of ``lines`` that says what went wrong: an exception's type and message (a traceback's last line) or
    an ``error:`` line (argparse's, a program's); None where none does."""
    return next((line.strip() for line in reversed(lines) if KEY_LINE.match(line.strip())), None)


def who(d: dict) -> str:
    """A worker (a root cause's, another's) as podrun names it: its instance and host, its local rank if any."""
    rank = d.get("local_rank")
    return f"instance {d.get('instance')} on {d.get('host')}" + (f", local rank {rank}" if rank is not None else "")


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def kv_table(title: str, rows):
    """A table of (what, value) rows under ``title``, no header: the plan's, its estimate's, a calibration's."""
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    for row in rows:
        table.add_row(*row)
    return table


def render_plan(p, host_source: str) -> None:
    """`podrun plan`: the plan, its placement (first 8 instances), the estimate and the notes."""
    from rich.table import Table

    out = console()
    rows = [("hosts", f"{len(p.hosts)} ({host_source})"),
            ("devices", f"{p.devices} = {len(p.hosts)} x {p.devices_per_host} {p.device_kind}"),
            ("devices per replica", str(p.devices_per_replica)),
            ("replicas", str(p.replicas)),
            ("instances", f"{p.instances} ({p.instances_per_host} per host, {p.replicas_per_instance} replicas each)"),
            ("local batch", str(p.local_batch)),
            ("GA", str(p.grad_accum)),
            ("global batch", f"{p.global_batch} = {p.local_batch} x {p.replicas} x {p.grad_accum}")]
    if p.recipe:
        rows += [("learning rate", f"{p.learning_rate:.6g} ({p.lr_rule} rule, reference {p.reference_learning_rate:g} "
                                   f"at global batch {p.lr_reference_batch})"),
                 ("warmup", f"{p.warmup_epochs:g} epochs"),
                 ("pipeline bubble", f"{p.pipeline_bubble:.2%}" if p.devices_per_replica > 1
                  else "none (1 device per replica)")]
    out.print(kv_table(f"{p.recipe} on {p.cluster}" if p.recipe else f"command on {p.cluster}", rows))

    pt = Table(title="placement", title_justify="left")
    for c in ("instance", "host", "replicas", "devices"):
        pt.add_column(c)
    for pl in p.placement[:8]:
        last = pl.replica_offset + pl.local_replicas - 1
        pt.add_row(str(pl.index), pl.host, f"{pl.replica_offset}-{last}" if last > pl.replica_offset
                   else str(pl.replica_offset), f"{pl.devices[0]}-{pl.devices[-1]}" if len(pl.devices) > 1
                   else str(pl.devices[0]))
    if len(p.placement) > 8:
        pt.add_row("...", f"{len(p.placement) - 8} more", "", "")
    out.print(pt)

    if p.recipe:
        e = p.estimate
        hidden = "" if e.allreduce_hidden_fraction == 0 else f", {e.allreduce_hidden_fraction:.0%} of it hidden"
        by = "input, not the device" if e.input_bound else "the device"
        out.print(kv_table("estimate", [
            ("throughput", f"{e.images_per_second:,.0f} img/s"),
            ("scaling efficiency", f"{e.scaling_efficiency:.1%}"),
            ("step", f"{e.step_seconds * 1000:.1f} ms (all-reduce {e.allreduce_seconds * 1000:.2f} ms{hidden})"),
            ("input", "not yet measured (podrun calibrate --data PATH)" if e.input_seconds is None
             else f"{e.input_seconds * 1000:.1f} ms a step on each host; the step is bound by {by}"),
            ("time to train", f"{human_seconds(e.time_to_train_hours * 3600)} for {p.epochs:g} epochs")]))
        out.print("assumptions: " + "; ".join(e.assumptions))
    levers = p.estimate.input_levers if p.recipe else ()
    for line in [*(f"would change the input: {lever}" for lever in levers), *(f"note: {n}" for n in p.notes)]:
        out.print(fit(line, width_of(out.file)), markup=False, highlight=False)


def render_elastic(table, recipe: str, cluster: str, host_source: str) -> None:
    """`podrun plan --elastic`: one row per host count that keeps the global batch, MAX first, in 80 columns; then
    the counts that cannot, with their reasons, each on a line of its own."""
    from rich import box
    from rich.table import Table

    out = console()
    out.print(f"{recipe or 'command'} on {cluster} ({host_source}):\nglobal batch {table.global_batch}, "
              f"{table.max_hosts} down to {table.min_hosts} hosts")
    t = Table(box=box.SIMPLE_HEAD)
    for c in ("hosts", "replicas", "local batch", "GA", "global batch", "img/s", "time to train"):
        t.add_column(c, justify="right")
    for r in table.rows:
        if r.plan is not None:
            p = r.plan
            ttt = human_seconds(p.estimate.time_to_train_hours * 3600) if p.recipe else "-"
            ips = f"{p.estimate.images_per_second:,.0f}" if p.recipe else "-"
            t.add_row(str(r.hosts), str(p.replicas), str(p.local_batch), str(p.grad_accum), str(p.global_batch),
                      ips, ttt)
    out.print(t)
    for r in table.rows:
        if r.plan is None:
            out.print(f"  {r.hosts} hosts: {r.reason}")
    ok = sum(1 for r in table.rows if r.plan is not None)
    out.print(f"{ok} of {len(table.rows)} host counts keep global batch {table.global_batch} exactly "
              "(local batch x replicas x GA);\nthe learning rate and schedule are the same on each")


# -- numbers for people, and the launch console's progress view -------------------------------------

def progress_text(rec: dict, elapsed: float, rate_s: float | None, goodput: float | None = None) -> str:
    """One progress line from a runtime report: step of total, epoch, loss, img/s, goodput so far, elapsed, time
    left. ``rate_s``: seconds per step over the run so far (None: not known yet); ``goodput``: the share of the
    time so far that trained (None: not known yet)."""
    parts = []
    step, total = rec.get("step"), rec.get("total")
    if step is not None:
        parts.append(f"step {step}/{total} ({step / total:.0%})" if total is not None and total > 0
                     else f"step {step}")
    if rec.get("epoch") is not None:
        parts.append(f"epoch {rec['epoch']}")
    if rec.get("loss") is not None:
        parts.append(f"loss {human_number(float(rec['loss']))}")
    if rec.get("samples_per_sec") is not None:
        parts.append(f"{human_number(float(rec['samples_per_sec']))} img/s")
    phase = rec.get("phase", "train")
    if phase != "train":
        parts.append(phase)
    if goodput is not None:
        parts.append(f"goodput {goodput:.0%}")
    parts.append(f"{human_seconds(elapsed)} elapsed")
    if rate_s is not None and step is not None and total is not None and total > 0:
        parts.append(f"{human_seconds(max(total - step, 0) * rate_s)} left")
    return " · ".join(parts)


class ProgressView:
    """The run's progress on the console, one line per run (the lowest rank that reports speaks for it):
    a live rich line on a terminal (``live``), else a plain line every PLAIN_EVERY_S seconds, on a new
    epoch or phase, and at the last step. ``close`` prints the end line (rounded)."""

    PLAIN_EVERY_S = 10.0
    LIVE_EVERY_S = 0.2

    def __init__(self, live: bool, clock=None):
        import time

        self.clock = clock or time.monotonic
        self.t0 = self.clock()
        self.live = None
        self.rank: int | None = None
        self.first: tuple[float, int] | None = None     # (time, step) of the first report with a step
        self.trained: dict[int, float] = {}     # step -> its seconds (a step redone after a restart counts once)
        self.trained_s = 0.0                    # their sum, kept as they come (a report must not add them all up)
        self.last: dict | None = None
        self.shown_at = -1e9
        self.shown: tuple | None = None
        if live:
            from rich.live import Live

            self.live = Live(console=console(stderr=True), auto_refresh=False, transient=True,
                             redirect_stdout=True, redirect_stderr=True)
            self.live.start()

    def __call__(self, rank: int, host: str, rec: dict) -> None:  # noqa: ARG002 - the Progress callback
        if self.rank is not None and rank > self.rank:
            return
        self.rank = rank
        now = self.clock()
        step = rec.get("step")
        if step is not None and self.first is None:
            self.first = (now, step)
        dt = rec.get("step_seconds")
        if isinstance(step, int) and isinstance(dt, (int, float)) and not isinstance(dt, bool) and dt >= 0:
            self.trained_s += float(dt) - self.trained.get(step, 0.0)
            self.trained[step] = float(dt)
        merged = {**(self.last or {}), **rec}
        if "step" in rec and "phase" not in rec:
            merged["phase"] = "train"
        self.last = merged
        goodput = min(self.trained_s / (now - self.t0), 1.0) if self.trained and now > self.t0 else None
        text = progress_text(merged, now - self.t0, self._rate(now, merged), goodput)
        if self.live is not None:
            if now - self.shown_at >= self.LIVE_EVERY_S or merged.get("step") == merged.get("total"):
                from rich.text import Text

                self.live.update(Text(text, style="bold"), refresh=True)
                self.shown_at = now
            return
        key = (merged.get("epoch"), merged.get("phase"))
        last_step = step is not None and step == merged.get("total")
        if now - self.shown_at >= self.PLAIN_EVERY_S or key != self.shown or last_step:
            print(f"podrun: progress: {text}", file=sys.stderr, flush=True)
            self.shown_at, self.shown = now, key

    def _rate(self, now: float, rec: dict) -> float | None:
        if self.first is None or rec.get("step") is None or rec["step"] <= self.first[1]:
            return None
        return (now - self.first[0]) / (rec["step"] - self.first[1])

    def close(self, say_end: bool = True) -> None:
        """Stop the live line; with ``say_end``, the end line from the last report (once)."""
        if self.live is not None:
            self.live.stop()
            self.live = None
        rec, self.last = self.last, None          # said once, however often it is closed
        if rec is None or rec.get("step") is None or not say_end:
            return
        now = self.clock()
        parts = [f"{rec['step']} steps in {human_seconds(now - self.t0)}"]
        if rec.get("samples_per_sec") is not None:
            parts.append(f"{human_number(float(rec['samples_per_sec']))} img/s")
        if rec.get("loss") is not None:
            parts.append(f"last loss {human_number(float(rec['loss']))}")
        print("podrun: " + ", ".join(parts), file=sys.stderr, flush=True)

"""The pure parts of watching a run: faulthandler dumps parsed, stacks merged by rank, numbers for people,
the progress line, the runtime's report call and the --hang-timeout option's refusals."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from podrun.cli.render import ProgressView, progress_text
from podrun.human import human_number, human_seconds
from podrun.launch import control, hangs, stacks
from podrun.wire.control import Ask
from podrun.launch.hangs import WatchOptions
from podrun.launch.stacks import Frame, ProcessStack, Thread, WorkerStack
from podrun.rundir.layout import CONTROL_SOCKET
from tests.harness.podrun_proc import run_podrun

TORCH = "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
DUMP = """Thread 0x00007f0c3eada6c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/work/train.py", line 12 in loader

Current thread 0x00007f0c3f83cb80 (most recent call first):
  File "{torch}", line 3252 in all_reduce
  File "/usr/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/work/train.py", line 88 in step
  File "/work/train.py", line 120 in <module>
""".format(torch=TORCH)


def test_a_dump_is_parsed_with_the_main_thread_first():
    threads = stacks.parse_dump(DUMP, "0x00007f0c3f83cb80")
    assert [t.ident for t in threads] == ["0x00007f0c3f83cb80", "0x00007f0c3eada6c0"]
    assert threads[0].main and not threads[1].main
    assert threads[0].frames[0] == Frame(TORCH, 3252, "all_reduce")
    assert threads[0].frames[2].where() == "train.py:88"
    # the main thread by its id even when another thread caught the signal
    other = stacks.parse_dump(DUMP, "0x00007f0c3eada6c0")
    assert other[0].ident == "0x00007f0c3eada6c0" and other[0].main


def test_only_the_newest_of_two_dumps_counts():
    second = DUMP.replace("line 88 in step", "line 90 in step")
    threads = stacks.parse_dump(DUMP + second, "0x00007f0c3f83cb80")
    assert len(threads) == 2 and threads[0].frames[2].line == 90


def _worker(rank: int, frames: list[Frame], host: str = "h1") -> WorkerStack:
    return WorkerStack(rank, rank // 2, rank % 2, host, processes=(ProcessStack(100 + rank, (Thread("0x1", True, tuple(frames)),)),))


def test_identical_stacks_are_grouped_and_the_odd_rank_out_leads():
    waiting = [Frame(TORCH, 3252, "all_reduce"), Frame("/work/train.py", 88, "step")]
    sleeping = [Frame("/work/train.py", 40, "load"), Frame("/work/train.py", 88, "step")]
    workers = [_worker(r, waiting) for r in (0, 2, 3, 4, 5, 6, 7)] + [_worker(1, sleeping, "h9")]
    groups = stacks.merge(workers)
    assert [g.ranks for g in groups] == [(1,), (0, 2, 3, 4, 5, 6, 7)]
    lines = stacks.render_lines(groups)
    assert lines[0] == "rank 1: load (train.py:40) <- train.py:88"
    assert lines[1] == "    on h9 (pid 101)"
    assert lines[2] == "ranks 0, 2-7: all_reduce (distributed_c10d.py:3252) <- train.py:88"


def test_a_rank_outside_torch_distributed_leads_even_when_groups_are_the_same_size():
    waiting = [Frame(TORCH, 3252, "all_reduce")]
    workers = [_worker(0, waiting), _worker(1, [Frame("/work/hang.py", 64, "main")])]
    assert [g.ranks for g in stacks.merge(workers)] == [(1,), (0,)]


def test_describe_shows_the_users_callers_and_elides_library_frames():
    frames = (Frame("/usr/lib/python3.11/selectors.py", 415, "select"),
              Frame("/usr/lib/python3.11/multiprocessing/connection.py", 947, "wait"),
              Frame("/work/hang.py", 72, "main"), Frame("/work/hang.py", 81, "<module>"))
    assert stacks.describe(frames) == "select (selectors.py:415) <- ... <- hang.py:72 <- hang.py:81"
    assert stacks.describe(()) == "(no Python frame)"


def test_rank_ranges():
    assert stacks.rank_ranges([7, 0, 2, 3, 4]) == "0, 2-4, 7"
    assert stacks.rank_ranges([5]) == "5"


def test_the_auto_window_follows_the_step_time_above_its_floor():
    auto = WatchOptions()
    assert auto.window([]) == hangs.AUTO_NO_STEPS_S
    assert auto.window([0.1] * 5) == hangs.AUTO_FLOOR_S
    assert auto.window([10.0] * 5) == hangs.AUTO_STEPS * 10.0
    fixed = WatchOptions(hang_timeout=4.0)
    assert fixed.window([]) == 4.0 and fixed.window([], started=False) == hangs.STARTUP_S
    assert WatchOptions(hang_timeout=None).window([1.0]) is None


@pytest.mark.parametrize("x,text", [(35.557809829711914, "35.6 s"), (0.25, "0.2 s"), (130, "2 min 10 s"),
                                    (120, "2 min"), (7500, "2 h 05 min")])
def test_seconds_for_people(x, text):
    assert human_seconds(x) == text


@pytest.mark.parametrize("x,text", [(2345.678, "2,346"), (12.345, "12.3"), (0.0123456, "0.0123"), (1.0, "1")])
def test_numbers_for_people(x, text):
    assert human_number(x) == text


def test_the_progress_line_is_rounded():
    line = progress_text({"step": 120, "total": 500, "epoch": 2, "loss": 1.234567, "samples_per_sec": 2345.678,
                          "phase": "train"}, 35.557809829711914, 0.5)
    assert line == "step 120/500 (24%) · epoch 2 · loss 1.23 · 2,346 img/s · 35.6 s elapsed · 3 min 10 s left"


def test_plain_progress_lines_once_per_epoch_and_at_the_end_from_the_lowest_rank(capsys):
    now = [0.0]
    view = ProgressView(live=False, clock=lambda: now[0])
    for step in range(1, 7):
        now[0] += 1.0
        for rank in (1, 0):
            view(rank, "h", {"step": step, "total": 6, "epoch": (step - 1) // 3, "loss": 1 / step,
                             "samples_per_sec": 1000.0 + rank})
    view.close()
    err = capsys.readouterr().err.splitlines()
    lines = [l for l in err if l.startswith("podrun: progress:")]
    # rank 1 spoke first, then rank 0 (lower) took over; then a line per new epoch and the last step
    assert [l.split(" · ")[0] for l in lines] == ["podrun: progress: step 1/6 (17%)",
                                                  "podrun: progress: step 4/6 (67%)",
                                                  "podrun: progress: step 6/6 (100%)"], err
    assert "1,000 img/s" in lines[-1] and "loss 0.167" in lines[-1]
    assert err[-1] == "podrun: 6 steps in 6.0 s, 1,000 img/s, last loss 0.167"


def test_report_is_a_no_op_outside_podrun():
    code = ("import os; os.environ.pop('PODRUN_PROGRESS_FD', None)\n"
            "from podrun.runtime import report\nprint(report(step=1, total=2, loss=0.5))")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert cp.stdout.strip() == "False", cp.stderr


def test_report_writes_one_json_line_to_the_agents_pipe():
    r, w = os.pipe()
    code = ("from podrun.runtime import report, phase\n"
            "print(report(step=3, total=9, epoch=0, loss=float('nan'), samples_per_sec=12.5))\n"
            "print(report(step=4, total=9))\n"           # merged: closer than MIN_INTERVAL_S to the last one
            "print(phase('checkpoint'))\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, pass_fds=(w,),
                        env={**os.environ, "PODRUN_PROGRESS_FD": str(w)})
    os.close(w)
    with os.fdopen(r) as f:
        recs = [json.loads(line) for line in f]
    assert cp.stdout.split() == ["True", "False", "True"], cp.stderr
    assert recs[0]["step"] == 3 and recs[0]["total"] == 9 and recs[0]["samples_per_sec"] == 12.5
    assert recs[0]["loss"] != recs[0]["loss"]       # NaN travels as NaN
    assert recs[1] == {"phase": "checkpoint"}


@pytest.mark.parametrize("value", ["abc", "0", "-3", "inf", "nan"])
def test_a_bad_hang_timeout_is_refused_naming_the_option(value, tmp_path):
    cp = run_podrun("launch", "--hang-timeout", value, "--runs-dir", tmp_path, "--", "true", timeout=60)
    assert cp.returncode == 2, cp.stderr
    assert "--hang-timeout" in cp.stderr and "Traceback" not in cp.stderr


def test_podrun_stack_with_no_running_launch_is_one_paragraph_exit_2(tmp_path):
    runs = tmp_path / "runs"
    (runs / "ended").mkdir(parents=True)
    none = run_podrun("stack", "--runs-dir", runs, timeout=60)
    assert none.returncode == 2 and "no running launch in" in none.stderr and "Traceback" not in none.stderr
    ended = run_podrun("stack", "--runs-dir", runs, "ended", timeout=60)
    assert ended.returncode == 2 and "run ended is not running" in ended.stderr, ended.stderr
    missing = run_podrun("stack", tmp_path / "nope", timeout=60)
    assert missing.returncode == 2 and "no such run directory" in missing.stderr, missing.stderr


def test_the_control_socket_answers_and_is_private(tmp_path):
    """A long run-dir path (longer than a unix socket address) still works: bound through /proc/self/fd."""
    run = tmp_path / ("x" * 120)
    run.mkdir()
    server = control.serve(str(run), lambda ask: {"echo": ask.what})
    try:
        assert control.ask(str(run), Ask("ping")) == {"echo": "ping"}
        assert (run / CONTROL_SOCKET).stat().st_mode & 0o777 == 0o600
    finally:
        control.stop(str(run), server)
    assert not (run / CONTROL_SOCKET).exists()


def test_the_worker_hook_dumps_on_the_signal_keeps_running_and_chains_the_users_sitecustomize(tmp_path):
    """podrun's sitecustomize (what the agent puts first on a worker's PYTHONPATH): the user's own
    sitecustomize still runs; the process registers (<pid>.main), dumps every thread on the signal into
    <pid>.txt, and goes on running."""
    import signal
    import time

    from podrun.host.stackdump import SITE_DIR, STACK_SIGNAL

    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("print('USER SITE', flush=True)\n")
    stack_dir = tmp_path / "stacks"
    stack_dir.mkdir()
    code = "import time\nprint('up', flush=True)\nwhile True:\n    time.sleep(0.05)  # HERE\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SITE_DIR, str(user)]), "PODRUN_STACK_DIR": str(stack_dir),
           "PODRUN_STACK_SIGNAL": str(STACK_SIGNAL)}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "USER SITE"
        assert p.stdout.readline().strip() == "up"
        main = (stack_dir / f"{p.pid}.main").read_text().strip()
        deadline = time.monotonic() + 20           # it may still stand on the print: ask until it is in the loop
        while time.monotonic() < deadline and "line 4" not in (stack_dir / f"{p.pid}.txt").read_text():
            os.kill(p.pid, STACK_SIGNAL)
            time.sleep(0.3)
        text = (stack_dir / f"{p.pid}.txt").read_text()
        threads = stacks.parse_dump(text, main)
        assert threads[0].main and threads[0].frames[0].line == 4, text
        # the dump did not end it: it answers another one, and is still there after it
        size = (stack_dir / f"{p.pid}.txt").stat().st_size
        os.kill(p.pid, STACK_SIGNAL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (stack_dir / f"{p.pid}.txt").stat().st_size == size and p.poll() is None:
            time.sleep(0.05)
        assert (stack_dir / f"{p.pid}.txt").stat().st_size > size and p.poll() is None
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)


def test_slow_ranks_rule_names_a_steady_straggler_once_and_never_flaps_on_spikes():
    """The pure rule: a few slow steps (under half the window) name nobody; a rank slow in most of its last
    SLOW_WINDOW reports is named once, with its host; it is named again only after it recovered."""
    from podrun.launch.slow_ranks import SLOW_WINDOW, SlowRanks

    w = SlowRanks()
    named = []
    for step in range(1, 3 * SLOW_WINDOW):
        for rank in range(4):
            spike = rank == 1 and step % 3 == 0          # rank 1: every third step 5x: noise, not a straggler
            busy = 0.5 if spike else 0.1
            if rank == 3 and step > SLOW_WINDOW:
                busy = 0.2                               # rank 3: steadily 2x from here on
            rec = w.add(rank, f"h{rank + 1}", busy, step)
            if rec is not None:
                named.append((step, rec["rank"], rec["host"]))
    assert [(r, h) for _, r, h in named] == [(3, "h4")], named
    assert SLOW_WINDOW < named[0][0] <= 2 * SLOW_WINDOW            # once most of its window is slow
    for step in range(3 * SLOW_WINDOW, 5 * SLOW_WINDOW):             # rank 3 recovers: cleared, not named
        for rank in range(4):
            assert w.add(rank, f"h{rank + 1}", 0.1, step) is None
    assert w.records[0]["until_step"] is not None and not w.slow
    again = [w.add(3, "h4", 0.3, s) for s in range(5 * SLOW_WINDOW, 6 * SLOW_WINDOW)]
    assert sum(r is not None for r in again) == 1 and len(w.records) == 2


def test_slow_ranks_window_counts_steps_when_reports_merge_them():
    """Short steps merged into reports of 2-3 steps each: a steady straggler is named once its reports cover
    SLOW_WINDOW steps (in SLOW_MIN_REPORTS or more), not after SLOW_WINDOW reports; its record says both."""
    from podrun.launch.slow_ranks import SLOW_MIN_REPORTS, SLOW_WINDOW, SlowRanks

    w = SlowRanks()
    named = None
    for step in range(3, 4 * SLOW_WINDOW, 3):                     # a report every 3 steps
        for rank in range(3):
            rec = w.add(rank, f"h{rank}", 0.15 if rank == 1 else 0.05, step)
            named = named or rec
    assert named is not None and named["rank"] == 1 and named["from_step"] <= SLOW_WINDOW + 6, named
    assert named["steps"] >= SLOW_WINDOW and SLOW_MIN_REPORTS <= named["reports"] < SLOW_WINDOW, named


def test_slow_ranks_ignore_tiny_gaps():
    """Busy times of microseconds: a 2x ratio inside timer noise (under SLOW_MIN_GAP_S) names nobody."""
    from podrun.launch.slow_ranks import SLOW_WINDOW, SlowRanks

    w = SlowRanks()
    assert all(w.add(r, "h", 0.0002 if r == 0 else 0.0001, s) is None
               for s in range(2 * SLOW_WINDOW) for r in range(3))


def test_slow_ranks_when_the_others_report_no_busy_time():
    """Others at 0 s (nothing measured before their last bucket): the slow rank is named without a ratio, and
    later reports keep it named without error."""
    from podrun.launch.slow_ranks import SLOW_WINDOW, SlowRanks, slow_rank_line

    w = SlowRanks()
    named = [w.add(r, f"h{r}", 0.5 if r == 1 else 0.0, s) for s in range(3 * SLOW_WINDOW) for r in range(3)]
    recs = [x for x in named if x is not None]
    assert [x["rank"] for x in recs] == [1] and recs[0]["ratio"] is None and recs[0]["max_ratio"] is None
    assert slow_rank_line(recs[0]).startswith("rank 1 on h1 is slow: busy 0.5 s per step against a median of 0 s")


def test_busy_or_stuck_is_told_by_stack_and_cpu_time():
    """hangs.busy_ranks: a rank moved when its main stack changed, or (outside a collective) it used CPU;
    a rank waiting in a collective is judged by its stack only; a rank seen once is no evidence."""
    S = hangs.RankSample
    still, other = (("a.py", 1, "f"),), (("a.py", 2, "f"),)
    before = {(0, 0): S(still, False, 1.0, 10.0), (0, 1): S(still, True, 5.0, 10.0), (0, 2): S(None, False, 0.0, 10.0)}
    assert hangs.busy_ranks(before, {(0, 0): S(still, False, 1.01, 11.0), (0, 1): S(still, True, 9.0, 11.0),
                                     (0, 2): S(None, False, 0.0, 11.0), (0, 3): S(other, False, 50.0, 11.0)}) == {}
    busy = hangs.busy_ranks(before, {(0, 0): S(still, False, 1.9, 11.0), (0, 1): S(other, True, 5.0, 11.0),
                                     (0, 2): S(None, False, 0.5, 11.0)})
    assert busy == {(0, 0): "used 0.90 s of CPU in 1.0 s", (0, 1): "its stack changed",
                    (0, 2): "used 0.50 s of CPU in 1.0 s"}
    assert hangs.probe_gap(600) == 1.0 and hangs.probe_gap(1) == 0.5


def test_line_assembler_cuts_as_bounded_lines_does():
    """The agent's per-message line assembler yields exactly what bounded_lines yields from the same bytes,
    however they are split into messages."""
    import io
    import random

    from podrun.wire.protocol import LineAssembler, bounded_lines

    rnd = random.Random(7)
    for _ in range(2000):
        limit = rnd.choice([4, 8, 16])
        data = bytes(rnd.choice(b"ab\n\r") for _ in range(rnd.randint(0, 80)))
        a, got, i = LineAssembler(limit), [], 0
        while i < len(data):
            j = i + rnd.randint(0, 10)
            got += a.feed(data[i:j])
            i = j
        assert got + a.end() == list(bounded_lines(io.BytesIO(data), limit)), (limit, data)


def test_slow_ranks_compare_with_every_reporting_rank_not_only_full_windows():
    """Seen in CI over ssh: rank 2 (the straggler, 0.6 s) reports one step behind ranks 0 and 1; rank 1,
    loaded (0.25 s against rank 0's 0.16 s), filled its window while rank 2's still had 9 reports and was
    named slow against rank 0 alone. Compared with every rank that has reported, only rank 2 is named."""
    from podrun.launch.slow_ranks import SLOW_WINDOW, SlowRanks

    w = SlowRanks()
    busy = {0: 0.16, 1: 0.25, 2: 0.6}
    named = []
    for step in range(1, 3 * SLOW_WINDOW):
        for rank, at in ((0, step), (1, step), (2, step - 1)):
            if at >= 1:
                rec = w.add(rank, f"h{rank + 1}", busy[rank], at)
                if rec is not None:
                    named.append((rec["rank"], rec["host"], rec["others_median_s"]))
    assert named == [(2, "h3", pytest.approx(0.205))], named


@pytest.mark.parametrize("chunks,lines,parts", [
    ([b"name? ", b"bob\n"], [b"name? bob"], [("name? ", False)]),                   # a prompt, then its answer
    ([b"\r  0%|", b"\r 50%|", b"\r100%|", b"\n"], [b"100%|"],                      # a \r bar: each state
     [("  0%|", True), (" 50%|", True), ("100%|", True)]),                          # replaces the last one
    ([b"abc\r", b"\n"], [b"abc"], [("abc", False)]),                                # \r\n ends a line
    ([b"x\n(Pdb) ", b"42\n(Pdb) "], [b"x", b"(Pdb) 42"], [("(Pdb) ", False), ("(Pdb) ", False)]),
    ([b"caf\xc3", b"\xa9!"], [], [("caf", False), ("caf\u00e9!", False)]),          # a character cut in two waits
])
def test_a_workers_unended_line_is_given_as_its_last_state(chunks, lines, parts):
    """The agent's assembler of a worker's output (frames): the line not ended yet as it stands after each
    chunk (what a terminal shows: a prompt, a bar's last redraw), and the lines as the log keeps them."""
    from podrun.wire.protocol import LineAssembler

    a, got_lines, got_parts = LineAssembler(frames=True), [], []
    for chunk in chunks:
        got_lines += a.feed(chunk)
        got_parts += [p for p in [a.partial()] if p is not None]
    assert (got_lines, got_parts) == (lines, parts)


@pytest.mark.parametrize("opts,window,said", [
    (WatchOptions("auto"), 600, "auto window 10 min"),
    (WatchOptions("auto", source="hang_timeout in c.yaml"), 120, "auto window 2 min, hang_timeout in c.yaml"),
    (WatchOptions(600.0), 600, "--hang-timeout 600"),
    (WatchOptions(900.0, source="hang_timeout in r/recipe.yaml"), 900, "hang_timeout 900 in r/recipe.yaml"),
    (WatchOptions(5.0), 60, "start-up floor 1 min before the first output; --hang-timeout 5 after it"),
])
def test_the_hang_window_says_where_it_came_from(opts, window, said):
    assert opts.describe(window) == said


def test_the_console_shows_an_unended_line_once_and_redraws_a_bar_on_a_terminal(monkeypatch):
    """The launch console's rendering of ``part`` lines, on a terminal and on a pipe: a prompt shown with its
    prefix, the line that ends it prints the rest only; a \\r bar redrawn in place on a terminal, its final state
    alone on a pipe; another rank's line first ends the shown one; a frame is cut to the terminal's width."""
    import io
    from types import SimpleNamespace

    from podrun.cli.console import Console
    from podrun.wire.protocol import Part

    class Screen(io.StringIO):
        def __init__(self, tty):
            super().__init__()
            self.tty = tty

        def isatty(self):
            return self.tty

    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "80")
    shown = {}
    for tty in (False, True):
        screen = Screen(tty)
        monkeypatch.setattr(sys, "stdout", screen)
        monkeypatch.setattr(sys, "stderr", screen)
        con = Console(SimpleNamespace(device_kind="cpu", replicas_per_instance=1), False)
        con.partial(0, "h", 0, Part("out", False, "name? "))
        con(0, "h", 0, "out", "name? bob")
        con.partial(0, "h", 0, Part("err", True, " 50%|#"))
        con.partial(0, "h", 0, Part("err", True, "100%|##"))
        con(0, "h", 0, "err", "100%|##")
        con.partial(0, "h", 0, Part("out", False, "(Pdb) "))
        con(1, "h", 0, "out", "from rank 1")
        con(0, "h", 0, "out", "(Pdb) 42")
        shown[tty] = screen.getvalue()
    assert shown[True] == ("[0 h] name? bob\n[0 h]  50%|#\r\x1b[K[0 h] 100%|##\n"
                           "[0 h] (Pdb) \n[1 h] from rank 1\n[0 h] 42\n")
    assert shown[False] == "[0 h] name? bob\n[0 h] 100%|##\n[0 h] (Pdb) \n[1 h] from rank 1\n[0 h] 42\n"
    monkeypatch.setenv("COLUMNS", "12")       # a frame wider than the terminal is cut to fit: \r redraws one row
    con.partial(0, "h", 0, Part("err", True, "100%|########"))
    assert screen.getvalue().endswith("[0 h] 42\n[0 h] 100%|")


INTERLEAVE = """
import sys, threading
from types import SimpleNamespace
from podrun.cli.console import Console

con = Console(SimpleNamespace(device_kind="cpu", replicas_per_instance=1), False)
def lines(index, stream):
    for _ in range(3000):
        con(index, f"h{index}", 0, stream, "x" * 60)
threads = [threading.Thread(target=lines, args=(i, s)) for i, s in ((0, "out"), (1, "err"))]
for t in threads:
    t.start()
for t in threads:
    t.join()
con.notice("the end")
"""


def test_console_lines_from_two_threads_stay_whole_on_one_unbuffered_file():
    """stdout and stderr on one pipe (2>&1) under PYTHONUNBUFFERED, as CI runs podrun: two threads each show 3,000
    workers' lines, one on stdout, one on stderr. Every line arrives whole (print() wrote a line and its newline in
    two writes, and the other thread's line landed between them)."""
    cp = subprocess.run([sys.executable, "-c", INTERLEAVE], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True, timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"})
    assert cp.returncode == 0, cp.stdout[-2000:]
    got = cp.stdout.splitlines()
    bad = [line for line in got if line not in ("[0 h0] " + "x" * 60, "[1 h1] " + "x" * 60, "podrun: the end")]
    assert not bad and len(got) == 6001, (len(got), bad[:5])

"""The supervisor's watch of a live run: progress reports, the hang window, stack collections, slow ranks.

A hang is no progress from any worker (an output line, or a ``prog`` report outside eval/checkpoint) for the
hang window (podrun.launch.hangs.WatchOptions) and, for a plain script that reports nothing through the runtime,
no rank moved between two samples of its stack and CPU time taken as the window ends (hangs.busy_ranks): then it
first asks every agent for its workers' stacks (``S``), writes them to runs/<id>/stacks/ and shows them merged. A
rank blocked reading the launcher's stdin when sampled (input(), pdb's prompt) is waiting for its user: no hang.
A rank whose reported busy time stays well above the others' is named once (podrun.launch.slow_ranks.SlowRanks)
with its cause from its step split (input, compute, comm, optim: slow_ranks.StepSplits) and listed in
summary.json's ``slow_ranks``; a run where every rank waits for input is named once with what to change, and each
rank's mean split is summary.json's ``step_split``. ``podrun stack`` asks for the same view through the run's control
socket at any time. The Supervisor holds a LiveWatch, feeds it the workers' progress and stack replies, and calls
``tick`` at each turn of its loop; a hang that ends the run comes back as a Failure.
"""
from __future__ import annotations

import contextlib
import math
import queue
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from podrun.errors import PodrunError
from podrun.human import human_seconds
from podrun.launch import hangs, slow_ranks, stacks
from podrun.launch.outcome import Failure, FailureKind, Instances, InstanceState
from podrun.launch.request import LaunchRequest
from podrun import safefs
from podrun.rundir.layout import STACKS, private_subdir
from podrun.launch.transports.base import InstanceHandle
from podrun.redaction import redact_record, redact_text
from podrun.wire import protocol

# progress(rank, host, record): a worker's progress report (podrun.runtime.progress), for the console
Progress = Callable[[int, str, dict], None]


class LiveWatch:
    """The Supervisor's part that watches progress and hangs and collects stacks (the module says how), for the
    ``instances`` of ``request``; ``merged``: the transport's agents read no stdin (they watch the run directory);
    ``hung`` takes a hang that ends the run."""

    def __init__(self, request: LaunchRequest, instances: Instances, notice: Callable[[str], None], merged: bool,
                 hung: Callable[[Failure], None], watch: hangs.WatchOptions | None = None,
                 progress: Progress | None = None):
        self.req, self.instances, self.notice, self.merged, self.hung = request, instances, notice, merged, hung
        self.watch = watch or hangs.WatchOptions(hang_timeout=None)
        self.progress = progress
        self.last_progress = time.monotonic()
        self.started = False                     # some worker made progress in this attempt
        self.step_times: list[float] = []       # recent step_seconds reported by any worker (auto window)
        self.slow = slow_ranks.SlowRanks()         # each rank's recent busy_seconds: names a slow rank
        self.hosts = slow_ranks.HostBusy()         # each host's busy time per step over the run (the report's lines)
        self.splits = slow_ranks.StepSplits()      # each rank's step split: a slow rank's cause, an input-bound run
        self.phases: dict[tuple[int, int | None], str] = {}   # (instance, local rank) -> last reported phase
        self.dump: stacks.StackCollection | None = None  # the stack collection in flight
        self.reported = False                    # a worker reported through podrun's runtime in this attempt
        # a plain script's first sample of a silence: (last_progress it was taken in, {(instance, lr): RankSample})
        self.sample: tuple[float, dict] | None = None
        self.busy_reset: float | None = None     # the new window the last busy verdict opened (its last_progress)
        self.quiet_from = 0.0                    # the last real progress before busy verdicts' new windows
        self.waiting_said: float | None = None   # the quiet_from of the silence a rank reading stdin was said in
        self.waiting_at: float | None = None     # the window a rank reading stdin opened (its last_progress)
        self.asks: queue.Queue = queue.Queue()   # control-socket requests: (done event, reply holder)
        self.hang: dict | None = None            # the hang found (summary.json's hang)

    # -- progress, hangs and stacks ------------------------------------------------------------
    def moved(self, now: float, started: bool = True) -> None:
        """A worker wrote a line (``started``: it made progress) or ended: a new hang window from ``now``."""
        self.last_progress = now
        self.started = self.started or started

    def got_stacks(self, instance: int, lr: int | None, text: str) -> None:
        """A worker's stacks (a ``stack`` line) for the collection in flight."""
        if self.dump is not None and lr is not None and (got := protocol.Stacks.read(text)) is not None:
            self.dump.got[(instance, lr)] = got

    def progress_report(self, st: InstanceState, lr: int | None, text: str, now: float) -> None:
        if (rec := protocol.Progress.read(text)) is None or lr is None:
            return
        self.last_progress, self.started, self.reported = now, True, True
        self.phases[(st.index, lr)] = rec.phase
        if rec.step_seconds is not None and rec.step_seconds > 0:
            self.step_times.append(rec.step_seconds)
            del self.step_times[:-hangs.AUTO_WINDOW]
        if rec.split is not None:
            bound = self.splits.add(self.instances.rank(st.index, lr), st.host, rec.split)
            if bound is not None:
                self.notice(slow_ranks.input_bound_line(bound))
        busy = rec.busy_seconds
        if busy is not None and math.isfinite(busy) and busy >= 0:
            rank = self.instances.rank(st.index, lr)
            named = self.slow.add(rank, st.host, busy, rec.step)
            self.hosts.add(rank, st.host, busy, rec.step)
            if named is not None:
                named.update(self.splits.cause(rank))
                self.notice(slow_ranks.slow_rank_line(named))
        if self.progress is not None:
            try:
                self.progress(self.instances.rank(st.index, lr), st.host, rec.to_dict())
            except Exception:  # noqa: BLE001 - a closed terminal must not stop supervision
                self.progress = None

    def tick(self, now: float, handles: Iterable[InstanceHandle], stopping: bool) -> None:
        """Start a dump on a hang or on a control-socket request, asking ``handles`` (new hangs are not looked
        for while the run is ``stopping``); finish one that is complete or overdue."""
        while not self.asks.empty():     # this loop alone takes from it
            if self.dump is None:
                self._start_dump("request", now, handles)
            self.dump.asks.append(self.asks.get_nowait())
        if self.dump is not None:
            if self.dump.complete(now):
                self._finish_dump()
            return
        win = self.watch.window(self.step_times, self.started)     # None: hangs are not watched
        if win is None or stopping:
            return
        silent = now - self.last_progress
        if self.reported:               # the runtime's step reports set the window: silence past it is a hang
            if silent > win and all(self.phases.get(k, "train") == "train" for k in self.instances.running()):
                self._start_dump("hang", now, handles, win)   # not in eval or checkpoint (the runtime said so)
            return
        # a plain script: silence is judged by two samples of every rank's stack and CPU time, the first
        # taken just before the window ends, the second when it ends (hangs.busy_ranks)
        fresh = self.sample is not None and self.sample[0] == self.last_progress
        if not fresh and silent > win - hangs.probe_gap(win):
            self._start_dump("probe", now, handles, win)
        elif fresh and silent > win:
            self._start_dump("hang", now, handles, win)

    def _start_dump(self, reason: str, now: float, handles: Iterable[InstanceHandle],
                    window: float | None = None) -> None:
        self.dump = stacks.StackCollection(reason, window, self.instances.running(), now + stacks.DUMP_WAIT_S,
                                           now - self.last_progress)
        if reason == "hang" and self.reported and self.waiting_at != self.last_progress:   # a plain script's is
            # said once the samples say stuck; a rank still reading stdin since the last window is no news
            self.notice(f"no progress from any rank for {human_seconds(window)} ({self.watch.describe(window)}); "
                        "collecting every worker's stacks")
        self.dump.progress_at = self.last_progress
        for h in handles:
            with contextlib.suppress(Exception):   # a broken link shows as a worker without stacks
                h.request_stacks()
        if self.merged:                  # mpirun/srun agents have no stdin: they watch the run dir
            try:
                protocol.write_request(self.req.run_dir)
            except OSError as exc:
                self.notice(f"cannot ask the mpirun/srun agents for stacks: {exc.strerror or exc}")

    def end(self) -> None:
        """The run ended: a collection in flight answers who asked, and blames no one."""
        if self.dump is not None:
            self.dump.reason = "request"
            self._finish_dump()

    def _finish_dump(self) -> None:
        d, self.dump = self.dump, None
        workers = []
        for inst, lr in d.want:
            st = self.instances[inst]
            rec = d.got.get((inst, lr))
            rank = self.instances.rank(inst, lr)
            if rec is None:
                workers.append(stacks.WorkerStack(rank, inst, lr, st.host, "its agent sent no stacks in time "
                                                  "(host cut off, or under mpirun/srun a run dir it does not share)"))
                continue
            procs = tuple(stacks.ProcessStack(int(p.get("pid", 0)), stacks.parse_dump(str(p.get("text", "")),
                                                                                           p.get("main")))
                          for p in rec.procs)
            procs = tuple(p for p in procs if p.threads)
            workers.append(stacks.WorkerStack(rank, inst, lr, st.host, None if procs else rec.problem or "no stack",
                                              procs))
        groups = stacks.merge(workers)
        lines = stacks.render_lines(groups)
        busy = self._judge(d, workers)
        waiting = {} if busy or d.reason != "hang" else self._waiting(d, workers)
        exiting = self._exiting(d, workers) if d.reason == "hang" and not busy and not waiting else {}
        busy = busy or waiting or exiting
        if d.asks or (d.reason == "hang" and not busy):
            self._write_stacks(workers, lines)
        reply = redact_record({"run_id": self.req.run_id, "ranks": len(workers), "groups": stacks.to_json(groups),
                               "lines": lines, "stacks_dir": str(Path(self.req.run_dir) / STACKS)})
        for done, holder in d.asks:
            holder.append(reply)
            done.set()
        if d.reason != "hang":
            return
        if busy:
            if self.busy_reset != d.progress_at:     # real progress since the last verdict: a new silence
                self.quiet_from = d.progress_at
            self.last_progress = self.busy_reset = time.monotonic()   # a new window, a new first sample in it
            quiet = f"no output from any rank for {human_seconds(self.last_progress - self.quiet_from)} " \
                    f"({self.watch.describe(d.window)})"
            if waiting:
                self.waiting_at = self.last_progress
                if self.waiting_said != self.quiet_from:     # once a silence: the user knows what they left
                    self.waiting_said = self.quiet_from
                    ranks = stacks.rank_ranges(sorted(self.instances.rank(*k) for k in waiting))
                    self.notice(f"{quiet}, but rank {ranks} is reading its stdin (input(), pdb's prompt): waiting "
                                "for its user, not hung; watching on")
                return
            if exiting:
                self.notice(f"{quiet}, but every silent rank's program has returned and its process is exiting: "
                            f"not hung; waiting for its exit up to {hangs.EXIT_WINDOWS} windows in all")
                return
            why = "; ".join(f"rank {self.instances.rank(*k)} {w}" for k, w in sorted(busy.items())[:4])
            self.notice(f"{quiet}, but {len(busy)} rank(s) moved ({why}{'; ...' if len(busy) > 4 else ''}): "
                        "busy, not hung; watching on")
            return
        if not self.reported:
            self.notice(f"no progress from any rank for {human_seconds(d.window)} ({self.watch.describe(d.window)}), "
                        "and no rank moved between two samples of its stack and CPU time; collecting every "
                        "worker's stacks")
        self.notice(f"the stacks of {len(workers)} worker(s), odd ranks first "
                    f"(every thread in {Path(self.req.run_dir) / STACKS}/rank-N.txt):\n  "
                    + "\n  ".join(lines))
        self.hang = {"window_s": d.window, "silent_s": round(d.silent_s, 3), "on_hang": self.watch.on_hang,
                     "found_s": round(time.monotonic() - d.progress_at, 3),
                     "judged_by": "progress reports" if self.reported else "stack and CPU samples",
                     "groups": [{"ranks": list(g.ranks), "hosts": sorted({w.host for w in g.workers}),
                                 "stack": next((f.where() for f in g.workers[0].main_frames()), None),
                                 "summary": g.workers[0].summary()} for g in groups]}
        if self.watch.on_hang == "end" and groups:
            odd = groups[0].workers[0]
            odd_label = "the odd rank out" if len(groups) > 1 else "every rank"
            self.hung(Failure(
                odd.instance, odd.host, odd.local_rank, hangs.HANG_EXIT, FailureKind.HUNG,
                f"hung: no progress from any rank for {human_seconds(d.window)} ({self.watch.describe(d.window)}); "
                f"{odd_label}: rank {odd.rank} on {odd.host} in {odd.summary()}", time.time()))
        else:
            self.last_progress = time.monotonic()    # dump again after another silent window

    @staticmethod
    def _waiting(d: stacks.StackCollection, workers: list) -> dict:
        """The ranks ((instance, local rank) -> why) blocked reading the launcher's stdin when sampled: a rank in
        input() or at pdb's prompt waits for its user, whom no window bounds, and the others may wait for it."""
        recs = {(w.instance, w.local_rank): d.got.get((w.instance, w.local_rank)) for w in workers}
        return {k: "reads its stdin" for k, r in recs.items() if r is not None and r.stdin}

    def _exiting(self, d: stacks.StackCollection, workers: list) -> dict:
        """Every silent rank's program has returned and its process is exiting (a long exit: a library's C++
        destructors, gloo's teardown on a loaded host): those ranks -> why, while the whole silence is within
        hangs.EXIT_WINDOWS windows; empty otherwise (then a stalled exit is a hang like any other)."""
        recs = [d.got.get((w.instance, w.local_rank)) for w in workers]
        if not workers or d.window is None or not all(r is not None and r.exiting for r in recs):
            return {}
        since = self.quiet_from if self.busy_reset == d.progress_at else d.progress_at
        if time.monotonic() - since > hangs.EXIT_WINDOWS * d.window:
            return {}
        return {(w.instance, w.local_rank): "is exiting" for w in workers}

    def _judge(self, d: stacks.StackCollection, workers: list) -> dict:
        """For a plain script's collection: keep a first sample ("probe"), or compare the second ("hang") with
        it; returns the busy ranks ((instance, local rank) -> why), empty when stuck or not judged here."""
        if self.reported or d.reason not in ("probe", "hang"):
            return {}
        now = {}
        for w in workers:
            rec = d.got.get((w.instance, w.local_rank)) or protocol.Stacks()
            now[(w.instance, w.local_rank)] = hangs.RankSample(w.key() if w.processes else None,
                                                               stacks.in_collective(w), rec.cpu, rec.at)
        if d.reason == "probe":
            self.sample = (d.progress_at, now)
            return {}
        before = self.sample[1] if self.sample is not None and self.sample[0] == d.progress_at else {}
        self.sample = None
        return hangs.busy_ranks(before, now)

    def _write_stacks(self, workers: list, lines: list[str]) -> None:
        where = Path(self.req.run_dir) / STACKS
        try:
            private_subdir(self.req.run_dir, STACKS, "stacks directory")
            for w in workers:
                safefs.write_file(where / f"rank-{w.rank}.txt", redact_text(stacks.stack_file_text(w)), "stacks file",
                                  durable=False)
            safefs.write_file(where / "merged.txt", redact_text("\n".join(lines) + "\n"), "stacks file", durable=False)
        except OSError as exc:
            self.notice(f"cannot write the stacks to {where}: {exc.strerror or exc}")
        except PodrunError as exc:
            self.notice(f"not writing the stacks: {exc.message}")

    def request_stacks(self, timeout: float = stacks.DUMP_WAIT_S * 3) -> dict:
        """From another thread (the control socket): the merged stacks of the running workers, now."""
        done, holder = threading.Event(), []
        self.asks.put((done, holder))
        if not done.wait(timeout) or not holder:
            return {"error": "the run did not answer in time (it may be ending)"}
        return holder[0]

"""The live state of a running launch as one record: progress, the account so far, each host and rank, the slow and
lost ones, the latest root cause; read from the controller's Supervisor on demand (podrun top's --json and the
control socket's ``state`` request, the metrics server's scrape)."""
from __future__ import annotations

import contextlib
import time
from typing import Any

from podrun.launch.observe import RunObserver
from podrun.rundir.layout import SPLIT_PARTS
from podrun.rundir.summary import Attempt, Summary

STATE_ASK = "state"        # the control-socket request that answers the live state
LABELLED = 64              # hosts (ranks) named one by one at most; past it the slowest and fastest EDGE and the lost
EDGE = 8
PROGRESS_FIELDS = ("step", "total", "epoch", "loss", "samples_per_sec", "step_seconds", "phase")


def bounded(rows: list[dict], busy_key: str = "busy_s") -> list[dict]:
    """``rows`` whole up to LABELLED; past it the EDGE slowest and EDGE fastest by ``busy_key`` and up to EDGE lost
    or slow ones, so a board of 512 hosts keeps a bounded label set (as the report shows the extremes)."""
    if len(rows) <= LABELLED:
        return rows
    timed = sorted((r for r in rows if isinstance(r.get(busy_key), (int, float))), key=lambda r: -r[busy_key])
    keep = {id(r): r for r in [*timed[:EDGE], *timed[-EDGE:],
                                *[r for r in rows if r.get("state") == "lost" or r.get("slow")][:EDGE]]}
    return [r for r in rows if id(r) in keep]


def host_row(host: str, instance: int, state: str, age: float | None, exit_code: int | None,
             ranks: list[dict]) -> dict:
    """A host's row of the view (live, or from the run's records): its ranks' mean busy time and mean step split
    (of those whose parts are all measured), slow where one of its ranks is."""
    mine = [r for r in ranks if r["host"] == host]
    busy = [r["busy_s"] for r in mine if isinstance(r["busy_s"], (int, float))]
    splits = [r["split"] for r in mine if r["split"] and all(isinstance(r["split"].get(k), (int, float))
                                                             for k in SPLIT_PARTS)]
    return {"host": host, "instance": instance, "state": state,
            "heartbeat_age_s": None if age is None else round(age, 3),
            "busy_s": round(sum(busy) / len(busy), 6) if busy else None,
            "split": {k: round(sum(s[k] for s in splits) / len(splits), 6) for k in SPLIT_PARTS} if splits else None,
            "slow": any(r["slow"] for r in mine), "exit_code": exit_code}


def host_counts(hosts: list[dict]) -> dict[str, int]:
    """The view's host totals: every host, those running, those lost."""
    return {"hosts_total": len(hosts), "hosts_running": sum(h["state"] == "running" for h in hosts),
            "hosts_lost": sum(h["state"] == "lost" for h in hosts)}


def cause_line(rc: dict) -> str:
    """A root cause as the view says it: its reason, instance and host."""
    return f"{rc.get('reason')} (instance {rc.get('instance')} on {rc.get('host')})"


class LiveState(RunObserver):
    """The run's state as the controller holds it, for any live view: ``snapshot()`` from any thread."""

    what = "the live state"

    def __init__(self):
        self.request = None
        self.sup = None
        self.attempts: tuple[Attempt, ...] = ()
        self.launch_no = 0
        self.last: dict[int, dict] = {}      # rank -> its last progress report's fields
        self.summary: Summary | None = None  # the last summary.json written
        self.ended = False
        self.feed = None                     # metrics.jsonl as read so far (a podrun.rundir.metrics.StepLogFeed)

    # -- RunObserver ----------------------------------------------------------------------------
    def started(self, request) -> None:
        self.request = request

    def attempt(self, supervisor, attempts: tuple[Attempt, ...], launch_no: int) -> None:
        self.sup, self.attempts, self.launch_no, self.last = supervisor, tuple(attempts), launch_no, {}
        self.request = supervisor.req
        supervisor.answers[STATE_ASK] = self.snapshot

    def progress(self, rank: int, host: str, record: dict) -> None:
        self.last[rank] = {k: record[k] for k in PROGRESS_FIELDS if k in record}

    def recorded(self, summary: Summary) -> None:
        self.summary = summary

    def close(self) -> None:
        self.ended = True

    # -- the record -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The live state (the module says what); a dict changed under the copy is copied again."""
        for _ in range(5):
            with contextlib.suppress(RuntimeError):     # a dict changed size while copied (the supervisor's thread)
                return self._snapshot()
        return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        req, sup = self.request, self.sup
        out: dict[str, Any] = {"run_id": getattr(req, "run_id", None), "run_dir": getattr(req, "run_dir", None),
                               "recipe": getattr(getattr(req, "plan", None), "recipe", None),
                               "cluster": getattr(getattr(req, "plan", None), "cluster", None),
                               "transport": getattr(req, "transport", None),
                               "restarts": getattr(req, "restart_count", 0),
                               "max_restarts": getattr(req, "max_restarts", 0),
                               "running": sup is not None and not self.ended and not self._attempt_over()}
        out.update(self._progress())
        out["account"] = self._account()
        ranks = self._ranks() if sup is not None else []
        hosts = self._hosts(ranks) if sup is not None else []
        out.update(host_counts(hosts))
        out["hosts"], out["ranks"] = bounded(hosts), bounded(ranks)
        ratios = [r.get("max_ratio") for r in list(sup.live.slow.slow.values())] if sup is not None else []
        ratios = [x for x in ratios if isinstance(x, (int, float))]
        out["slow_ratio"] = max(ratios) if ratios else None
        out["slow_ranks"] = [r["rank"] for r in ranks if r["slow"]]      # ranks come sorted, each once
        out["root_cause"] = self._root_cause() if sup is not None else None
        return out

    def _attempt_over(self) -> bool:
        return self.summary is not None and len(self.summary.attempts) > len(self.attempts)

    def _progress(self) -> dict[str, Any]:
        last = dict(self.last)
        lead = last.get(min(last)) if last else None
        got = {k: (lead or {}).get(k) for k in PROGRESS_FIELDS}
        rates = [r["samples_per_sec"] for r in last.values() if isinstance(r.get("samples_per_sec"), (int, float))]
        got["samples_per_sec"] = max(rates) if rates else None     # the global rate every rank reports
        step, total, dt = got.get("step"), got.get("total"), got.get("step_seconds")
        got["time_left_s"] = (round((total - step) * dt, 1) if isinstance(step, int) and isinstance(total, int)
                              and isinstance(dt, (int, float)) and total >= step else None)
        return got

    def _account(self) -> dict | None:
        """The account so far: the summary's once this attempt is recorded, else its own attempts and the live one."""
        from podrun.launch.run import run_account
        from podrun.rundir.metrics import StepLogFeed

        if self.summary is not None and (self.ended or self._attempt_over()) or self.sup is None:
            acc = None if self.summary is None else self.summary.account
            return None if acc is None else acc.record()
        inst = self.sup.instances
        ready = [s.ready_s for s in list(inst.values())]
        now = Attempt(self.launch_no, started=float(inst.t0), ended=time.time(),
                      all_ready_s=max(ready) if ready and None not in ready else None)     # running: no status yet
        if self.feed is None:
            self.feed = StepLogFeed()
        return run_account(self.request.run_dir, [*self.attempts, now], self.launch_no,
                           self.feed.follow(self.request.run_dir)).record()

    def _ranks(self) -> list[dict]:
        live = self.sup.live
        slow = dict(live.slow.slow)
        busy = {r: v[-1][0] for r, v in list(live.slow.busy.items()) if v}
        sums = dict(live.splits.sums)       # rank -> (host, reports, its splits summed); a rank not yet in it: busy
        out = []
        for r in sorted({*sums, *busy}):
            host, n, total = sums[r] if r in sums else (self._host_of(r), None, None)
            out.append({"rank": r, "host": host, "busy_s": busy.get(r),
                        "split": None if total is None else {k: round(getattr(total, k) / n, 6) for k in SPLIT_PARTS},
                        "reports": n, "slow": r in slow})
        return out

    def _host_of(self, rank: int) -> str | None:
        return next((self.sup.instances[inst].host for (inst, _), r in list(self.sup.instances.rank_of.items())
                     if r == rank), None)

    def _hosts(self, ranks: list[dict]) -> list[dict]:
        hearing = self.sup.listener.hearing
        return [host_row(st.host, st.index, st.status.value if hasattr(st.status, "value") else str(st.status),
                         hearing.silent_for(st.index) if st.exit_code is None else None, st.exit_code, ranks)
                for st in sorted(list(self.sup.instances.values()), key=lambda s: s.index)]

    def _root_cause(self) -> str | None:
        fails = list(self.sup.failures)
        if fails:
            f = min(fails, key=lambda x: x.at)
            return cause_line({"reason": f.reason, "instance": f.instance, "host": f.host})
        for a in reversed(self.summary.attempts if self.summary is not None and self.summary.attempts
                          else self.attempts):
            if isinstance(a.root_cause, dict) and a.root_cause.get("reason"):
                return cause_line(a.root_cause)
        return None

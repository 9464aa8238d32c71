"""The controller's in-place recovery: on a lost host, the survivors are told the new plan and go on in their own
processes; when anything in place fails, the run restarts as it would have.

The Supervisor asks ``begin`` when it declares a host lost. It recovers in place only when every surviving worker
said it can (an ``inplace: ready`` progress record: podrun's recipes on CPU, podrun.train.inplace_loop), the lost
host is not rank 0's (whose agent serves the store the new group forms on), and the re-plan (podrun.elastic.replan,
the same decision as a restart's) keeps the survivors, in their order, with no spare. Then each survivor's agent
gets the new plan on its stdin (podrun.wire.plan_token), the lost host's failure is held back, and the survivors'
records say how far they are: ``abandoned`` (the plan read, the group abandoned), ``reformed`` (re-formed,
re-sharded) and ``trained`` (the first update after it completed). All trained: the recovery is recorded (summary.json's elastic.replans, ``path``
"in-place", with its breakdown) and the attempt goes on. A survivor that says it failed, that fails, that has not
abandoned its group or re-formed within REFORM_S (named: those whose abort hangs first), or a second loss before the end: the held failure is let go (it is the earliest, so the
root cause), the attempt ends everywhere and the run restarts from the snapshots; ``failed_why`` says why.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from podrun.wire.protocol import from_json
from podrun.elastic.replan import ElasticPolicy, ElasticRecord, Replan, decomposition, describe, next_plan

REFORM_S = 15.0            # from the plan sent to every survivor re-formed


@dataclass
class Pending:
    """A recovery under way: the held failure, the decision, who must answer, and what they said."""

    failure: Any
    decision: Replan
    generation: int
    lost_at: float
    detection_s: float | None
    survivors: dict[tuple[int, int], int]           # (instance, local rank) -> new rank
    deadline: float
    abandoned: dict[tuple[int, int], dict] = field(default_factory=dict)
    reformed: dict[tuple[int, int], dict] = field(default_factory=dict)
    trained: dict[tuple[int, int], dict] = field(default_factory=dict)


class InPlaceRecovery:
    """One run's in-place recoveries (the module says how); ``plan`` is the plan the workers run now."""

    def __init__(self, policy: ElasticPolicy, record: ElasticRecord, plan, restart_count: int,
                 notice: Callable[[str], None], workers_per_instance: int = 1):
        self.policy, self.record, self.plan, self.restart = policy, record, plan, restart_count
        self.notice, self.wpi = notice, workers_per_instance
        self.ready: set[tuple[int, int]] = set()
        self.pending: Pending | None = None
        self.generation = 0
        self.failed_why: str | None = None     # why the last recovery in place did not happen or failed

    # -- what the Supervisor calls --------------------------------------------------------------------------------
    def heard(self, sup, st, local_rank: int | None, text: str) -> bool:
        """A progress record: True when it was the in-place recovery's (then it is not the live watch's)."""
        if '"inplace"' not in text or local_rank is None:
            return False
        rec = from_json(text)
        kind = rec.get("inplace") if rec is not None else None
        if not isinstance(kind, str):
            return False
        key = (st.index, local_rank)
        p = self.pending
        if kind == "ready":
            self.ready.add(key)
        elif p is not None and rec.get("generation") == p.generation and key in p.survivors:
            if kind == "failed":
                self._fall_back(sup, f"instance {st.index} on {st.host}: {rec.get('why')}")
            elif kind in ("abandoned", "reformed", "trained"):       # Pending's record of each stage
                getattr(p, kind)[key] = rec
                if kind == "trained" and len(p.trained) == len(p.survivors):
                    self._succeeded(sup)
        return True

    def begin(self, sup, st, failure, open_handles) -> bool:
        """Instance ``st`` was declared lost (``failure`` says so): True when the survivors were told a new plan
        (the failure is held), False when the run goes on as it would have (the failure must be appended)."""
        if self.pending is not None:
            self._fall_back(sup, f"{st.host} was lost too during the recovery")
            return False
        survivors = [s for s in sup.instances.values() if s.index != st.index and s.exit_code is None]
        why = self._refusal(sup, st, survivors)
        if why is None:
            decision = next_plan(self.policy, self.plan, (st.host,), tuple(self.record.spares))
            new_hosts = list(decision.plan.hosts) if decision.plan is not None else None
            if decision.plan is None:
                why = decision.reason
            elif decision.spares_used or new_hosts != [s.host for s in sorted(survivors, key=lambda s: s.index)]:
                why = "the new plan is not the survivors' (a spare comes in, or it leaves a host out)"
        if why is not None:
            self.failed_why = why
            return False
        from podrun.wire.plan_token import PlanToken

        self.generation += 1
        plan, told = decision.plan, {}
        world = len(plan.placement) * self.wpi
        for s in survivors:
            j = new_hosts.index(s.host)
            handle = next((h for h in open_handles if s.index in h.instances), None)
            if handle is None:
                self.failed_why = f"no connection to instance {s.index}'s agent"
                return False
            token = PlanToken(self.generation, j * self.wpi, world, plan.local_batch, plan.grad_accum)
            told[s.index] = (handle, token)
        for handle, token in told.values():
            handle.send_plan(token.encode())
        survivors_ranks = {(s.index, lr): new_hosts.index(s.host) * self.wpi + lr for s in survivors
                           for lr in range(self.wpi)}
        self.pending = Pending(failure, decision, self.generation, failure.at, st.lost_silence, survivors_ranks,
                               time.monotonic() + REFORM_S)
        line = describe(decision, self.plan, None, failure.reason)
        self.notice(line.rsplit("; resuming", 1)[0] + "; recovering in place (the survivors keep their processes "
                    "and state)")
        return True

    def tick(self, sup, now: float) -> None:
        """Each supervisor turn: a failure of a survivor, or survivors not re-formed by the deadline, end it."""
        p = self.pending
        if p is None:
            return
        if any(f is not p.failure for f in sup.failures):
            self._fall_back(sup, f"{sup.failures[0].reason} during the recovery")
        elif (len(p.reformed) == len(p.survivors)
              and all(sup.instances[i].exit_code is not None for i, _ in p.survivors)):
            self._succeeded(sup)       # re-formed and ended well, a ``trained`` record lost on a full pipe
        elif now > p.deadline and len(p.reformed) < len(p.survivors):
            stuck = sorted(set(p.survivors) - set(p.abandoned))     # its abort hangs: named before the others
            late = stuck or sorted(set(p.survivors) - set(p.reformed))
            who = ", ".join(f"rank {sup.instances.rank(i, lr)} on {sup.instances[i].host}" for i, lr in late)
            what = "did not abandon its group" if stuck else "did not re-form"
            self._fall_back(sup, f"{who} {what} within {REFORM_S:g} s")

    # -- its own ------------------------------------------------------------------------------------------------
    def _refusal(self, sup, st, survivors: list) -> str | None:
        if sup.failures or sup.signalled is not None:
            return "the run is ending already"
        if st.index == 0:
            return "rank 0's host was lost (its agent serves the store the group forms on)"
        unready = [(s.index, lr) for s in survivors for lr in range(self.wpi) if (s.index, lr) not in self.ready]
        if unready:
            return (f"{len(unready)} surviving worker(s) cannot recover in place (a script without podrun's "
                    "in-place loop, or not yet training)")
        return None

    def _fall_back(self, sup, why: str) -> None:
        p, self.pending = self.pending, None
        if p is None:
            return
        self.failed_why = why
        self.notice(f"elastic: in-place recovery failed ({why}); restarting every worker")
        sup.failures.append(p.failure)

    def _succeeded(self, sup) -> None:
        p, self.pending = self.pending, None
        recs = list(p.reformed.values()) or list(p.trained.values())
        trained = list(p.trained.values())

        def latest(name: str, among: list[dict]) -> float | None:
            vals = [r[name] for r in among if isinstance(r.get(name), (int, float))]
            return max(vals) if vals else None

        abandoned, formed, resharded = (latest(n, recs) for n in ("abandoned_at", "formed_at", "resharded_at"))
        done = latest("trained_at", trained)
        redo = next((r.get("redo") for r in trained if isinstance(r.get("redo"), int)), None)

        def span(a, b):
            return round(b - a, 3) if a is not None and b is not None else None

        breakdown = {"detection": None if p.detection_s is None else round(p.detection_s, 3),
                     "abort": span(p.lost_at, abandoned), "reform": span(abandoned, formed),
                     "reshard": span(formed, resharded), "first_step": span(resharded, done)}
        old = self.plan
        self.record.replans.append({
            "restart": self.restart, "path": "in-place", "generation": p.generation,
            "hosts_lost": list(p.decision.hosts_lost), "spares_used": [], "at_step": None if redo is None else redo - 1,
            "lost_at": p.lost_at, "old": decomposition(old), "new": decomposition(p.decision.plan),
            "skipped": [{"hosts": n, "reason": r} for n, r in p.decision.skipped], "preflight": [],
            "restarted_after_s": None, "training_after_s": span(p.lost_at, done),
            "resumed_from": {"step": None if redo is None else redo - 1, "source": "in-place", "from_rank": None},
            "breakdown": breakdown, "redone": redo,
        })
        self.record.spares = list(p.decision.spares_left)
        self.plan = p.decision.plan
        self.failed_why = None
        lost = sup.instances[p.failure.instance]
        lost.exit_code = 0         # status "lost", dropped by the re-plan: the attempt's outcome is the survivors'
        from podrun.rundir import layout

        try:
            layout.write_plan(sup.req.run_dir, self.plan, layout.PLAN)
        except OSError as exc:
            self.notice(f"cannot write {layout.PLAN}: {exc.strerror or exc}")
        self.notice(f"elastic: recovered in place: training again {span(p.lost_at, done)} s after the loss "
                    f"(abort {breakdown['abort']} s, re-form {breakdown['reform']} s, re-shard "
                    f"{breakdown['reshard']} s, first step {breakdown['first_step']} s)")

"""Elastic restarts, pure: after a failure, which hosts go, which spares come in, and the next plan at the same
global batch; the run's elastic record; from typed values (the outcome's summary, the run's step log): no I/O here."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from podrun.errors import LaunchError, PlanError
from podrun.wire.protocol import LOST_EXIT

if TYPE_CHECKING:  # pragma: no cover
    from podrun.plan import Overrides
    from podrun.plan.model import Plan
    from podrun.rundir.metrics import StepLog
    from podrun.rundir.summary import Summary
    from podrun.specs.cluster import ClusterSpec
    from podrun.specs.recipe import RecipeSpec


@dataclass(frozen=True)
class ElasticPolicy:
    """What a re-plan needs: the plan's inputs, the global batch to keep, the floor on hosts, the spares."""

    cluster: "ClusterSpec"             # the cluster with the run's hosts (its first plan's)
    recipe: "RecipeSpec | None"
    overrides: "Overrides"             # as the user gave them; nodes and global batch are set per re-plan
    global_batch: int                  # the first plan's, kept on every re-plan
    min_hosts: int
    spares: tuple[str, ...] = ()       # hosts that take a lost host's place, in order


@dataclass(frozen=True)
class Replan:
    """The decision: the next plan, or the reason there is none (then the run ends)."""

    plan: "Plan | None"
    hosts_lost: tuple[str, ...]        # hosts dropped from the run
    spares_used: tuple[str, ...] = ()  # spares that took their place
    spares_left: tuple[str, ...] = ()  # spares for a later failure (unused ones, then healthy hosts left out)
    reason: str | None = None          # why no plan exists (plan None)
    skipped: tuple[tuple[int, str], ...] = field(default=())   # (host count, reason) tried above the chosen one


def make_policy(cluster: "ClusterSpec", recipe: "RecipeSpec | None", ov: "Overrides", plan: "Plan",
                min_hosts: int, spare_hosts: str | None, *, max_restarts: int | None, engine: str | None = None,
                transport_refusal: LaunchError | None = None) -> ElasticPolicy:
    """The policy of `podrun launch --elastic MIN [--spare-hosts H,...]`, or a LaunchError naming what is wrong
    (``transport_refusal``: the transport's, when it cannot start an attempt on other hosts).

    Spares are the --spare-hosts, then the hosts of the cluster (or of --hosts/--hostfile/the
    allocation) that the plan leaves out (--nodes smaller than the hosts given).
    """
    from podrun.specs.hosts import parse_hosts_option

    if min_hosts < 1 or min_hosts > len(plan.hosts):
        raise LaunchError(f"--elastic {min_hosts}: the minimum must be between 1 and the plan's {len(plan.hosts)} hosts",
                          hint=f"use --elastic {max(1, len(plan.hosts) - 1)} or another count in 1..{len(plan.hosts)}")
    if max_restarts is not None and max_restarts < 1:
        raise LaunchError(f"--elastic {min_hosts} re-plans on a restart, and --max-restarts is {max_restarts}",
                          hint="pass --max-restarts N (N >= 1): each lost host costs one restart")
    if engine is not None:
        raise LaunchError(f"--elastic re-plans the instances podrun starts itself; --engine {engine} starts its own",
                          hint="drop --engine, or drop --elastic")
    if transport_refusal is not None:
        raise transport_refusal
    spares: list[str] = []
    if spare_hosts is not None:
        for e in parse_hosts_option(spare_hosts, "--spare-hosts"):
            if e.slots is not None and e.slots != plan.devices_per_host:
                raise LaunchError(f"--spare-hosts {e.name}:{e.slots}: the plan needs {plan.devices_per_host} "
                                  "devices per host", hint="spares must have the devices of the hosts they replace")
            if e.name in plan.hosts:
                raise LaunchError(f"--spare-hosts {e.name} is already one of the plan's hosts",
                                  hint="a spare is a host the run does not use until another is lost")
            spares.append(e.name)
    spares += [h for h in cluster.hosts if h not in plan.hosts and h not in spares]
    return ElasticPolicy(cluster.with_hosts(plan.hosts, plan.devices_per_host), recipe, replace(ov, nodes=None),
                         plan.global_batch, min_hosts, tuple(spares))


def default_restarts(policy: ElasticPolicy, plan: "Plan") -> int:
    """The restarts an elastic run gets when --max-restarts is not given: one per host it can lose, the plan's
    hosts and the spares down to the minimum; a LaunchError when that is none."""
    n = len(plan.hosts) + len(policy.spares) - policy.min_hosts
    if n < 1:
        raise LaunchError(f"--elastic {policy.min_hosts} on {len(plan.hosts)} host(s) with no spare: the run can lose "
                          "no host, so an elastic restart has nothing to re-plan on",
                          hint=f"lower the minimum (--elastic {max(1, len(plan.hosts) - 1)}), add --spare-hosts, or drop "
                               "--elastic and give --max-restarts N to restart on the same hosts")
    return n


def failed_hosts(summary: "Summary") -> tuple[str, ...]:
    """The hosts to drop after a failed attempt, from its summary's instances and root cause.

    Hosts whose instance was lost (no heartbeat, or the connection ended before it reported) are the
    failure; only when there is none is it the root cause's host (a worker that failed on its own).
    A surviving host's workers also fail when a peer vanishes, so they are never blamed for it, nor is an instance
    ended with the run (terminated: a launcher that aborts its step or job as it ends, srun's, mpirun's).
    """
    lost = []
    for inst in summary.instances:          # 255 with no worker's exit reported: the connection ended first
        if inst.get("status") == "lost" or (inst.get("exit_code") == LOST_EXIT and not inst.get("workers")
                                            and inst.get("status") != "terminated"):   # but as the run ended
            if inst["host"] not in lost:
                lost.append(inst["host"])
    if lost:
        return tuple(lost)
    if summary.root_cause is not None and summary.root_cause.get("host"):
        return (summary.root_cause["host"],)
    return ()


def next_plan(policy: ElasticPolicy, current: "Plan", failed: tuple[str, ...] | list[str],
              spares: tuple[str, ...] | None = None) -> Replan:
    """Drop ``failed`` from ``current``'s hosts, put spares in their places, and plan the largest host
    count >= ``policy.min_hosts`` that keeps ``policy.global_batch`` exactly.

    ``spares`` (default: the policy's) are the spares still free. Healthy hosts left out by a smaller
    plan become spares for the next failure.
    """
    from podrun.elastic.table import elastic_table

    spares = tuple(policy.spares if spares is None else spares)
    gone = tuple(h for h in current.hosts if h in set(failed))
    free = [s for s in spares if s not in set(failed) and s not in current.hosts]
    used: list[str] = []
    hosts: list[str] = []
    for h in current.hosts:
        if h not in gone:
            hosts.append(h)
        elif free:
            used.append(free.pop(0))
            hosts.append(used[-1])
    g = policy.global_batch
    if len(hosts) < policy.min_hosts:
        return Replan(None, gone, tuple(used), tuple(free),
                      f"{len(hosts)} host(s) left after losing {', '.join(gone) or 'none'}, "
                      f"fewer than the elastic minimum {policy.min_hosts}")
    cluster = policy.cluster.with_hosts(tuple(hosts))      # devices per host: the first plan's, kept
    try:
        table = elastic_table(cluster, policy.recipe, policy.overrides, policy.min_hosts, len(hosts), global_batch=g)
    except PlanError as exc:
        return Replan(None, gone, tuple(used), tuple(free), exc.message)
    skipped = []
    for row in table.rows:
        if row.plan is not None:
            idle = tuple(hosts[row.hosts:])
            return Replan(row.plan, gone, tuple(used), tuple(free) + idle, None, tuple(skipped))
        skipped.append((row.hosts, row.reason))
    why = "; ".join(f"{n} hosts: {r}" for n, r in skipped)
    return Replan(None, gone, tuple(used), tuple(free),
                  f"no host count from {len(hosts)} down to {policy.min_hosts} keeps global batch {g} exactly ({why})",
                  tuple(skipped))


def decomposition(plan: "Plan") -> dict:
    """The figures of a plan that a re-plan changes, for summary.json and the console."""
    return {"hosts": list(plan.hosts), "replicas": plan.replicas, "local_batch": plan.local_batch,
            "grad_accum": plan.grad_accum, "global_batch": plan.global_batch}


def describe(replan: Replan, old: "Plan", step: int | None, cause: str | None = None) -> str:
    """One console line for a re-plan (or for the end of an elastic run)."""
    lost = ", ".join(replan.hosts_lost) or "no host"
    what = f"dropping {lost}" + (f" ({cause})" if cause else "")
    at = f" after step {step}" if step is not None else ""
    if replan.plan is None:
        return f"elastic: {what}{at}; the run cannot continue: {replan.reason}"
    new = replan.plan
    swap = f", spare {', '.join(replan.spares_used)} in its place" if replan.spares_used else ""
    return (f"elastic: {what}{at}{swap}; re-planned {len(old.hosts)} -> {len(new.hosts)} hosts: "
            f"{old.local_batch} x {old.replicas} x GA {old.grad_accum} -> "
            f"{new.local_batch} x {new.replicas} x GA {new.grad_accum} = global batch {new.global_batch}; "
            "resuming from the newest snapshot a survivor holds, else the last checkpoint")


def last_step(log: "StepLog") -> tuple[int | None, float | None]:
    """(step, time) of the run's last training step; (None, None) when it logged none."""
    return log.steps[-1] if log.steps else (None, None)


def first_step_after(log: "StepLog", after: float) -> tuple[int | None, float | None]:
    """(step, time) of the first training step logged after wall time ``after``; (None, None) if none."""
    return next(((step, t) for step, t in log.steps if t > after), (None, None))


def resumed_after(log: "StepLog", after: float) -> dict | None:
    """Where the attempt started after wall time ``after`` resumed from (its start or resume record)."""
    return next((where for t, where in log.starts if t > after), None)


@dataclass
class ElasticRecord:
    """summary.json's ``elastic``: the floor and the batch kept, the spares left, each re-plan (its decision, and
    once the attempt after it ran, how long the recovery took), and why the run ended when no plan was left."""

    min_hosts: int
    global_batch: int
    spares: list[str]
    replans: list[dict] = field(default_factory=list)
    end: str | None = None

    @classmethod
    def of(cls, policy: ElasticPolicy) -> "ElasticRecord":
        return cls(policy.min_hosts, policy.global_batch, list(policy.spares))

    def replan(self, policy: ElasticPolicy, current: "Plan", failed: tuple[str, ...], nxt: int, log: "StepLog",
               lost_at: float, cause: str | None, problems: tuple = ()) -> tuple[Replan, str]:
        """Decide restart ``nxt``'s plan without the ``failed`` hosts (lost at ``lost_at`` of ``cause``;
        ``problems``: those a re-planned attempt's check found), record it; returns the decision and its console
        line."""
        step, _ = last_step(log)
        decision = next_plan(policy, current, failed, tuple(self.spares))
        self.replans.append({
            "restart": nxt, "path": "restart", "hosts_lost": list(decision.hosts_lost),
            "spares_used": list(decision.spares_used),
            "at_step": step, "lost_at": lost_at, "old": decomposition(current),
            "new": decomposition(decision.plan) if decision.plan is not None else None,
            "skipped": [{"hosts": n, "reason": r} for n, r in decision.skipped],
            "preflight": [str(p) for p in problems],
            "restarted_after_s": None, "training_after_s": None, "resumed_from": None,
        })
        if decision.plan is None:
            self.end = decision.reason
        else:
            self.spares = list(decision.spares_left)
        return decision, describe(decision, current, step, cause)

    def recovered(self, restart_count: int, started: float, all_ready_s: float | None, log: "StepLog") -> None:
        """After the attempt that followed a re-plan (started at wall time ``started``): seconds from the loss to
        its workers all started (``all_ready_s`` after its start), and to its first training step in ``log``."""
        # a recovery in place during the attempt is timed by the survivors' own records (podrun.elastic.inplace)
        restarts = [r for r in self.replans if r.get("path") != "in-place"]
        if not restarts or restarts[-1]["restart"] != restart_count:
            return
        last = restarts[-1]
        if all_ready_s is not None:
            last["restarted_after_s"] = round(started + all_ready_s - last["lost_at"], 3)
        last["resumed_from"] = resumed_after(log, started)
        _, t = first_step_after(log, started)
        if t is not None:
            last["training_after_s"] = round(t - last["lost_at"], 3)

    def to_dict(self) -> dict:
        d = {"min_hosts": self.min_hosts, "global_batch": self.global_batch, "spares": list(self.spares),
             "replans": self.replans}
        return d if self.end is None else {**d, "end": self.end}

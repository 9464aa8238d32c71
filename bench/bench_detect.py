"""Lost-host detection (issues 19 and 56): a cut link to the run's end, podrun against --keepalive 2 and torchrun.

Interleaved on fresh namespace hosts: podrun's default liveness, podrun with 2 s of silence, torchrun's defaults.
"""
from __future__ import annotations

import tempfile

from bench.bench_launch import _row, lost_host_vs
from podrun.wire.liveness import Liveness, settings
from tests.ports import free_port

OLD = ("--keepalive", "2")       # the former default: a heartbeat every 0.5 s, 2 s of silence


def run(quick: bool) -> list[dict]:
    n, repeats = (3, 1) if quick else (4, 3)
    bound, pg_timeout = (40.0, 10.0) if quick else (75.0, 30.0)
    subjects = {"podrun": ("podrun", ()), "podrun_old": ("podrun", OLD), "torchrun": ("torchrun", ())}
    times: dict[str, list] = {k: [] for k in subjects}
    gone: dict[str, int] = {k: 0 for k in subjects}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            for key, (subject, extra) in subjects.items():
                dt, cut_gone = lost_host_vs(subject, n, tmp, free_port(2), bound, pg_timeout, extra)
                times[key].append(bound if dt is None else dt)
                gone[key] += cut_gone
    now, old = Liveness(), settings(keepalive=float(OLD[1]))
    runs = {k: ", ".join(f"{v:.2f}" for v in vs) for k, vs in times.items()}
    note = (f"median of {repeats}, interleaved, {n} fresh hosts each; h2 isolated (veth down) once every rank's gloo "
            f"all_reduce (every 0.1 s, process-group timeout {pg_timeout:.0f} s) is up; from the cut to the launcher's "
            f"exit (torchrun: every torchrun on the reachable hosts), a run not ended within {bound:.0f} s counted as "
            f"{bound:.0f}")
    return [
        _row("lost_host_detect", f"podrun default liveness, {now.describe()}", times["podrun"], "s",
             f"{note}; runs {runs['podrun']} vs {runs['podrun_old']}; cut host's processes gone by then "
             f"{gone['podrun']}/{repeats} vs {gone['podrun_old']}/{repeats}",
             f"podrun --keepalive 2 (the former default), {old.describe()}", times["podrun_old"]),
        _row("lost_host_detect", f"podrun default liveness, {now.describe()}", times["podrun"], "s",
             f"{note}; runs {runs['podrun']} vs {runs['torchrun']}; cut host's processes gone by then "
             f"{gone['podrun']}/{repeats} vs {gone['torchrun']}/{repeats}",
             "torchrun c10d over ssh (defaults)", times["torchrun"]),
    ]


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run, quick=True)

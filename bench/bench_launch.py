"""Launch benchmarks on real OpenSSH hosts (tests.harness.NetnsHosts), each against its peer in the same run:
- launch to first all_reduce on 1, 2, 4, 8 hosts (quick: 1, 2): podrun vs torchrun (c10d, started over ssh on
  each host) vs mpirun; podrun's own fan-out cost (`true`) vs OpenSSH;
- teardown after a worker fails, 4 hosts: podrun vs torchrun, same gloo workload, from the failing worker's
  own clock to the launcher(s) gone and no process of the run left on any host (polled on the hosts);
- detection of a lost host, 4 fresh hosts (quick: 2), h2's link cut mid-run: podrun vs torchrun, from the cut
  to the launcher ending the run; every run bounded, runs past the bound reported as such;
- with PODRUN_BASELINE=DIR (a checkout of an earlier podrun, e.g. `git archive COMMIT | tar -x -C DIR`): this
  podrun vs that one, launch to first all_reduce on 1, 2, 4 hosts and `true` on 1 and 4 hosts, the baseline's
  controller and agents importing DIR (PYTHONPATH, and `--env PYTHONPATH=DIR` for the agents).
Repeats are interleaved (podrun, peer, podrun, ...) so the noise of a shared 2-core machine hits both alike."""
from __future__ import annotations

import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.rows import row
from podrun.wire.liveness import Liveness

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "tests" / "launch" / "scripts" / "torchrun_allreduce.py")
SOCKET_SCRIPT = str(ROOT / "bench" / "scripts" / "socket_allreduce.py")
PODRUN = [sys.executable, "-m", "podrun"]


def _row(benchmark, subject, values, unit, note, peer=None, peer_values=None):
    return row(benchmark, subject, values, unit, note, peer, peer_values, digits=4)


def _podrun_args(hosts, names, runs, port, *extra):
    return [*PODRUN, "launch", "--hosts", ",".join(names), "--devices-per-host", "1", "--transport", "ssh",
            "--ssh-config", hosts.ssh_config_path, "--python", hosts.python, "--runs-dir", runs,
            "--master-port", str(port), *extra]


def _baseline(base: str | None) -> tuple[list[str], dict | None]:
    """Extra launch options and the controller's env to run the podrun checkout at ``base`` (None: this one)."""
    if base is None:
        return [], None
    return ["--env", f"PYTHONPATH={base}"], {**os.environ, "PYTHONPATH": base}


def podrun_allreduce(hosts, names, runs, port, base=None) -> float:
    extra, env = _baseline(base)
    t0 = time.perf_counter()
    try:
        cp = subprocess.run([*_podrun_args(hosts, names, runs, port, *extra), "--", sys.executable, SCRIPT],
                            capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        _sweep(hosts, names, re.escape(SCRIPT))
        raise AssertionError(f"podrun on {len(names)} hosts did not end within 120 s")
    dt = time.perf_counter() - t0
    assert cp.returncode == 0 and cp.stdout.count("ALLREDUCE") == len(names), cp.stderr[-2000:]
    return dt


def podrun_socket_allreduce(hosts, names, runs, port) -> float:
    """podrun to a first all_reduce with no torch import (bench/scripts/socket_allreduce.py, whose rank 0 serves
    MASTER_PORT itself: --no-agent-store, so no store is hosted there)."""
    t0 = time.perf_counter()
    cp = subprocess.run([*_podrun_args(hosts, names, runs, port, "--no-agent-store"), "--", sys.executable,
                         SOCKET_SCRIPT],
                        capture_output=True, text=True, timeout=60)
    dt = time.perf_counter() - t0
    n = len(names)
    assert cp.returncode == 0 and cp.stdout.count(f"sum={n * (n + 1) // 2}") == n, cp.stderr[-2000:]
    return dt


def podrun_true(hosts, names, runs, port, base=None) -> float:
    """podrun's own cost: preflight + fan-out + agents + `true` + teardown, no torch import in the workers."""
    extra, env = _baseline(base)
    t0 = time.perf_counter()
    cp = subprocess.run([*_podrun_args(hosts, names, runs, port, *extra), "--", "true"], capture_output=True,
                        text=True, timeout=60, env=env)
    dt = time.perf_counter() - t0
    assert cp.returncode == 0, cp.stderr[-2000:]
    return dt


def ssh_true(hosts, names) -> float:
    """OpenSSH `ssh h true` to every host in parallel: the floor for any ssh fan-out."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(hosts.ssh_argv(h, "true")) for h in names]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    return time.perf_counter() - t0


def _sweep(hosts, names, pattern) -> None:
    """Kill what a failed or timed-out run of ours left on our harness hosts (matched by its marker)."""
    for h in names:
        for pid, _ in hosts.processes(h, pattern):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def _kill(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _torchrun_cmd(hosts, names, port, rdzv_id, *script) -> str:
    """The line each host runs over ssh: torchrun, c10d rendezvous on the first host, default settings."""
    return (f"cd {shlex.quote(str(ROOT))} && exec {shlex.quote(hosts.python)} -m torch.distributed.run "
            f"--nnodes {len(names)} --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint {names[0]}:{port} "
            f"--rdzv-id {rdzv_id} " + " ".join(shlex.quote(w) for w in script))


def torchrun_allreduce(hosts, names, port) -> float:
    """torchrun with c10d rendezvous, started with OpenSSH on every host in parallel (what users do)."""
    n = len(names)
    cmd = _torchrun_cmd(hosts, names, port, f"bench{port}", SCRIPT)
    t0 = time.perf_counter()
    procs = [subprocess.Popen(hosts.ssh_argv(h, cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for h in names]
    try:
        outs = [p.communicate(timeout=max(1.0, 120 - (time.perf_counter() - t0))) for p in procs]
    except subprocess.TimeoutExpired:
        _kill(procs)
        _sweep(hosts, names, f"bench{port}")
        raise AssertionError(f"torchrun on {n} hosts did not end within 120 s")
    dt = time.perf_counter() - t0
    assert all(p.returncode == 0 for p in procs) and sum(o[0].count("ALLREDUCE") for o in outs) == n, outs
    return dt


def mpirun_allreduce(hosts, names, port) -> float:
    """Open MPI (PyPI wheel) mpirun over ssh; each rank maps OMPI_COMM_WORLD_* to torchrun's names."""
    n = len(names)
    wrapper = (f"RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE LOCAL_RANK=0 "
               f"MASTER_ADDR={names[0]} MASTER_PORT={port} exec {shlex.quote(hosts.python)} {shlex.quote(SCRIPT)}")
    argv = ["mpirun", "--allow-run-as-root", "-np", str(n), "--host", ",".join(f"{h}:1" for h in names),
            "--map-by", "ppr:1:node", "--bind-to", "none", "--prefix", sys.prefix,
            "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", f"-F {hosts.ssh_config_path}",
            "/bin/sh", "-c", wrapper]
    t0 = time.perf_counter()
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        _sweep(hosts, names, "prted|" + re.escape(SCRIPT))
        raise AssertionError(f"mpirun on {n} hosts did not end within 120 s")
    dt = time.perf_counter() - t0
    assert cp.returncode == 0 and cp.stdout.count("ALLREDUCE") == n, (cp.stdout + cp.stderr)[-2000:]
    return dt


def teardown(hosts, runs, port, tmp) -> float:
    """4 hosts x 1 worker; rank 2 records its time and exits 3: seconds until podrun has ended every process."""
    stamp = Path(tmp) / f"fail-{port}"
    m = f"bench-teardown-{port}"
    names = hosts.hosts[:4]
    body = (f"sleep 1; if [ $RANK = 2 ]; then {shlex.quote(sys.executable)} -c 'import time; "
            f"print(time.time())' > {stamp}; exit 3; fi; sleep 60 # {m}")
    cp = subprocess.run([*_podrun_args(hosts, names, runs, port), "--", "sh", "-c", body],
                        capture_output=True, text=True, timeout=60)
    t_end = time.time()
    assert cp.returncode == 3, cp.stderr[-2000:]
    left = {h: hosts.processes(h, m) for h in names if hosts.processes(h, m)}
    assert not left, left
    return t_end - float(stamp.read_text())


# A training-like worker, the same for podrun and torchrun: init gloo, then an all_reduce every 0.1 s.
# `--up DIR` : writes DIR/up-<rank> after the first all_reduce; `--fail-rank R --fail-step S`: rank R writes
# time.time() to `--stamp FILE` and exits 3 at step S (its own clock); `--timeout T`: the process group's
# timeout (what ends a collective with a silent peer); the trailing marker names the run's processes.
WORKLOAD = r"""
import datetime, os, sys, time
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(a["--timeout"])))
rank, t, step = dist.get_rank(), torch.ones(1), 0
while True:
    dist.all_reduce(t)
    step += 1
    if step == 1:
        open(os.path.join(a["--up"], f"up-{rank}"), "w").close()
    if rank == int(a["--fail-rank"]) and step == int(a["--fail-step"]):
        with open(a["--stamp"], "w") as f:
            f.write(repr(time.time()))
        os._exit(3)
    time.sleep(0.1)
"""


class _Run:
    """One run of WORKLOAD under podrun or torchrun on `names`: start, wait for every rank's first
    all_reduce, then poll the launcher(s) and the hosts; everything bounded, everything ours killed."""

    def __init__(self, subject, hosts, names, tmp, port, marker, *, fail_rank=-1, fail_step=0, timeout=30.0,
                 extra=()):
        self.subject, self.hosts, self.names, self.marker = subject, hosts, names, marker
        self.dir = Path(tmp) / marker
        self.dir.mkdir(parents=True)
        self.stamp = self.dir / "stamp"
        script = Path(tmp) / "bench_workload.py"
        if not script.exists():
            script.write_text(WORKLOAD)
        args = [str(script), "--up", str(self.dir), "--stamp", str(self.stamp), "--fail-rank", str(fail_rank),
                "--fail-step", str(fail_step), "--timeout", str(timeout), "--marker", marker]
        self.log = open(self.dir / "log", "w")
        if subject == "podrun":
            argv = [*_podrun_args(hosts, names, str(Path(tmp) / "runs"), port, "--run-id", marker, *extra), "--",
                    hosts.python, *args]
            self.procs = {"controller": subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)}
        else:
            cmd = _torchrun_cmd(hosts, names, port, marker, *args)
            self.procs = {h: subprocess.Popen(hosts.ssh_argv(h, cmd), stdout=self.log, stderr=subprocess.STDOUT)
                          for h in names}

    def wait_up(self, bound: float) -> None:
        deadline = time.time() + bound
        while len(list(self.dir.glob("up-*"))) < len(self.names):
            if time.time() > deadline or any(p.poll() is not None for p in self.procs.values()):
                raise AssertionError(f"{self.subject}: not every rank up within {bound:.0f} s: " + self.tail())
            time.sleep(0.02)

    def tail(self) -> str:
        self.log.flush()
        return " | ".join((self.dir / "log").read_text(errors="replace").strip().splitlines()[-3:])

    def ended(self, launchers, hosts_gone) -> bool:
        return (all(self.procs[k].poll() is not None for k in launchers)
                and not any(self.hosts.processes(h, self.marker) for h in hosts_gone))

    def close(self) -> None:
        _kill(self.procs.values())
        _sweep(self.hosts, self.names, self.marker)
        self.log.close()


def teardown_vs(subject, hosts, tmp, port, bound) -> float | None:
    """WORKLOAD on 4 hosts; rank 2 exits 3 at step 5: seconds from its exit (its clock) until the launcher
    has exited and no process of the run is left on any host (checked on the hosts); None past `bound`."""
    names = hosts.hosts[:4]
    r = _Run(subject, hosts, names, tmp, port, f"bench-td-{subject}-{port}", fail_rank=2, fail_step=5)
    try:
        r.wait_up(90)
        deadline = time.time() + bound
        while not r.stamp.exists() or not r.stamp.read_text():
            assert time.time() < deadline, f"{subject}: rank 2 did not fail: " + r.tail()
            time.sleep(0.005)
        t_fail = float(r.stamp.read_text())
        deadline = t_fail + bound
        while not r.ended(list(r.procs), names):
            if time.time() > deadline:
                return None
            time.sleep(0.01)
        return time.time() - t_fail
    finally:
        r.close()


def lost_host_vs(subject, n, tmp, port, bound, timeout, extra=()) -> tuple[float | None, bool]:
    """n fresh hosts, WORKLOAD running; cut h2's link: seconds from the cut until the launcher has ended the
    run (podrun: its exit; torchrun: every torchrun on the reachable hosts exited, as seen by their ssh
    clients), None past `bound`; and whether the cut host's own processes of the run were gone by then.
    ``extra``: more podrun launch options."""
    from tests.harness import NetnsHosts

    with NetnsHosts(n) as hosts:
        names, cut = hosts.hosts, hosts.hosts[1]
        r = _Run(subject, hosts, names, tmp, port, f"bench-lost-{subject}-{port}", timeout=timeout, extra=extra)
        try:
            r.wait_up(90)
            time.sleep(0.3)
            t0 = time.time()
            hosts.isolate(cut)
            launchers = ["controller"] if subject == "podrun" else [h for h in names if h != cut]
            while not all(r.procs[k].poll() is not None for k in launchers):
                if time.time() > t0 + bound:
                    return None, not hosts.processes(cut, r.marker)
                time.sleep(0.02)
            dt = time.time() - t0
            if subject == "podrun":
                r.log.flush()
                text = (r.dir / "log").read_text(errors="replace")
                assert r.procs["controller"].returncode == 255 and "lost" in text and cut in text, \
                    (r.procs["controller"].returncode, r.tail())
            return dt, not hosts.processes(cut, r.marker)
        finally:
            r.close()


def _fmt_runs(values, bound) -> str:
    ended = [v for v in values if v is not None]
    return f"ended in {len(ended)} of {len(values)} runs within {bound:.0f} s"


def run(quick: bool) -> list[dict]:
    from tests.harness import NetnsHosts

    repeats = 1 if quick else 5
    sizes = (1, 2) if quick else (1, 2, 4, 8)
    rows = []
    port = 29900 + (os.getpid() % 50) * 200    # each run takes P (P+1 too for a baseline with the store relay)
    with tempfile.TemporaryDirectory() as tmp, NetnsHosts(max(sizes + (4,))) as hosts:
        runs = os.path.join(tmp, "runs")
        times: dict[tuple[str, int], list[float]] = {}
        failures: dict[str, list] = {}
        for _ in range(repeats):
            for n in sizes:
                names = hosts.hosts[:n]
                for name, f in (("podrun", lambda: podrun_allreduce(hosts, names, runs, port)),
                                ("torchrun", lambda: torchrun_allreduce(hosts, names, port)),
                                ("mpirun", lambda: mpirun_allreduce(hosts, names, port))):
                    port += 2
                    try:
                        times.setdefault((name, n), []).append(f())
                    except AssertionError as exc:   # a peer that fails here is reported, not fatal
                        failures.setdefault(name, []).append(str(exc).strip().splitlines()[:3])
                        times.setdefault((name, n), [])
        note = (f"median of {repeats}, interleaved; wall time from the command to every worker past "
                "init_process_group(gloo) + all_reduce + exit; script tests/launch/scripts/torchrun_allreduce.py")
        for n in sizes:
            for peer, label in (("torchrun", "torchrun c10d over ssh"), ("mpirun", "mpirun (Open MPI wheel)")):
                extra = ""
                if len(times[(peer, n)]) < repeats:
                    extra = f"; {peer} failed {repeats - len(times[(peer, n)])} of {repeats} runs: {failures.get(peer)}"
                rows.append(_row("launch_to_allreduce", f"podrun ssh, {n} host(s)", times[("podrun", n)] or [math.nan],
                                 "s", note + extra, f"{label}, {n} host(s)", times[(peer, n)] or None))
        top = 4 if 4 in sizes else sizes[-1]
        rows.append(_row("launch_scaling", f"podrun ssh all_reduce, {top} hosts", times[("podrun", top)], "s",
                         "target: within 1.3x of 1 host; the hosts share this machine's cores, so their torch "
                         "imports compete for them", "podrun ssh all_reduce, 1 host", times[("podrun", 1)]))
        if 8 in sizes:
            rows.append(_row("launch_scaling", "podrun ssh all_reduce, 8 hosts", times[("podrun", 8)], "s",
                             "8 torch imports on this machine's 2 cores", "podrun ssh all_reduce, 1 host",
                             times[("podrun", 1)]))
        fan = {}
        for _ in range(2 if quick else repeats):
            for n in (1, 4):
                port += 2
                fan.setdefault(("podrun", n), []).append(podrun_true(hosts, hosts.hosts[:n], runs, port))
                port += 2
                fan.setdefault(("socket", n), []).append(podrun_socket_allreduce(hosts, hosts.hosts[:n], runs, port))
                fan.setdefault(("ssh", n), []).append(ssh_true(hosts, hosts.hosts[:n]))
        rows.append(_row("launch_fanout", "podrun ssh `true`, 4 hosts", fan[("podrun", 4)], "s",
                         "podrun's own cost (CLI start, preflight, fan-out, agents, teardown), no torch",
                         "podrun ssh `true`, 1 host", fan[("podrun", 1)]))
        rows.append(_row("launch_fanout", "podrun ssh `true`, 4 hosts", fan[("podrun", 4)], "s",
                         "vs OpenSSH `ssh h true` to the 4 hosts in parallel (no preflight, no agent)",
                         "OpenSSH ssh x4 parallel", fan[("ssh", 4)]))
        rows.append(_row("launch_scaling", "podrun ssh, all_reduce without torch, 4 hosts", fan[("socket", 4)], "s",
                         "target: within 1.3x of 1 host; bench/scripts/socket_allreduce.py (rank 0 sums over TCP), "
                         "so the hosts' shared cores do not hide the launcher's own scaling",
                         "podrun ssh, all_reduce without torch, 1 host", fan[("socket", 1)]))
        td = []
        for _ in range(1 if quick else repeats):
            port += 2
            td.append(teardown(hosts, runs, port, tmp))
        rows.append(_row("teardown", "worker exit 3 -> every process gone, 4 hosts", td, "s",
                         f"median of {len(td)}; `sh -c 'sleep'` workers, podrun only; failing worker's clock to "
                         "podrun's exit (podrun exits after every agent reported its workers reaped; checked on the "
                         "hosts); target < 2 s"))

        # Teardown after a worker fails, podrun vs torchrun: the same training-like gloo workload.
        td_bound = 30.0
        tdv: dict[str, list] = {"podrun": [], "torchrun": []}
        for _ in range(1 if quick else 4):
            for subject in ("podrun", "torchrun"):
                port += 2
                try:
                    tdv[subject].append(teardown_vs(subject, hosts, tmp, port, td_bound))
                except AssertionError as exc:
                    failures.setdefault(f"teardown {subject}", []).append(str(exc)[:300])
        rows.append(_vs_row("teardown_vs_torchrun", "podrun: worker exit 3 -> every process gone, 4 hosts", tdv,
                            "torchrun c10d over ssh (defaults), 4 hosts", td_bound,
                            "gloo all_reduce every 0.1 s, rank 2 exits 3 at step 5; from its own clock to the "
                            "launcher(s) exited and no process of the run left on any host (polled on the hosts)",
                            failures))
        base = os.environ.get("PODRUN_BASELINE")
        if base:
            rows += _vs_baseline(hosts, runs, base, repeats, port)
            port += 200
    # Lost host, podrun vs torchrun: fresh hosts per run, h2's link cut (isolate) once every rank is up.
    n_lost = 2 if quick else 4
    lost_bound = 30.0 if quick else 75.0
    pg_timeout = 10.0 if quick else 30.0
    lost: dict[str, list] = {"podrun": [], "torchrun": []}
    cut_gone = {"podrun": 0, "torchrun": 0}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(1 if quick else 3):
            for subject in ("podrun", "torchrun"):
                port += 2
                try:
                    dt, gone = lost_host_vs(subject, n_lost, tmp, port, lost_bound, pg_timeout)
                    lost[subject].append(dt)
                    cut_gone[subject] += gone
                except AssertionError as exc:
                    failures.setdefault(f"lost host {subject}", []).append(str(exc)[:300])
    rows.append(_vs_row("lost_host_vs_torchrun", f"podrun: link cut -> run ended, {n_lost} hosts (default liveness, "
                        f"{Liveness().describe()})",
                        lost, f"torchrun c10d over ssh (defaults), {n_lost} hosts", lost_bound,
                        f"h2 isolated (veth down) mid-run; gloo all_reduce every 0.1 s, process-group timeout "
                        f"{pg_timeout:.0f} s (torchrun ends only when that collective times out: its rendezvous "
                        f"heartbeats do not end a running round); podrun = its exit (255), torchrun = every "
                        f"torchrun on the reachable hosts exited (the ssh session to the cut host never returns); "
                        f"cut host's own processes gone by then: podrun {cut_gone['podrun']}/{len(lost['podrun'])}, "
                        f"torchrun {cut_gone['torchrun']}/{len(lost['torchrun'])}", failures))
    return rows


def _vs_baseline(hosts, runs, base, repeats, port) -> list[dict]:
    """This podrun against the checkout at ``base``, interleaved on the same hosts."""
    times: dict[tuple[str, str, int], list[float]] = {}
    label = {None: "this podrun", base: f"baseline podrun ({base})"}
    for _ in range(repeats):
        for n in (1, 2, 4):
            for b in (None, base):
                port += 2
                times.setdefault(("allreduce", label[b], n), []).append(
                    podrun_allreduce(hosts, hosts.hosts[:n], runs, port, b))
        for n in (1, 4):
            for b in (None, base):
                port += 2
                times.setdefault(("true", label[b], n), []).append(podrun_true(hosts, hosts.hosts[:n], runs, port, b))
    rows = []
    for what, sizes, note in (("allreduce", (1, 2, 4), "torch workers: init_process_group(gloo) + all_reduce + exit"),
                              ("true", (1, 4), "`true` workers (no torch in the workers)")):
        for n in sizes:
            rows.append(_row("launch_vs_baseline", f"{label[None]}, {what}, {n} host(s)",
                             times[(what, label[None], n)], "s", f"median of {repeats}, interleaved; {note}",
                             f"{label[base]}, {what}, {n} host(s)", times[(what, label[base], n)]))
    return rows


def _vs_row(benchmark, subject, values, peer, bound, note, failures) -> dict:
    """A podrun-vs-torchrun row over runs that may not have ended within `bound` (None): the median counts
    such runs as `bound` (a lower bound); the note says how many ended."""
    def med(vs):
        return [bound if v is None else v for v in vs] or [math.nan]

    p, t = values["podrun"], values["torchrun"]
    row = _row(benchmark, subject, med(p), "s", "", peer, med(t))
    extra = [f"podrun {_fmt_runs(p, bound)}, torchrun {_fmt_runs(t, bound)}"]
    if any(v is None for v in t) and statistics.median(med(t)) >= bound:
        row["peer_value"], extra[0] = None, extra[0] + f"; torchrun median: did not end within {bound:.0f} s"
        row["ratio"] = None
    errs = {k: v for k, v in failures.items() if benchmark.split("_")[0] in k.replace(" ", "_")}
    row["note"] = f"interleaved; {note}; " + "; ".join(extra) + (f"; failed: {errs}" if errs else "")
    return row


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)

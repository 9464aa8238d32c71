"""Elastic recovery on real OpenSSH hosts (tests.harness.NetnsHosts), podrun vs torchrun side by side (issue 11):
4 fresh hosts per run, bench/scripts/elastic_train.py (GroupNorm, gloo, checkpoint every step) started at
1 x 4 x GA 6 = global batch 24 under `podrun launch --elastic 3` and under torchrun `--nnodes 3:4` (c10d
rendezvous, started over ssh on each host); once it trains on 4 hosts, h3's link is cut (isolate). Measured
the same way for both: wall time from the cut to the first optimizer step completed by a worker started after
the cut, as logged by the script (steps.log), and the global batch before and after. podrun's breakdown comes
from its summary.json (elastic record). Full: 3 interleaved repeats (podrun, torchrun, ...), then one run of each
cutting h1 instead (podrun's master host, torchrun's rendezvous endpoint); quick: one podrun run, torchrun
skipped. A run that does not train again within its bound is reported with the launchers' log lines that say
why, not as a failure of the benchmark. `python -m bench.bench_elastic podrun|torchrun [HOST]`: one run, its
files kept in /tmp/bel-*."""
from __future__ import annotations

import json
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

from bench.bench_launch import PODRUN, ROOT, _kill, _row, _sweep

SCRIPT = str(ROOT / "bench" / "scripts" / "elastic_train.py")
HOSTS, MIN_HOSTS, CUT = 4, 3, "h3"
LOCAL_BATCH, GRAD_ACCUM = 1, 6                     # both launchers start at 1 x 4 x GA 6 = 24
GLOBAL_BATCH = LOCAL_BATCH * HOSTS * GRAD_ACCUM
PG_TIMEOUT = 10.0                                  # the script's training collectives (new_group(timeout=...)), both
KEEPALIVE = 2.0                                    # podrun --keepalive
# torchrun's c10d rendezvous: a node is dead after keep_alive_interval x keep_alive_max_attempt = 3 s without a
# heartbeat (default 5 x 3 = 15 s); a round closes 2 s after MIN nodes joined (last_call, default 30 s).
RDZV_CONF = ("join_timeout=120,last_call_timeout=2,close_timeout=10,heartbeat=2,"
             "keep_alive_interval=1,keep_alive_max_attempt=3")
MAX_RESTARTS = 3
STEPS_BEFORE_CUT = 4                               # steps on 4 hosts before the cut
STEPS_AFTER = 3                                    # steps after the resume before the stop file


def _steps(d: Path) -> list[dict]:
    try:
        text = (d / "steps.log").read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:          # a line being written
            pass
    return out


def _events(d: Path) -> list[dict]:
    try:
        return [json.loads(l) for l in (d / "events.log").read_text().splitlines() if l.strip()]
    except (OSError, ValueError):
        return []


class _Elastic:
    """One elastic run of SCRIPT under `subject` on 4 fresh hosts; start, cut h3, wait for the resume, stop."""

    def __init__(self, subject: str, hosts, tmp: str, port: int, cut: str, rdzv_conf: str = RDZV_CONF):
        self.subject, self.hosts, self.names, self.cut = subject, hosts, hosts.hosts, cut
        self.marker = f"bench-elastic-{subject}-{port}"
        self.dir = Path(tmp) / self.marker
        self.dir.mkdir(parents=True)
        self.logs = {}
        script = [SCRIPT, "--dir", str(self.dir), "--batch", str(LOCAL_BATCH),
                  "--grad-accum", str(GRAD_ACCUM), "--pg-timeout", str(PG_TIMEOUT), "--marker", self.marker]
        if subject == "podrun":
            self.runs = self.dir / "runs"
            argv = [*PODRUN, "launch", "--hosts", ",".join(self.names), "--devices-per-host", "1",
                    "--transport", "ssh", "--ssh-config", hosts.ssh_config_path, "--python", hosts.python,
                    "--runs-dir", str(self.runs), "--run-id", "run", "--master-port", str(port),
                    "--keepalive", str(KEEPALIVE), "--global-batch", str(GLOBAL_BATCH), "--local-batch",
                    str(LOCAL_BATCH), "--elastic", str(MIN_HOSTS), "--max-restarts", str(MAX_RESTARTS),
                    "--", hosts.python, *script]
            self.command = argv
            self.procs = {"controller": self._popen("controller", argv)}
        else:
            cmd = (f"cd {shlex.quote(str(ROOT))} && LOGLEVEL=INFO exec {shlex.quote(hosts.python)} -m torch.distributed.run "
                   f"--nnodes {MIN_HOSTS}:{HOSTS} --nproc-per-node 1 --max-restarts {MAX_RESTARTS} "
                   f"--rdzv-backend c10d --rdzv-endpoint {self.names[0]}:{port} --rdzv-id {self.marker} "
                   f"--rdzv-conf {shlex.quote(rdzv_conf)} " + " ".join(shlex.quote(w) for w in script))
            self.command = cmd
            self.procs = {h: self._popen(h, hosts.ssh_argv(h, cmd)) for h in self.names}

    def _popen(self, key, argv):
        self.logs[key] = open(self.dir / f"{key}.log", "w")
        return subprocess.Popen(argv, stdout=self.logs[key], stderr=subprocess.STDOUT)

    def log_text(self, key) -> str:
        self.logs[key].flush()
        return (self.dir / f"{key}.log").read_text(errors="replace")

    def reason(self) -> str:
        """The launchers' lines that say why a run did not go on (for the note), each message once."""
        keys = ("connectFullMesh", "RendezvousClosedError", "attempts left", "DistStoreError", "timed out after",
                "Timed out waiting", "elastic:", "lost (", "exhausted")
        seen: list[str] = []
        for k in self.launchers():
            for line in self.log_text(k).splitlines():
                if any(w in line for w in keys) and "hostname of the client socket" not in line:
                    msg = re.sub(r"^\S*\[?[IWE]\d{4} [\d:.]+ \d+ [^\]]*\]\s*", "", line.strip())
                    msg = re.sub(r"(port|:)\d+|fd=\d+|\[[0-9a-f:]+\]|\d+\.\d+\.\d+\.\d+", "", msg)[:200]
                    if msg not in seen:
                        seen.append(msg)
        return " | ".join(seen[:6]) or "no error in the launchers' logs"

    def timeline(self) -> list[str]:
        """The launchers' lines that mark the recovery (failure seen, rendezvous, restart), for the record."""
        keys = ("FAILED", "Rendezvous complete", "Rendezvous'ing", "Error", "error:", "elastic:", "lost", "restart ")
        out = []
        for k in self.launchers():
            for line in self.log_text(k).splitlines():
                if any(w in line for w in keys) and "hostname of the client socket" not in line:
                    out.append(f"[{k}] {line.strip()[:220]}")
        return out[:40]

    def launchers(self) -> list[str]:
        """podrun's controller, or the torchrun agents on the hosts that were not cut (the cut host's ssh
        session never returns)."""
        return ["controller"] if self.subject == "podrun" else [h for h in self.names if h != self.cut]

    def alive(self) -> bool:
        return any(self.procs[k].poll() is None for k in self.launchers())

    def wait_steps(self, pred, bound: float, what: str):
        deadline = time.time() + bound
        while True:
            steps = _steps(self.dir)
            hit = pred(steps)
            if hit:
                return hit
            if time.time() > deadline:
                raise TimeoutError(f"{self.subject}: {what} not within {bound:.0f} s")
            if not self.alive():
                raise RuntimeError(f"{self.subject}: launcher(s) ended before {what}")
            time.sleep(0.05)

    def close(self) -> None:
        _kill(self.procs.values())
        _sweep(self.hosts, self.names, self.marker)
        for f in self.logs.values():
            f.close()


def elastic_run(subject: str, tmp: str, port: int, cut: str = CUT, start_bound: float = 180,
                resume_bound: float = 120, rdzv_conf: str = RDZV_CONF) -> dict:
    """One run on 4 fresh hosts, `cut` isolated once it trains: the figures of the resume (or why there was none)."""
    from tests.harness import NetnsHosts

    with NetnsHosts(HOSTS) as hosts:
        r = _Elastic(subject, hosts, tmp, port, cut, rdzv_conf)
        out: dict = {"subject": subject, "cut_host": cut, "command": r.command}
        try:
            r.wait_steps(lambda s: sum(1 for x in s if x["world"] == HOSTS) >= STEPS_BEFORE_CUT, start_bound,
                         f"{STEPS_BEFORE_CUT} steps on {HOSTS} hosts")
            before = [x for x in _steps(r.dir) if x["world"] == HOSTS][-1]
            t_cut = time.time()
            hosts.isolate(cut)
            out.update(cut=t_cut, global_batch_before=before["global_batch"], world_before=before["world"])
            try:
                first = r.wait_steps(lambda s: next((x for x in s if x["proc_start"] > t_cut), None),
                                     resume_bound, "a step by a worker started after the cut")
            except (TimeoutError, RuntimeError) as exc:
                out.update(resumed_s=None, why=f"{exc}: {r.reason()}")
                return out
            errors = [ev["t"] for ev in _events(r.dir) if ev["event"] == "error" and ev["t"] > t_cut]
            out.update(resumed_s=first["t"] - t_cut, first_step=first["step"], world_after=first["world"],
                       global_batch_after=first["global_batch"], proc_start_s=first["proc_start"] - t_cut,
                       init_done_s=first["init_done"] - t_cut, ready_s=first["ready"] - t_cut,
                       worker_error_s=(min(errors) - t_cut) if errors else None)
            try:
                r.wait_steps(lambda s: sum(1 for x in s if x["proc_start"] > t_cut) >= STEPS_AFTER, 60,
                             f"{STEPS_AFTER} steps after the resume")
            except (TimeoutError, RuntimeError) as exc:      # it resumed; what came after is noted
                out["after"] = f"{exc}: {r.reason()}"
            (r.dir / "stop").touch()
            keys = r.launchers()
            deadline = time.time() + 60
            while any(r.procs[k].poll() is None for k in keys) and time.time() < deadline:
                time.sleep(0.05)
            out["exit_codes"] = {k: r.procs[k].poll() for k in keys}
            out["global_batches"] = sorted({x["global_batch"] for x in _steps(r.dir)})
            if subject == "podrun":
                try:
                    s = json.loads((r.runs / "run" / "summary.json").read_text())
                except (OSError, ValueError) as exc:
                    out["why"] = f"no summary.json: {exc}"
                    return out
                rp = (s.get("elastic", {}).get("replans") or [{}])[0]
                if rp.get("lost_at") is None or rp.get("training_after_s") is None:
                    out["why"] = f"summary.json without the re-plan's timings: {s.get('elastic')}"
                    return out
                out.update(podrun_exit=s["exit_code"], hosts_lost=rp["hosts_lost"], old=rp["old"], new=rp["new"],
                           detected_s=rp["lost_at"] - t_cut, restarted_after_s=rp["restarted_after_s"],
                           training_after_s=rp["training_after_s"])
            return out
        finally:
            out["log"] = r.timeline()
            r.close()


def _med(vs):
    vs = [v for v in vs if v is not None]
    return statistics.median(vs) if vs else None


def run(quick: bool) -> list[dict]:
    """Full: 3 interleaved repeats (podrun, torchrun, ...) cutting h3, then one of each cutting h1 (podrun's
    master host and torchrun's rendezvous endpoint). Quick: one podrun run cutting h3, torchrun skipped."""
    plan = [(s, CUT) for _ in range(1 if quick else 3) for s in (("podrun",) if quick else ("podrun", "torchrun"))]
    if not quick:
        plan += [("podrun", "h1"), ("torchrun", "h1")]
    port = 29400 + (os.getpid() % 40) * 10
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for subject, cut in plan:
            port += 10
            try:
                res = elastic_run(subject, tmp, port, cut, resume_bound=120 if cut == CUT else 90)
            except (TimeoutError, RuntimeError) as exc:     # no run to measure: reported, not fatal
                res = {"subject": subject, "cut_host": cut, "resumed_s": None, "why": str(exc)}
            results.setdefault((subject, cut), []).append(res)
            print(json.dumps({k: v for k, v in res.items() if k != "command"}), file=sys.stderr)
    return rows(results, quick)


def _fmt(vs) -> str:
    return ", ".join("-" if v is None else f"{v:.1f}" for v in vs)


def _why(xs) -> str:
    return " || ".join(f"{x['subject']}: {x['why'][:400]}" for x in xs if x.get("resumed_s") is None)


def _steps_note(xs) -> str:
    """The script's clock for the resumed rank 0, medians: process started, joined gloo, model ready."""
    ok = [x for x in xs if x.get("resumed_s") is not None]
    if not ok:
        return "no resume"
    return (f"new rank 0 process started {_med([x['proc_start_s'] for x in ok]):.1f} s, joined gloo "
            f"{_med([x['init_done_s'] for x in ok]):.1f} s, model+optimizer+checkpoint ready "
            f"{_med([x['ready_s'] for x in ok]):.1f} s, first step {_med([x['resumed_s'] for x in ok]):.1f} s "
            "after the cut")


def rows(results: dict[tuple[str, str], list[dict]], quick: bool) -> list[dict]:
    p, t = results.get(("podrun", CUT), []), results.get(("torchrun", CUT), [])
    peer = None if quick else f"torchrun --nnodes {MIN_HOSTS}:{HOSTS} c10d over ssh"
    setup = (f"4 fresh namespace hosts, {{cut}} isolated after {STEPS_BEFORE_CUT} steps at 1 x 4 x GA 6 = "
             f"{GLOBAL_BATCH}; bench/scripts/elastic_train.py, training collectives time out after {PG_TIMEOUT:.0f} s for both (init 60 s); podrun "
             f"--keepalive {KEEPALIVE:.0f} --elastic {MIN_HOSTS} --global-batch {GLOBAL_BATCH} --local-batch "
             f"{LOCAL_BATCH} --max-restarts {MAX_RESTARTS}; torchrun --max-restarts {MAX_RESTARTS} --rdzv-conf "
             f"{RDZV_CONF}; cut -> first step by a worker started after the cut (script's clock)")
    pv, tv = [x["resumed_s"] for x in p], [x["resumed_s"] for x in t]
    note = setup.format(cut=CUT) + f"; runs: podrun [{_fmt(pv)}]"
    note += "; torchrun skipped in --quick (a run of it takes 1.5 min here; full mode runs it)" if quick \
        else f", torchrun [{_fmt(tv)}]"
    if _why(p + t):
        note += "; did not resume: " + _why(p + t)
    out = [_row_opt("elastic_resume", f"podrun --elastic {MIN_HOSTS}: {CUT} cut -> training again, 4 -> 3 hosts",
                    pv, "s", note, peer, tv)]

    def gb(xs):
        return sorted({g for x in xs for g in x.get("global_batches", [])})

    out.append({"benchmark": "elastic_global_batch", "subject": "podrun: global batch after the resume",
                "value": _med([x.get("global_batch_after") for x in p]), "peer": peer,
                "peer_value": _med([x.get("global_batch_after") for x in t]) if t else None,
                "ratio": None, "unit": "samples",
                "note": f"both start at {GLOBAL_BATCH} on 4 hosts; every global batch logged in the runs: podrun "
                        f"{gb(p)} (re-planned 1 x 3 x GA 8)"
                        + ("" if quick else f", torchrun {gb(t)} (its workers keep 1 x GA 6, so 1 x 3 x GA 6)")})
    ok = [x for x in p if x.get("detected_s") is not None]
    if ok:
        det, rst, trn = (_med([x[k] for x in ok]) for k in ("detected_s", "restarted_after_s", "training_after_s"))
        out.append({"benchmark": "elastic_breakdown", "subject": "podrun: cut -> lost declared (--keepalive 2)",
                    "value": round(det, 3), "peer": None, "peer_value": None, "ratio": None, "unit": "s",
                    "note": f"median of {len(ok)}; summary.json from the loss declared: restarted_after_s "
                            f"{rst:.2f} s (every worker of the 3-host attempt started), training_after_s {trn:.2f} s "
                            f"(first step in metrics.jsonl), so cut -> first step {det + trn:.2f} s; script: {_steps_note(ok)}"})
    tok = [x for x in t if x.get("worker_error_s") is not None and x.get("resumed_s") is not None]
    if tok:
        out.append({"benchmark": "elastic_breakdown", "subject": "torchrun: cut -> first worker's collective fails",
                    "value": round(_med([x["worker_error_s"] for x in tok]), 3), "peer": None, "peer_value": None,
                    "ratio": None, "unit": "s",
                    "note": f"median of {len(tok)}; its detection is the gloo timeout ({PG_TIMEOUT:.0f} s), the "
                            f"rendezvous then waits for the dead node's heartbeat to expire and the last call; "
                            f"script: {_steps_note(tok)}"})
    pm, tm = results.get(("podrun", "h1"), []), results.get(("torchrun", "h1"), [])
    if pm or tm:
        note = setup.format(cut="h1 (podrun's master host, torchrun's --rdzv-endpoint)") + \
            f"; one run each: podrun [{_fmt([x['resumed_s'] for x in pm])}], torchrun " \
            f"[{_fmt([x['resumed_s'] for x in tm])}]; global batch after: podrun " \
            f"{[x.get('global_batch_after') for x in pm]}, torchrun {[x.get('global_batch_after') for x in tm]}"
        if _why(pm + tm):
            note += "; did not resume: " + _why(pm + tm)
        out.append(_row_opt("elastic_resume_master", f"podrun --elastic {MIN_HOSTS}: h1 cut -> training again",
                            [x["resumed_s"] for x in pm], "s", note, peer, [x["resumed_s"] for x in tm]))
    return out


def _row_opt(benchmark, subject, values, unit, note, peer, peer_values) -> dict:
    """_row over runs that may not have resumed (None): the median of those that did; the note lists every run."""
    v = [x for x in values if x is not None] or [math.nan]
    pv = [x for x in peer_values if x is not None] if peer_values else None
    row = _row(benchmark, subject, v, unit, note, peer, pv or None)
    if peer is not None and not pv:
        row["note"] += "; torchrun resumed in none of its runs"
    return row


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # run the finally blocks: kill, sweep, close hosts
    sys.path.insert(0, str(ROOT))
    if len(sys.argv) > 1 and sys.argv[1] in ("podrun", "torchrun"):
        # one run, its files kept: `podrun|torchrun [HOST [RDZV_CONF]]` (RDZV_CONF "" = torchrun's defaults)
        cut = sys.argv[2] if len(sys.argv) > 2 else CUT
        conf = sys.argv[3] if len(sys.argv) > 3 else RDZV_CONF
        print(json.dumps(elastic_run(sys.argv[1], tempfile.mkdtemp(prefix="bel-"), 29400 + os.getpid() % 400, cut,
                                     rdzv_conf=conf), default=str, indent=1))
    else:
        for r in run(quick="--quick" in sys.argv):
            print(r)

"""Elastic recovery on real OpenSSH hosts (tests.harness.NetnsHosts), podrun side by side with its peers: torchrun
`--nnodes 3:4`, torchft 0.2.0 (lighthouse and Manager on gloo) and DLRover 0.6.1 (`dlrover-run` with flash
checkpoint, its master in local mode). 4 fresh hosts per run, the model and data of tests/elastic/groupnorm.py at
1 x 4 x GA 6 = global batch 24 (bench/scripts/elastic_train.py under podrun, torchrun and dlrover-run;
bench/scripts/torchft_train.py, one replica group per host, under torchft); once it trains on 4 hosts, h3's
link is cut (isolate). Measured the same way for all, from the script's own log (steps.log): the cut to the
first optimizer step completed by the re-formed group (3 hosts), the updates done again after the resume (steps
whose number was logged before the cut and again after), the global batch before and after, and whether the
per-step losses equal those of a run without the failure (replayed in this process: the global batches the run
logged before the cut, then the one it had at the cut; rel 1e-5). podrun's breakdown: detection (summary.json's lost_at), re-plan (plan-1.json written),
process start, torch import and process group, model build, state restore, first step (the script's clock).

Full: 3 interleaved repeats (podrun, torchrun, torchft, dlrover, ...) cutting h3, then podrun and torchrun
cutting h1 (podrun's master host, torchrun's rendezvous endpoint); quick: one run of each, cutting h3, torchrun
last. torchft and DLRover run from their own venv (PODRUN_BENCH_PEERS, default /work/peers-venv; made by
`bash bench/install_peers.sh DIR`); a peer that is not installed or cannot run is a row that says why. A run
that does not train again within its bound is reported with the launchers' log lines that say why, not as a
failure of the benchmark. `python -m bench.bench_elastic podrun|torchrun|torchft|dlrover [HOST]`: one run, its
files kept in /tmp/bel-*."""
from __future__ import annotations

import functools
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
TORCHFT_SCRIPT = str(ROOT / "bench" / "scripts" / "torchft_train.py")
SUBJECTS = ("podrun", "torchrun", "torchft", "dlrover")
HOSTS, MIN_HOSTS, CUT = 4, 3, "h3"
LOCAL_BATCH, GRAD_ACCUM = 1, 6                     # every subject starts at 1 x 4 x GA 6 = 24
GLOBAL_BATCH = LOCAL_BATCH * HOSTS * GRAD_ACCUM
SAMPLES = 480                                      # the scripts' --samples default
PG_TIMEOUT = 10.0                                  # the script's training collectives (new_group(timeout=...))
TORCHFT_PG_TIMEOUT = 5.0                           # train_ddp.py's ProcessGroupGloo timeout on CPU
TORCHFT_HEARTBEAT_MS = 2000                        # the lighthouse's heartbeat_timeout_ms (default 5000)
KEEPALIVE = 2.0                                    # podrun --keepalive
# torchrun's c10d rendezvous: a node is dead after keep_alive_interval x keep_alive_max_attempt = 3 s without a
# heartbeat (default 5 x 3 = 15 s); a round closes 2 s after MIN nodes joined (last_call, default 30 s).
RDZV_CONF = ("join_timeout=120,last_call_timeout=2,close_timeout=10,heartbeat=2,"
             "keep_alive_interval=1,keep_alive_max_attempt=3")
# dlrover-run's rendezvous (its master): a round closes lastcall_timeout s after MIN nodes joined (default 60 s)
DLROVER_RDZV_CONF = "join_timeout=120,lastcall_timeout=2"
MAX_RESTARTS = 3
STEPS_BEFORE_CUT = 4                               # steps on 4 hosts before the cut
STEPS_AFTER = 3                                    # steps after the resume before the stop file
LOSS_RTOL = 1e-5
NAMES = {"podrun": f"podrun --elastic {MIN_HOSTS}",
         "torchrun": f"torchrun --nnodes {MIN_HOSTS}:{HOSTS} c10d over ssh",
         "torchft": "torchft 0.2.0 lighthouse + Manager, gloo",
         "dlrover": f"dlrover-run 0.6.1 --nnodes {MIN_HOSTS}:{HOSTS}, flash checkpoint"}


def peers_dir() -> Path:
    """The venv holding torchft and dlrover (never the system python, whose torch stays as it is)."""
    return Path(os.environ.get("PODRUN_BENCH_PEERS", "/work/peers-venv"))


def peer_missing(subject: str) -> str | None:
    """Why `subject` cannot run from the peers' venv (None: it is there)."""
    if subject not in ("torchft", "dlrover"):
        return None
    exe = peers_dir() / "bin" / ("torchft_lighthouse" if subject == "torchft" else "dlrover-run")
    if not exe.exists():
        return (f"{exe} not found: make the peers' venv with `bash bench/install_peers.sh {peers_dir()}` "
                "(or set PODRUN_BENCH_PEERS to one)")
    return None


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
        return [json.loads(line) for line in (d / "events.log").read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


@functools.lru_cache(maxsize=16)
def reference_losses(batches: tuple[int, ...]) -> tuple[float, ...]:
    """The losses of a run that never loses a host and takes global batch ``batches[i]`` at step i + 1: the
    scripts' model, data and SGD in this one process, each global batch split as 1 x R x GA 6 with the
    gradients summed over replicas and micro steps, as the scripts do."""
    import torch

    sys.path.insert(0, str(ROOT))
    from tests.elastic import groupnorm

    x, y = groupnorm.data(SAMPLES)
    model = groupnorm.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    out, pos = [], 0
    for g in batches:
        replicas = g // (LOCAL_BATCH * GRAD_ACCUM)
        idx = groupnorm.global_batch(pos, g, SAMPLES)
        opt.zero_grad()
        total = 0.0
        for k in range(GRAD_ACCUM):
            for r in range(replicas):
                loss = groupnorm.micro_loss(model, x, y, idx, micro=k, replicas=replicas, local_batch=LOCAL_BATCH,
                                            replica=r)
                loss.backward()
                total += loss.item()
        opt.step()
        pos += g
        out.append(total)
    return tuple(out)


def compare_losses(steps: list[dict], t_cut: float) -> dict:
    """Whether the logged per-step losses (the last record of each step number) equal those of the same run
    without the failure: the global batches it logged before the cut, then the one it had at the cut."""
    last: dict[int, dict] = {}
    for x in steps:
        last[x["step"]] = x
    if not last:
        return {"losses_equal": False, "max_rel": None, "losses_note": "no step logged"}
    n = max(last)
    missing = [s for s in range(1, n + 1) if s not in last]
    before = {x["step"]: x["global_batch"] for x in steps if x["t"] <= t_cut}
    at_cut = before[max(before)] if before else GLOBAL_BATCH
    ref = reference_losses(tuple(before.get(s, at_cut) for s in range(1, n + 1)))
    rel = [abs(last[s]["loss"] - ref[s - 1]) / abs(ref[s - 1]) for s in sorted(last)]
    first_off = next((s for s, r in zip(sorted(last), rel) if r > LOSS_RTOL), None)
    note = f"{n} steps, max rel diff {max(rel):.1e}"
    if missing:
        note += f", steps never logged {missing[:5]}"
    if first_off is not None:
        note += f", first differs at step {first_off} (global batch {last[first_off]['global_batch']})"
    return {"losses_equal": not missing and first_off is None, "max_rel": max(rel), "losses_note": note}


class _Elastic:
    """One elastic run of the subject on 4 fresh hosts; start, cut one host, wait for the resume, stop."""

    def __init__(self, subject: str, hosts, tmp: str, port: int, cut: str, rdzv_conf: str = RDZV_CONF):
        self.subject, self.hosts, self.names, self.cut = subject, hosts, hosts.hosts, cut
        self.marker = f"bench-elastic-{subject}-{port}"
        self.dir = Path(tmp) / self.marker
        self.dir.mkdir(parents=True)
        self.logs, self.procs = {}, {}
        common = ["--dir", str(self.dir), "--batch", str(LOCAL_BATCH), "--grad-accum", str(GRAD_ACCUM),
                  "--marker", self.marker]
        script = [SCRIPT, *common, "--pg-timeout", str(PG_TIMEOUT)]
        q = shlex.quote
        peers_py = str(peers_dir() / "bin" / "python")
        if subject == "podrun":
            self.runs = self.dir / "runs"
            argv = [*PODRUN, "launch", "--hosts", ",".join(self.names), "--devices-per-host", "1",
                    "--transport", "ssh", "--ssh-config", hosts.ssh_config_path, "--python", hosts.python,
                    "--runs-dir", str(self.runs), "--run-id", "run", "--master-port", str(port),
                    "--keepalive", str(KEEPALIVE), "--global-batch", str(GLOBAL_BATCH), "--local-batch",
                    str(LOCAL_BATCH), "--elastic", str(MIN_HOSTS), "--max-restarts", str(MAX_RESTARTS),
                    "--", hosts.python, *script]
            self.command = argv
            self.procs["controller"] = self._popen("controller", argv)
        elif subject == "torchrun":
            cmd = (f"cd {q(str(ROOT))} && LOGLEVEL=INFO exec {q(hosts.python)} -m torch.distributed.run "
                   f"--nnodes {MIN_HOSTS}:{HOSTS} --nproc-per-node 1 --max-restarts {MAX_RESTARTS} "
                   f"--rdzv-backend c10d --rdzv-endpoint {self.names[0]}:{port} --rdzv-id {self.marker} "
                   f"--rdzv-conf {q(rdzv_conf)} " + " ".join(q(w) for w in script))
            self.command = cmd
            for h in self.names:
                self.procs[h] = self._popen(h, hosts.ssh_argv(h, cmd))
        elif subject == "torchft":
            # the lighthouse on h1 (as torchrun's rendezvous endpoint); one replica group per host, started as
            # torchft's README starts one: torchrun, one node, one process, its store on the group's host
            light = (f"exec {q(str(peers_dir() / 'bin' / 'torchft_lighthouse'))} --min_replicas {MIN_HOSTS} "
                     f"--quorum_tick_ms 100 --join_timeout_ms 10000 --heartbeat_timeout_ms {TORCHFT_HEARTBEAT_MS} "
                     f"--bind 0.0.0.0:{port}")
            self.procs["lighthouse"] = self._popen("lighthouse", hosts.ssh_argv(self.names[0], light))
            args = [TORCHFT_SCRIPT, *common, "--pg-timeout", str(TORCHFT_PG_TIMEOUT),
                    "--min-replicas", str(MIN_HOSTS), "--samples", str(SAMPLES)]
            self.command = [light]
            for i, h in enumerate(self.names):
                cmd = (f"cd {q(str(ROOT))} && TORCHFT_LIGHTHOUSE=http://{self.names[0]}:{port} "
                       f"REPLICA_GROUP_ID={i} BENCH_HOST={h} exec {q(peers_py)} -m torch.distributed.run "
                       f"--nnodes 1 --nproc-per-node 1 --master-addr {h} --master-port {port + 1} "
                       + " ".join(q(w) for w in args))
                self.command.append(cmd)
                self.procs[h] = self._popen(h, hosts.ssh_argv(h, cmd))
        elif subject == "dlrover":
            # its job master in local mode on h1 (what dlrover-run --standalone starts for one node), told of 4
            # nodes; dlrover-run on each host finds it through DLROVER_MASTER_ADDR
            master = (f"exec {q(peers_py)} -u -m dlrover.python.master.main --port {port} --node_num {HOSTS} "
                      f"--job_name {self.marker} --platform local")
            self.procs["master"] = self._popen("master", hosts.ssh_argv(self.names[0], master))
            self.command = [master]
            for i, h in enumerate(self.names):
                cmd = (f"cd {q(str(ROOT))} && DLROVER_MASTER_ADDR={self.names[0]}:{port} NODE_RANK={i} NODE_ID={i} "
                       f"NODE_NUM={HOSTS} PYTHON_EXEC={q(peers_py)} exec {q(str(peers_dir() / 'bin' / 'dlrover-run'))} "
                       f"--nnodes {MIN_HOSTS}:{HOSTS} --nproc_per_node 1 --max-restarts {MAX_RESTARTS} "
                       f"--rdzv-conf {DLROVER_RDZV_CONF} " + " ".join(q(w) for w in script) + " --ckpt flash")
                self.command.append(cmd)
                self.procs[h] = self._popen(h, hosts.ssh_argv(h, cmd))
        else:
            raise ValueError(f"unknown subject {subject!r}: one of {', '.join(SUBJECTS)}")

    def _popen(self, key, argv):
        self.logs[key] = open(self.dir / f"{key}.log", "w")
        return subprocess.Popen(argv, stdout=self.logs[key], stderr=subprocess.STDOUT)

    def log_text(self, key) -> str:
        self.logs[key].flush()
        return (self.dir / f"{key}.log").read_text(errors="replace")

    def reason(self) -> str:
        """The launchers' lines that say why a run did not go on (for the note), each message once."""
        keys = ("connectFullMesh", "RendezvousClosedError", "attempts left", "DistStoreError", "timed out after",
                "Timed out waiting", "elastic:", "lost (", "exhausted", "Error:", "error:", "Traceback")
        seen: list[str] = []
        for k in self.launchers() + [k for k in ("lighthouse", "master") if k in self.logs]:
            for line in self.log_text(k).splitlines():
                if any(w in line for w in keys) and "hostname of the client socket" not in line:
                    msg = re.sub(r"^\S*\[?[IWE]\d{4} [\d:.]+ \d+ [^\]]*\]\s*", "", line.strip())
                    msg = re.sub(r"(port|:)\d+|fd=\d+|\[[0-9a-f:]+\]|\d+\.\d+\.\d+\.\d+", "", msg)[:200]
                    if msg not in seen:
                        seen.append(msg)
        return " | ".join(seen[:6]) or "no error in the launchers' logs"

    def timeline(self) -> list[str]:
        """The launchers' lines that mark the recovery (failure seen, rendezvous, restart), for the record."""
        keys = ("FAILED", "Rendezvous complete", "Rendezvous'ing", "Error", "error:", "elastic:", "lost", "restart ",
                "got lighthouse quorum", "should_commit=false", "reconfiguring")
        out = []
        for k in self.launchers():
            for line in self.log_text(k).splitlines():
                if any(w in line for w in keys) and "hostname of the client socket" not in line:
                    out.append(f"[{k}] {line.strip()[:220]}")
        return out[:40]

    def launchers(self) -> list[str]:
        """podrun's controller, or the peers' processes on the hosts that were not cut (the cut host's ssh
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
        for pattern in ("torchft_lighthouse", "dlrover"):    # their servers on our own namespace hosts
            _sweep(self.hosts, self.names, pattern)
        for f in self.logs.values():
            f.close()


def redone(steps: list[dict], t_cut: float, first: dict) -> int:
    """Updates done again after the resume: the steps logged before the cut from the resumed step on."""
    before = [x["step"] for x in steps if x["t"] <= t_cut]
    return max(0, max(before, default=0) - (first["step"] - 1))


def _podrun_breakdown(r: _Elastic, t_cut: float, first: dict) -> dict:
    """podrun's recovery in parts, in seconds: from summary.json (the loss declared), plan-1.json's write (the
    re-plan) and the resumed rank 0's own clock."""
    s = json.loads((r.runs / "run" / "summary.json").read_text())
    rp = (s.get("elastic", {}).get("replans") or [{}])[0]
    if rp.get("lost_at") is None:
        raise ValueError(f"summary.json without the re-plan's timings: {s.get('elastic')}")
    lost = rp["lost_at"]
    plan = (r.runs / "run" / "plan-1.json").stat().st_mtime
    return {"podrun_exit": s["exit_code"], "hosts_lost": rp["hosts_lost"], "old": rp["old"], "new": rp["new"],
            "detected_s": lost - t_cut, "restarted_after_s": rp.get("restarted_after_s"),
            "training_after_s": rp.get("training_after_s"),
            "parts": {"detection": lost - t_cut, "re-plan": plan - lost, "process start": first["proc_start"] - plan,
                      "torch import + process group": first["init_done"] - first["proc_start"],
                      "model build": first.get("built", first["ready"]) - first["init_done"],
                      "state restore": first["ready"] - first.get("built", first["ready"]),
                      "first step": first["t"] - first["ready"]}}


def elastic_run(subject: str, tmp: str, port: int, cut: str = CUT, start_bound: float = 180,
                resume_bound: float = 120, rdzv_conf: str = RDZV_CONF) -> dict:
    """One run on 4 fresh hosts, `cut` isolated once it trains: the figures of the resume (or why there was none)."""
    from tests.harness import NetnsHosts

    missing = peer_missing(subject)
    if missing is not None:
        return {"subject": subject, "cut_host": cut, "resumed_s": None, "why": missing}
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

            def after(s):   # steps of the re-formed group: logged after the cut, by fewer hosts
                return [x for x in s if x["t"] > t_cut and x["world"] != HOSTS]

            try:
                first = r.wait_steps(lambda s: next(iter(after(s)), None), resume_bound,
                                     "a step by the re-formed group")
            except (TimeoutError, RuntimeError) as exc:
                out.update(resumed_s=None, why=f"{exc}: {r.reason()}")
                return out
            errors = [ev["t"] for ev in _events(r.dir) if ev["event"] == "error" and ev["t"] > t_cut]
            out.update(resumed_s=first["t"] - t_cut, first_step=first["step"], world_after=first["world"],
                       global_batch_after=first["global_batch"], proc_start_s=first["proc_start"] - t_cut,
                       init_done_s=first["init_done"] - t_cut, ready_s=first["ready"] - t_cut,
                       restarted=first["proc_start"] > t_cut,
                       worker_error_s=(min(errors) - t_cut) if errors else None)
            try:
                r.wait_steps(lambda s: len(after(s)) >= STEPS_AFTER, 60, f"{STEPS_AFTER} steps after the resume")
            except (TimeoutError, RuntimeError) as exc:      # it resumed; what came after is noted
                out["after"] = f"{exc}: {r.reason()}"
            (r.dir / "stop").touch()
            keys = r.launchers()
            deadline = time.time() + 60
            while any(r.procs[k].poll() is None for k in keys) and time.time() < deadline:
                time.sleep(0.05)
            out["exit_codes"] = {k: r.procs[k].poll() for k in keys}
            steps = _steps(r.dir)
            out["global_batches"] = sorted({x["global_batch"] for x in steps})
            out["redone"] = redone(steps, t_cut, first)
            out.update(compare_losses(steps, t_cut))
            if subject == "podrun":
                try:
                    out.update(_podrun_breakdown(r, t_cut, first))
                except (OSError, ValueError, KeyError) as exc:
                    out["why"] = f"no breakdown: {exc}"
            return out
        finally:
            out["log"] = r.timeline()
            r.close()


def _med(vs):
    vs = [v for v in vs if v is not None]
    return statistics.median(vs) if vs else None


def plan_runs(quick: bool) -> list[tuple[str, str]]:
    """(subject, cut host) in the order run: repeats interleaved, torchrun last in each round (its failed
    rounds take longest)."""
    plan = [(s, CUT) for _ in range(1 if quick else 3) for s in ("podrun", "torchft", "dlrover", "torchrun")]
    if not quick:
        plan += [("podrun", "h1"), ("torchrun", "h1")]
    return plan


def run(quick: bool) -> list[dict]:
    """Full: 3 interleaved rounds cutting h3, then podrun and torchrun cutting h1. Quick: one round."""
    port = 29400 + (os.getpid() % 40) * 10
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for subject, cut in plan_runs(quick):
            port += 10
            try:
                res = elastic_run(subject, tmp, port, cut, resume_bound=120 if cut == CUT else 90)
            except (TimeoutError, RuntimeError) as exc:     # no run to measure: reported, not fatal
                res = {"subject": subject, "cut_host": cut, "resumed_s": None, "why": str(exc)}
            results.setdefault((subject, cut), []).append(res)
            print(json.dumps({k: v for k, v in res.items() if k != "command"}, default=str), file=sys.stderr)
    return rows(results, quick)


def _fmt(vs) -> str:
    return ", ".join("-" if v is None else f"{v:.1f}" for v in vs)


def _why(xs) -> str:
    return " || ".join(x["why"][:400] if x["why"].startswith(x["subject"]) else f"{x['subject']}: {x['why'][:400]}"
                       for x in xs if x.get("resumed_s") is None)


def facts(xs: list[dict]) -> str:
    """One subject's runs in words: cut -> training again, updates done again, global batch, exact losses."""
    ok = [x for x in xs if x.get("resumed_s") is not None]
    if not ok:
        return f"did not train again: {_why(xs)}" if xs else "not run"
    eq = [x.get("losses_equal") for x in ok]
    rel = [x["max_rel"] for x in ok if x.get("max_rel") is not None]
    restarted = "restarted its workers" if all(x.get("restarted") for x in ok) else \
        "kept its surviving workers" if not any(x.get("restarted") for x in ok) else "restarted in some runs"
    text = (f"trained again [{_fmt([x['resumed_s'] for x in xs])}] s after the cut ({len(ok)} of {len(xs)} runs), "
            f"{restarted}; updates done again {[x.get('redone') for x in ok]}; global batch "
            f"{ok[0]['global_batch_before']} -> {sorted({x['global_batch_after'] for x in ok})}; per-step losses "
            f"equal a run without the failure: {'yes' if all(eq) else 'no' if not any(eq) else 'in some runs'}"
            f" (max rel diff over the runs {max(rel, default=math.nan):.1e}; first run: "
            f"{ok[0].get('losses_note', '')})")
    if len(ok) < len(xs):
        text += f"; did not resume: {_why(xs)}"
    return text


def rows(results: dict[tuple[str, str], list[dict]], quick: bool) -> list[dict]:
    setup = (f"4 fresh namespace hosts, {{cut}} isolated after {STEPS_BEFORE_CUT} steps at 1 x 4 x GA 6 = "
             f"{GLOBAL_BATCH}; groupnorm model and data; podrun --keepalive {KEEPALIVE:.0f} --elastic {MIN_HOSTS} "
             f"--global-batch {GLOBAL_BATCH} --local-batch {LOCAL_BATCH} --max-restarts {MAX_RESTARTS} and torchrun "
             f"--rdzv-conf {RDZV_CONF} (training collectives time out after {PG_TIMEOUT:.0f} s); torchft lighthouse "
             f"--min_replicas {MIN_HOSTS} --heartbeat_timeout_ms {TORCHFT_HEARTBEAT_MS}, gloo timeout "
             f"{TORCHFT_PG_TIMEOUT:.0f} s; dlrover-run --nnodes {MIN_HOSTS}:{HOSTS} --rdzv-conf {DLROVER_RDZV_CONF}, "
             f"flash checkpoint to memory every step (collectives time out after {PG_TIMEOUT:.0f} s); cut -> first step of the re-formed group (script's clock)")
    p = results.get(("podrun", CUT), [])
    pv = [x.get("resumed_s") for x in p]
    out = []
    for peer in ("torchrun", "torchft", "dlrover"):
        xs = results.get((peer, CUT), [])
        note = setup.format(cut=CUT) + f"; podrun: {facts(p)}; {peer}: {facts(xs)}"
        out.append(_row_opt(f"elastic_vs_{peer}", f"{NAMES['podrun']}: {CUT} cut -> training again, 4 -> 3 hosts",
                            pv, "s", note, NAMES[peer], [x.get("resumed_s") for x in xs]))
    for subject in SUBJECTS:
        xs = results.get((subject, CUT), [])
        ok = [x for x in xs if x.get("resumed_s") is not None]
        out.append({"benchmark": "elastic_updates_redone", "subject": NAMES[subject],
                    "value": _med([x.get("redone") for x in ok]), "peer": None, "peer_value": None, "ratio": None,
                    "unit": "steps", "note": facts(xs)})
    ok = [x for x in p if x.get("parts")]
    if ok:
        total = _med([x["resumed_s"] for x in ok])
        for part in ok[0]["parts"]:
            out.append({"benchmark": "elastic_breakdown", "subject": f"podrun: {part}",
                        "value": round(_med([x["parts"][part] for x in ok]), 3), "peer": None, "peer_value": None,
                        "ratio": None, "unit": "s",
                        "note": f"median of {len(ok)}; the parts add up to cut -> first step ({total:.2f} s median); "
                                f"runs {_fmt([x['parts'][part] for x in ok])}"})
    tok = [x for x in results.get(("torchrun", CUT), []) if x.get("worker_error_s") is not None]
    if tok:
        out.append({"benchmark": "elastic_breakdown", "subject": "torchrun: cut -> first worker's collective fails",
                    "value": round(_med([x["worker_error_s"] for x in tok]), 3), "peer": None, "peer_value": None,
                    "ratio": None, "unit": "s",
                    "note": f"median of {len(tok)}; its detection is the gloo timeout ({PG_TIMEOUT:.0f} s), the "
                            f"rendezvous then waits for the dead node's heartbeat to expire and the last call"})
    pm, tm = results.get(("podrun", "h1"), []), results.get(("torchrun", "h1"), [])
    if pm or tm:
        note = setup.format(cut="h1 (podrun's master host, torchrun's --rdzv-endpoint)") + \
            f"; podrun: {facts(pm)}; torchrun: {facts(tm)}"
        out.append(_row_opt("elastic_resume_master", f"{NAMES['podrun']}: h1 cut -> training again",
                            [x.get("resumed_s") for x in pm], "s", note, NAMES["torchrun"],
                            [x.get("resumed_s") for x in tm]))
    return out


def _row_opt(benchmark, subject, values, unit, note, peer, peer_values) -> dict:
    """_row over runs that may not have resumed (None): the median of those that did; the note lists every run."""
    v = [x for x in values if x is not None] or [math.nan]
    pv = [x for x in peer_values if x is not None] if peer_values else None
    return _row(benchmark, subject, v, unit, note, peer, pv or None)


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # run the finally blocks: kill, sweep, close hosts
    sys.path.insert(0, str(ROOT))
    if len(sys.argv) > 1 and sys.argv[1] in SUBJECTS:
        # one run, its files kept: `SUBJECT [HOST [RDZV_CONF]]` (RDZV_CONF "" = torchrun's defaults)
        cut = sys.argv[2] if len(sys.argv) > 2 else CUT
        conf = sys.argv[3] if len(sys.argv) > 3 else RDZV_CONF
        print(json.dumps(elastic_run(sys.argv[1], tempfile.mkdtemp(prefix="bel-"), 29400 + os.getpid() % 400, cut,
                                     rdzv_conf=conf), default=str, indent=1))
    else:
        for r in run(quick="--quick" in sys.argv):
            print(r)

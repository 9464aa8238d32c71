"""Launch at scale on real hosts: 8, 16, 32, 64 namespace hosts with sshd (NetnsHosts) and a 64-node Slurm
(SlurmCluster), 1 and 4 light workers per host (bench/scripts/scale_worker.py: no torch), podrun's transports
beside the peers at the same size, interleaved (quick: 4 and 8 hosts).

Subjects, each running the same worker: podrun `--transport ssh` with the OpenSSH client and with paramiko,
`--transport mpirun` (Open MPI over ssh) and `--transport srun` (inside an sbatch job); the peers: mpirun's own
launch of the worker (Open MPI's PRRTE daemons, its ssh tree), srun of the worker inside an sbatch job, pdsh
and clush running the worker on every host (fan-out = the host count: a window smaller than that never
starts the last hosts, since each host's command runs for the whole run), and torchrun started on every host by
pdsh (8 and 16 hosts only: each torchrun imports torch, ~300 MB a host on this 24 GiB machine).

Per run: launch -> every rank running (the latest up-<rank> stamp, each worker's own clock), and for a batch
subject from its job's start too (its launcher's start time: without the scheduler's wait); -> the first
collective (the latest coll-<rank>); a podrun subject's own start up to its engine's (srun, mpirun), rank 0's store
host's CPU, each worker's CPU at its up stamp; the launcher's CPU (its process tree: user + system of the launcher and
every descendant, living or reaped, read from /proc) at every rank running and over an idle window after it
(the steady state: heartbeats); the machine's CPU from the launch to every rank past its collective, and the CPU
of each agent and each worker at every rank running (medians); the launcher's peak RSS (VmHWM) and its tree's RSS; each podrun agent's RSS;
the largest heartbeat gap (podrun's summary.json); teardown: SIGTERM to the launcher (a user's Ctrl-C, a
scheduler's kill) -> launcher gone and no process of the run on any host, and the machine's CPU meanwhile (/proc/stat:
every process on it, as the hosts share its cores); leftovers past the bound (then killed).
The launcher of an sbatch subject is the process inside the job (podrun's controller, or srun).
One gloo run (torch workers, podrun ssh) at min(16, the largest size) hosts shows the collectives are real.
Two more subjects are left out unless named: podrun ssh and mpirun's tree with an ssh config whose
KexAlgorithms is curve25519-sha256 (", kex curve25519"). Two more, also named only, run inside a Grid Engine job
(a GridEngineCluster of the largest size, brought up only for them): podrun `--transport mpirun` and mpirun itself,
each with Open MPI's tight integration (its daemons started by the job's `qrsh -inherit`, no ssh), the launcher
being the process inside the job. PODRUN_SCALE_SIZES, PODRUN_SCALE_PER_HOST,
PODRUN_SCALE_ROUNDS, PODRUN_SCALE_SUBJECTS (;-separated) and PODRUN_SCALE_LAUNCH_ARGS narrow or change a run
(``_knobs``); the JSON's first row says what was run. Peers: bench/install_scale_peers.sh (pdsh, clush).
"""
from __future__ import annotations

import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.rows import row

ROOT = Path(__file__).resolve().parent.parent
WORKER = str(ROOT / "bench" / "scripts" / "scale_worker.py")
ALLREDUCE = str(ROOT / "tests" / "launch" / "scripts" / "torchrun_allreduce.py")
AGENT = "podrun.host.agent"
TICK = os.sysconf("SC_CLK_TCK")
UP_BOUND = 240.0          # launch to every rank's collective, seconds
IDLE = 3.0                # the steady-state window after every rank is running
TORCHRUN_MAX = 16         # torchrun's own torch import per host: more does not fit beside the other sessions


# ----------------------------------------------------------------------------------------------- /proc

def _stat_fields(pid) -> list[str]:
    """/proc/PID/stat's fields after the command name (state first); OSError when the process is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _procs() -> dict[int, tuple[int, str, float, int]]:
    """pid -> (ppid, cmdline, CPU seconds of it and its reaped children, RSS kB): one pass over /proc."""
    out = {}
    for e in os.scandir("/proc"):
        if not e.name.isdigit():
            continue
        try:
            f = _stat_fields(e.name)
            cl = Path(f"/proc/{e.name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f[0] in ("Z", "X"):
            continue
        cpu = sum(int(x) for x in f[11:15]) / TICK       # utime stime cutime cstime
        out[int(e.name)] = (int(f[1]), cl, cpu, int(f[21]) * os.sysconf("SC_PAGE_SIZE") // 1024)
    return out


def _tree(procs, root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for pid, (ppid, *_rest) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        if p in procs:
            out.append(p)
            todo += kids.get(p, [])
    return out


def tree_cpu(root: int) -> tuple[float, int]:
    """(CPU seconds, RSS kB) of root and its descendants (the reaped ones' CPU through cutime/cstime)."""
    procs = _procs()
    pids = _tree(procs, root)
    return sum(procs[p][2] for p in pids), sum(procs[p][3] for p in pids)


def hwm_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def own_cpu_and_threads(pid: int) -> tuple[float | None, int | None]:
    """(CPU seconds of the process itself, without any child, its threads now): the launcher's own share, apart
    from the ssh clients it runs."""
    try:
        f = _stat_fields(pid)
    except OSError:
        return None, None
    return (int(f[11]) + int(f[12])) / TICK, int(f[17])


def machine_cpu() -> float:
    """CPU seconds every core of this machine has spent busy (user, nice, system, irq, softirq) since boot."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return sum(int(fields[i]) for i in (0, 1, 2, 5, 6)) / TICK


ENGINES = ("srun", "mpirun", "prterun")   # the launchers a podrun subject runs its agents through


def engine_start_s(procs, launcher: int) -> float | None:
    """Seconds from ``launcher``'s start to the start of the first engine (srun, mpirun) among its descendants, from
    /proc's start times (clock ticks): a podrun subject's own start before its engine's launch; None for a peer,
    which is its engine."""
    try:
        starts = [int(_stat_fields(p)[19]) for p in _tree(procs, launcher) if p != launcher
                  and os.path.basename(procs[p][1].split(" ", 1)[0]) in ENGINES]
        return (min(starts) - int(_stat_fields(launcher)[19])) / TICK if starts else None
    except OSError:                  # gone meanwhile
        return None


def started_at(pid: int) -> float | None:
    """The wall-clock time ``pid`` started (its /proc start time against /proc/uptime, to 10 ms); None when gone."""
    try:
        ticks = int(_stat_fields(pid)[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except OSError:
        return None
    return time.time() - (uptime - ticks / TICK)


def marked(marker: str) -> list[int]:
    return [p for p, (_pp, cl, _c, _r) in _procs().items() if marker in cl and p != os.getpid()]


def sweep(marker: str) -> int:
    left = marked(marker)
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left)


# ----------------------------------------------------------------------------------------------- one run

class Run:
    """One launch of the worker by one subject; ``measure()`` fills the figures, always cleaning up."""

    def __init__(self, subject: str, n: int, k: int, tmp: str, port: int):
        self.subject, self.n, self.k, self.port = subject, n, k, port
        self.marker = f"scale-{port}"
        self.dir = Path(tmp) / self.marker
        self.dir.mkdir()
        os.chmod(self.dir, 0o777)
        self.log = self.dir / "log"
        self.launcher: int | None = None   # the pid whose tree is the launcher
        self.proc: subprocess.Popen | None = None
        self.job: str | None = None
        self.fig: dict = {}
        self.begun: float | None = None     # a batch subject's job start (its launcher's start time)

    def _start_clock(self) -> None:
        """The launch begins: its wall clock and this machine's busy CPU (every host shares its cores)."""
        self.t0, self.busy0 = time.time(), machine_cpu()

    @property
    def world(self) -> int:
        return self.n * self.k

    def worker(self) -> list[str]:
        return [sys.executable, WORKER, str(self.dir), self.marker]

    def popen(self, argv, env=None) -> None:
        self._start_clock()
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **(env or {})}, cwd=str(ROOT))
        self.launcher = self.proc.pid
        self._exit = threading.Event()
        self._rusage = None

        def reap():
            _, _, ru = os.wait4(self.proc.pid, 0)
            self._rusage = ru
            self.proc.returncode = 0        # reaped here: Popen must not wait for it again
            self._exit.set()
        threading.Thread(target=reap, daemon=True).start()

    def sbatch(self, sl, wrap: str, launcher_pattern: str) -> None:
        self._start_clock()
        nodes = ",".join(sl.nodes[:self.n])
        self.job = sl.sbatch([f"-N{self.n}", f"--nodelist={nodes}", f"--ntasks-per-node={self.k}",
                              f"--output={self.log}", f"--chdir={ROOT}", "--wrap", wrap])
        self._submitted(sl, ["scancel", self.job], launcher_pattern)

    def qsub(self, ge, body: str, launcher_pattern: str) -> None:
        """A Grid Engine job of ``self.n`` hosts (one slot each) whose script runs ``body`` (bash) from ROOT."""
        script = Path(ge.jobs_dir) / f"{self.marker}.sh"
        env = f"export PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])}\n" if os.environ.get("PYTHONPATH") else ""
        script.write_text(f"#!/bin/bash\ncd {shlex.quote(str(ROOT))}\n{env}{body}\n")
        script.chmod(0o755)
        self._start_clock()
        self.job = ge.qsub(["-pe", "podrun", str(self.n), "-o", str(self.log), "-j", "y", str(script)])
        self._submitted(ge, ["qdel", self.job], launcher_pattern)

    def _submitted(self, scheduler, cancel: list[str], launcher_pattern: str) -> None:
        """A batch job was submitted: ``cancel`` (run through ``scheduler``) ends it; its launcher is the process
        inside it whose command line has ``launcher_pattern`` and the marker (found once it runs)."""
        self._cancel = cancel
        self._scheduler = scheduler
        self._pattern = launcher_pattern
        self._exit = threading.Event()
        self._rusage = None

    def _stamps(self, kind: str) -> list[float]:
        out = []
        for f in os.listdir(self.dir):
            if f.startswith(kind + "-") and "." not in f:
                try:
                    out.append(float((self.dir / f).read_text()))
                except (OSError, ValueError):
                    pass
        return out

    def _find_launcher(self) -> None:
        if self.launcher is None and self.job is not None:
            for p, (_pp, cl, _c, _r) in _procs().items():
                if self.marker in cl and cl.split()[:1] and self._pattern in cl and "/bin/sh" not in cl.split()[0]:
                    self.launcher = p
                    break

    def wait_up(self) -> None:
        deadline = time.time() + UP_BOUND
        while len(self._stamps("coll")) < self.world:
            self._find_launcher()
            if time.time() > deadline or (self.proc is not None and self._exit.is_set()):
                raise RuntimeError(f"{self.subject} {self.n}x{self.k}: {len(self._stamps('up'))} up, "
                                   f"{len(self._stamps('coll'))} past the collective of {self.world}: "
                                   + self.tail())
            time.sleep(0.1)
        self._find_launcher()

    def tail(self) -> str:
        """The launcher's last lines, and for a podrun subject its run's root cause (summary.json)."""
        try:
            text = " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-4:])
        except OSError:
            text = ""
        try:
            import json
            cause = json.loads((self.runs / "summary.json").read_text()).get("root_cause") or {}
            text += f" | root cause: instance {cause.get('instance')} on {cause.get('host')}: {cause.get('reason')}"
        except (AttributeError, OSError, ValueError):
            pass
        return text

    def _launcher_gone(self) -> bool:
        if self.proc is not None:
            return self._exit.is_set()
        return self.launcher is None or not Path(f"/proc/{self.launcher}").exists() or \
            _stat_fields(self.launcher)[0] in "ZX"

    def _ours(self, procs: dict, what: str) -> list[tuple[float, int]]:
        """(CPU seconds, RSS kB) of this run's Python processes whose command line names ``what`` (AGENT: podrun's
        agents; WORKER: the scale worker), on every host, from one read of /proc (``_procs``)."""
        return [(c, r) for _pid, (_pp, cl, c, r) in procs.items() if what in cl and self.marker in cl
                and "python" in cl.split()[0]]

    def measure(self, teardown_bound: float) -> dict:
        try:
            self.wait_up()
            f = self.fig
            f["up_s"] = max(self._stamps("up")) - self.t0
            f["coll_s"] = max(self._stamps("coll")) - self.t0
            # a batch subject's launcher starts with its job: the time before is the scheduler's, not the launch's
            self.begun = started_at(self.launcher) if self.job is not None else None
            f["job_up_s"] = f["up_s"] - (self.begun - self.t0) if self.begun is not None else None
            f["first_up_s"] = min(self._stamps("up")) - (self.t0 if self.begun is None else self.begun)
            f["launch_cpu_s"] = machine_cpu() - self.busy0    # to every rank past its collective
            cpu_up, _ = tree_cpu(self.launcher)
            f["cpu_up_s"] = cpu_up
            f["own_cpu_up_s"], f["threads_up"] = own_cpu_and_threads(self.launcher)
            procs = _procs()
            f["engine_start_s"] = engine_start_s(procs, self.launcher) if self.subject.startswith("podrun") else None
            # rank 0's store host (podrun.host.store: it imports torch) names the run's port, not its marker
            store = [c for _p, (_pp, cl, c, _r) in procs.items() if "PODRUN_STORE_FD" in cl
                     and cl.rstrip().endswith(f" {self.port}")]
            f["store_cpu_up_s"] = sum(store) if store else None
            agents_up, t_up = self._ours(procs, AGENT), time.monotonic()
            f["agent_cpu_up_s"] = statistics.median(c for c, _ in agents_up) if agents_up else None
            workers = self._ours(procs, WORKER)
            f["worker_cpu_up_s"] = statistics.median(c for c, _ in workers) if workers else None
            own = self._stamps("cpu")          # each worker's CPU at its up stamp: its start, before it waits on rank 0
            f["worker_start_cpu_s"] = statistics.median(own) if own else None
            time.sleep(IDLE)
            cpu_idle, tree_rss = tree_cpu(self.launcher)
            f["idle_cpu_frac"] = (cpu_idle - cpu_up) / IDLE
            agents, t_idle = self._ours(_procs(), AGENT), time.monotonic()
            # the agents share this machine's cores: their CPU over the time between the two reads of /proc
            f["agents_idle_cpu_frac"] = (sum(c for c, _ in agents) - sum(c for c, _ in agents_up)) / (t_idle - t_up) \
                if agents and agents_up else None
            f["hwm_kb"] = hwm_kb(self.launcher)
            f["tree_rss_kb"] = tree_rss
            f["agent_rss_kb"] = statistics.median(r for _, r in agents) if agents else None
            t1, busy = time.time(), machine_cpu()
            os.kill(self.launcher, signal.SIGTERM)
            deadline = t1 + teardown_bound
            while not (self._launcher_gone() and not marked(self.marker)):
                if time.time() > deadline:
                    break
                time.sleep(0.02)
            f["teardown_s"] = time.time() - t1 if time.time() <= deadline else None
            f["teardown_cpu_s"] = machine_cpu() - busy    # everything this machine ran meanwhile (the hosts share it)
            f["leftovers"] = len(marked(self.marker))
            if self._rusage is not None:
                f["cpu_total_s"] = self._rusage.ru_utime + self._rusage.ru_stime
            return f
        finally:
            self.close()

    def close(self) -> None:
        if self.proc is not None and not self._exit.is_set():
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._exit.wait(10)
        if self.job is not None:
            self._scheduler.run(self._cancel, check=False)
        sweep(self.marker)


# ----------------------------------------------------------------------------------------------- subjects

def _launch_args() -> list[str]:
    """More `podrun launch` options for every podrun subject (PODRUN_SCALE_LAUNCH_ARGS, e.g. '--keepalive 10')."""
    return shlex.split(os.environ.get("PODRUN_SCALE_LAUNCH_ARGS", ""))


def _podrun(r: Run, hosts, cfg: str, tmp: str, transport: str, *extra) -> None:
    names = hosts.hosts[:r.n]
    r.popen([sys.executable, "-m", "podrun", "launch", "--hosts", ",".join(names), "--devices-per-host", str(r.k),
             "--transport", transport, "--ssh-config", cfg, "--python", hosts.python, "--runs-dir", f"{tmp}/runs",
             "--run-id", r.marker, "--master-port", str(r.port), *extra, *_launch_args(), "--", *r.worker()])
    r.runs = Path(tmp) / "runs" / r.marker


def _env_line(r: Run, addr: str) -> str:
    return f"WORLD_SIZE={r.world} MASTER_ADDR={addr} MASTER_PORT={r.port}"


def _mpirun(r: Run, hosts, cfg: str) -> None:
    names = hosts.hosts[:r.n]
    r.popen(["mpirun", "--allow-run-as-root", "-np", str(r.world), "--host", ",".join(f"{h}:{r.k}" for h in names),
             "--map-by", f"ppr:{r.k}:node", "--bind-to", "none", "--prefix", sys.prefix,
             "--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", f"-F {cfg}",
             "-x", f"MASTER_ADDR={hosts.address(names[0])}", "-x", f"MASTER_PORT={r.port}", *r.worker()])


def _fan_line(r: Run, hosts, python_argv: list[str]) -> str:
    """The line each host runs under pdsh/clush: k copies of the command, RANK from the host's number."""
    q = " ".join(shlex.quote(a) for a in python_argv)
    return (f"cd {shlex.quote(str(ROOT))}; i=$(hostname | tr -dc 0-9); for l in $(seq 0 {r.k - 1}); do "
            f"RANK=$(( (i - 1) * {r.k} + l )) {_env_line(r, hosts.address(hosts.hosts[0]))} {q} & done; wait")


def _pdsh(r: Run, hosts, cfg: str, line: str) -> None:
    r.popen(["pdsh", "-R", "ssh", "-f", str(r.n), "-w", ",".join(hosts.hosts[:r.n]), line],
            env={"PDSH_SSH_ARGS": f"-F {cfg} %h", "PDSH_SSH_ARGS_APPEND": ""})


def _clush(r: Run, hosts, cfg: str) -> None:
    r.popen(["clush", "-f", str(r.n), "-w", ",".join(hosts.hosts[:r.n]), "-o", f"-F {cfg}",
             _fan_line(r, hosts, r.worker())])


def _torchrun(r: Run, hosts, cfg: str) -> None:
    names = hosts.hosts[:r.n]
    line = (f"cd {shlex.quote(str(ROOT))}; exec {shlex.quote(hosts.python)} -m torch.distributed.run "
            f"--nnodes {r.n} --nproc-per-node {r.k} --rdzv-backend c10d --rdzv-endpoint {names[0]}:{r.port} "
            f"--rdzv-id {r.marker} " + " ".join(shlex.quote(a) for a in r.worker()[1:]))
    _pdsh(r, hosts, cfg, line)


def _slurm_podrun(r: Run, sl, tmp: str) -> None:
    argv = [sys.executable, "-m", "podrun", "launch", "--transport", "srun", "--nodes", str(r.n),
            "--devices-per-host", str(r.k), "--runs-dir", f"{tmp}/runs", "--run-id", r.marker,
            "--master-port", str(r.port), *_launch_args(), "--", *r.worker()]
    r.sbatch(sl, shlex.join(argv), "podrun launch")
    r.runs = Path(tmp) / "runs" / r.marker


def _slurm_srun(r: Run, sl) -> None:
    argv = ["srun", f"--nodes={r.n}", f"--ntasks-per-node={r.k}", f"--ntasks={r.world}", "--export=ALL",
            f"--job-name={r.marker}", *r.worker()]
    r.sbatch(sl, f"export {_env_line(r, sl.address(sl.nodes[0]))}; exec " + shlex.join(argv), "srun")


def _uge_podrun(r: Run, ge, tmp: str) -> None:
    """podrun --transport mpirun inside a Grid Engine job, no ssh config: Open MPI's daemons start by qrsh."""
    argv = [sys.executable, "-m", "podrun", "launch", "--transport", "mpirun", "--nodes", str(r.n),
            "--devices-per-host", str(r.k), "--runs-dir", f"{tmp}/runs", "--run-id", r.marker,
            "--master-port", str(r.port), *_launch_args(), "--", *r.worker()]
    r.qsub(ge, "exec " + shlex.join(argv), "podrun launch")
    r.runs = Path(tmp) / "runs" / r.marker


def _uge_mpirun(r: Run, ge) -> None:
    """mpirun of the worker inside a Grid Engine job: its hosts from PE_HOSTFILE, its daemons started by qrsh."""
    hosts = f'$(awk \'{{printf "%s%s:{r.k}", (NR > 1 ? "," : ""), $1}}\' "$PE_HOSTFILE")'
    first = '$(head -n 1 "$PE_HOSTFILE" | cut -d " " -f 1)'
    argv = [os.path.join(sys.prefix, "bin", "mpirun"), "--allow-run-as-root", "-np", str(r.world)]
    rest = ["--map-by", f"ppr:{r.k}:node", "--bind-to", "none", "--prefix", sys.prefix,
            "-x", f"MASTER_PORT={r.port}", *r.worker()]
    # Open MPI 5's mpirun execs prterun, which is then the launcher process
    r.qsub(ge, f"exec {shlex.join(argv)} --host \"{hosts}\" -x MASTER_ADDR=\"{first}\" {shlex.join(rest)}",
           "prterun")


def _summary(r: Run) -> dict:
    """A podrun subject's summary.json ({} for a peer, or none)."""
    try:
        import json
        return json.loads((r.runs / "summary.json").read_text())
    except (AttributeError, OSError, ValueError):
        return {}


def _gap(r: Run) -> float | None:
    gaps = [i.get("max_heartbeat_gap_s") for i in _summary(r).get("instances", [])]
    gaps = [g for g in gaps if g is not None]
    return max(gaps) if gaps else None


def _ready_last_s(r: Run) -> float | None:
    """The last agent's ready line (summary.json: the supervisor's start + its ready_s), from the launch's start
    (a batch subject's job start)."""
    summary = _summary(r)
    ready = [i["ready_s"] for i in summary.get("instances", []) if i.get("ready_s") is not None]
    started = (summary.get("timings") or {}).get("started")
    if not ready or started is None:
        return None
    return started + max(ready) - (r.t0 if r.begun is None else r.begun)


def _join_ms(r: Run) -> float | None:
    """The controller's CPU per agent that joined (the hand-shake on its listener's thread: summary.json's joins)."""
    return (_summary(r).get("joins") or {}).get("cpu_ms_per_join")


def _gloo(hosts, cfg, tmp, n: int, port: int) -> dict:
    """podrun ssh, torch workers (init_process_group gloo + all_reduce) on n hosts: the collectives are real."""
    t0 = time.perf_counter()
    cp = subprocess.run([sys.executable, "-m", "podrun", "launch", "--hosts", ",".join(hosts.hosts[:n]),
                         "--devices-per-host", "1", "--transport", "ssh", "--ssh-config", cfg, "--python",
                         hosts.python, "--runs-dir", f"{tmp}/runs", "--master-port", str(port), "--",
                         hosts.python, ALLREDUCE], capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    dt = time.perf_counter() - t0
    said = (cp.stdout + cp.stderr).count("ALLREDUCE")
    if cp.returncode != 0 or said != n:
        raise RuntimeError(f"gloo on {n} hosts: exit {cp.returncode}, {said} ranks said ALLREDUCE: "
                           f"{(cp.stdout + cp.stderr)[-1500:]}")
    return {"s": dt}


# ----------------------------------------------------------------------------------------------- the bench

SUBJECTS = ("podrun ssh (OpenSSH)", "podrun ssh (paramiko)", "podrun mpirun", "podrun srun",
            "mpirun (Open MPI) tree", "srun", "pdsh", "clush", "torchrun via pdsh",
            "podrun ssh (OpenSSH), kex curve25519", "mpirun (Open MPI) tree, kex curve25519",
            "podrun mpirun, Grid Engine qrsh", "mpirun (Open MPI), Grid Engine qrsh")
DEFAULT_SUBJECTS = SUBJECTS[:9]
SLURM_SUBJECTS = ("podrun srun", "srun")
UGE_SUBJECTS = ("podrun mpirun, Grid Engine qrsh", "mpirun (Open MPI), Grid Engine qrsh")
KEX = "curve25519-sha256"      # the ", kex curve25519" subjects' ssh config sets KexAlgorithms to this alone
PEER_OF = {"podrun ssh (OpenSSH)": "mpirun (Open MPI) tree", "podrun ssh (paramiko)": "mpirun (Open MPI) tree",
           "podrun mpirun": "mpirun (Open MPI) tree", "podrun srun": "srun",
           "podrun ssh (OpenSSH), kex curve25519": "mpirun (Open MPI) tree, kex curve25519",
           "podrun mpirun, Grid Engine qrsh": "mpirun (Open MPI), Grid Engine qrsh"}


def collect(sizes, wpps, rounds: int, subjects=DEFAULT_SUBJECTS, teardown_bound: float = 10.0) -> dict:
    """{(subject, n, k): [figures of each run]} and the gloo run; every host and node torn down after. The
    ssh hosts, the Slurm cluster and the Grid Engine cell are brought up only for the subjects that use them."""
    from contextlib import ExitStack

    from tests.harness import NetnsHosts, SlurmCluster
    from tests.harness.uge import GridEngineCluster

    res: dict = {}
    errors: list[str] = []
    port = 31000 + (os.getpid() % 40) * 100
    top = max(sizes)
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp, ExitStack() as stack:
        need_hosts = any(x not in SLURM_SUBJECTS + UGE_SUBJECTS for x in subjects)
        hosts = stack.enter_context(NetnsHosts(top)) if need_hosts else None
        sl = stack.enter_context(SlurmCluster(nodes=top, cpus_per_node=max(wpps))) \
            if any(x in SLURM_SUBJECTS for x in subjects) else None
        ge = stack.enter_context(GridEngineCluster(nodes=top, slots_per_host=max(wpps))) \
            if any(x in UGE_SUBJECTS for x in subjects) else None
        os.chmod(tmp, 0o755)
        if hosts is None:                   # the ssh subjects' config is not needed: keep the code below simple
            hosts = ge or sl
        cfg = f"{tmp}/ssh_config"
        with open(getattr(hosts, "ssh_config_path", os.devnull)) as f, open(cfg, "w") as out:   # Slurm's: none
            text = f.read().replace("ConnectTimeout 5", "ConnectTimeout 60")
            out.write(text)
        kex = f"{tmp}/ssh_config_kex"       # the first value ssh finds wins: this Host * block comes first
        with open(kex, "w") as out:
            out.write(f"Host *\n  KexAlgorithms {KEX}\n" + text)
        starters = {
            "podrun ssh (OpenSSH)": lambda r: _podrun(r, hosts, cfg, tmp, "ssh", "--ssh-client", "openssh"),
            "podrun ssh (paramiko)": lambda r: _podrun(r, hosts, cfg, tmp, "ssh", "--ssh-client", "paramiko"),
            "podrun mpirun": lambda r: _podrun(r, hosts, cfg, tmp, "mpirun"),
            "podrun srun": lambda r: _slurm_podrun(r, sl, tmp),
            "mpirun (Open MPI) tree": lambda r: _mpirun(r, hosts, cfg),
            "srun": lambda r: _slurm_srun(r, sl),
            "pdsh": lambda r: _pdsh(r, hosts, cfg, _fan_line(r, hosts, r.worker())),
            "clush": lambda r: _clush(r, hosts, cfg),
            "torchrun via pdsh": lambda r: _torchrun(r, hosts, cfg),
            "podrun ssh (OpenSSH), kex curve25519": lambda r: _podrun(r, hosts, kex, tmp, "ssh", "--ssh-client",
                                                                       "openssh"),
            "mpirun (Open MPI) tree, kex curve25519": lambda r: _mpirun(r, hosts, kex),
            "podrun mpirun, Grid Engine qrsh": lambda r: _uge_podrun(r, ge, tmp),
            "mpirun (Open MPI), Grid Engine qrsh": lambda r: _uge_mpirun(r, ge),
        }
        for _ in range(rounds):
            for n in sizes:
                for k in wpps:
                    for s in subjects:
                        if s == "torchrun via pdsh" and n > TORCHRUN_MAX:
                            continue
                        port += 4
                        r = Run(s, n, k, tmp, port)
                        try:
                            starters[s](r)
                            fig = r.measure(teardown_bound)
                            fig["gap_s"] = _gap(r)
                            fig["ready_last_s"] = _ready_last_s(r)
                            fig["join_ms"] = _join_ms(r)
                            res.setdefault((s, n, k), []).append(fig)
                            print(f"  {s} {n}x{k}: " + ", ".join(f"{a}={b:.3g}" if isinstance(b, float) else
                                                                 f"{a}={b}" for a, b in fig.items()), flush=True)
                        except Exception as exc:     # one failing subject is reported, not fatal
                            errors.append(f"{s} {n}x{k}: {str(exc)[:400]}")
                            print("  failed:", errors[-1], flush=True)
        gloo_n = min(top, 16)
        port += 4
        try:
            if not need_hosts:
                raise RuntimeError("not run: no ssh subject was named")
            gloo = {"n": gloo_n, **_gloo(hosts, cfg, tmp, gloo_n, port)}
        except Exception as exc:
            gloo = {"n": gloo_n, "error": str(exc)[:400]}
        harnesses = {"NetnsHosts": hosts if need_hosts else None, "SlurmCluster": sl, "GridEngineCluster": ge}
    up = {name: (h.up_seconds, h.down_seconds) for name, h in harnesses.items() if h is not None}
    return {"res": res, "errors": errors, "gloo": gloo, "harness": up}


def _med(runs, key):
    v = [f[key] for f in runs if f.get(key) is not None]
    return statistics.median(v) if v else None


def rows_from(data: dict, rounds: int) -> list[dict]:
    res, rows = data["res"], []
    note0 = f"median of {rounds} interleaved round(s)"
    for (s, n, k), runs in sorted(res.items(), key=lambda x: (x[0][1], x[0][2], SUBJECTS.index(x[0][0]))):
        peer = PEER_OF.get(s)
        pr = res.get((peer, n, k)) if peer else None
        size = f"{n} hosts x {k}"
        cpu = _med(runs, "cpu_up_s")
        hwm, rss, agent = _med(runs, "hwm_kb"), _med(runs, "tree_rss_kb"), _med(runs, "agent_rss_kb")
        idle, gap = _med(runs, "idle_cpu_frac"), _med(runs, "gap_s")
        td = [f["teardown_s"] for f in runs]
        left = max(f["leftovers"] for f in runs)
        detail = (f"{note0}; launcher CPU at every rank running {cpu * 1000 / n:.0f} ms/host; idle "
                  f"{idle * 100:.2f} % of a core ({idle * 100 * 100 / n:.2f} % per 100 hosts); launcher peak RSS "
                  f"{(hwm or 0) / 1024:.1f} MB, its tree {rss / 1024:.1f} MB ({rss / 1024 / n:.2f} MB/host)"
                  + (f"; agent RSS {agent / 1024:.1f} MB" if agent is not None else "")
                  + (f"; largest heartbeat gap {gap:.2f} s" if gap is not None else "")
                  + (f"; the controller's CPU per joined host {jms:.2f} ms"
                     if (jms := _med(runs, "join_ms")) is not None else "")
                  + (f"; the launcher process alone {own * 1000 / n:.0f} ms/host and {threads:g} threads at every "
                     f"rank running" if (own := _med(runs, "own_cpu_up_s")) is not None
                     and (threads := _med(runs, "threads_up")) is not None else "")
                  + (f"; the machine's CPU to every rank past its collective {lcpu:.1f} s"
                     if (lcpu := _med(runs, "launch_cpu_s")) is not None else "")
                  + (f"; the last agent ready at {ready:.2f} s" if (ready := _med(runs, "ready_last_s")) is not None
                     else "")
                  + f"; the first rank running at {_med(runs, 'first_up_s'):.2f} s"
                  + (f"; CPU per agent {acpu * 1000:.0f} ms" if (acpu := _med(runs, "agent_cpu_up_s")) is not None
                     else "")
                  + (f"; CPU per worker {wcpu * 1000:.0f} ms" if (wcpu := _med(runs, "worker_cpu_up_s")) is not None
                     else "")
                  + (f" ({ws * 1000:.0f} ms to its up stamp)" if (ws := _med(runs, "worker_start_cpu_s")) is not None
                     else "")
                  + f"; leftovers {left}")
        rows.append(row("scale launch -> every rank running", f"{s}, {size}", [f["up_s"] for f in runs], "s",
                        detail, f"{peer}, {size}" if pr else None, [f["up_s"] for f in pr] if pr else None))
        job_up = [f["job_up_s"] for f in runs if f.get("job_up_s") is not None]
        peer_job_up = [f["job_up_s"] for f in pr if f.get("job_up_s") is not None] if pr else []
        if job_up:
            rows.append(row("scale job start -> every rank running", f"{s}, {size}", job_up, "s",
                            f"{note0}; from the start of the launcher's job (its process's start time), without the "
                            "scheduler's wait before it" + (f"; podrun's own start to its engine's "
                                                            f"{eng:.2f} s" if (eng := _med(runs, "engine_start_s"))
                                                            is not None else "")
                            + (f"; rank 0's store host's CPU {st:.2f} s" if (st := _med(runs, "store_cpu_up_s"))
                               is not None else ""),
                            f"{peer}, {size}" if peer_job_up else None, peer_job_up or None))
        rows.append(row("scale launch -> first collective", f"{s}, {size}", [f["coll_s"] for f in runs], "s",
                        note0, f"{peer}, {size}" if pr else None, [f["coll_s"] for f in pr] if pr else None))
        rows.append(row("scale launcher CPU at every rank running", f"{s}, {size}", cpu, "s CPU",
                        f"{note0}; {cpu * 1000 / n:.1f} ms/host", f"{peer}, {size}" if pr else None,
                        _med(pr, "cpu_up_s") if pr else None))
        rows.append(row("scale launcher idle CPU", f"{s}, {size}", idle * 100, "% of one core",
                        f"{note0}; {IDLE:g} s window after every rank ran; {idle * 100 * 100 / n:.3f} % per 100 hosts"))
        agents_idle = _med(runs, "agents_idle_cpu_frac")
        if agents_idle is not None:
            rows.append(row("scale agents' idle CPU (every host's agent together)", f"{s}, {size}",
                            agents_idle * 100, "% of one core",
                            f"{note0}; from two reads of /proc {IDLE:g} s or more apart after every rank ran; "
                            f"{agents_idle * 100 / n:.3f} % per agent"))
        rows.append(row("scale launcher peak RSS", f"{s}, {size}", (hwm or 0) / 1024, "MB",
                        f"{note0}; VmHWM of the launcher process; its tree (ssh clients included) {rss / 1024:.1f} MB"
                        f" = {rss / 1024 / n:.2f} MB/host"))
        ended = [t for t in td if t is not None]
        rows.append(row("scale teardown (SIGTERM -> every host clean)", f"{s}, {size}", ended or None, "s",
                        f"{note0}; ended within the bound in {len(ended)} of {len(td)}; leftovers {left}"
                        + (f"; the machine's CPU meanwhile {tcpu:.2f} s" if (tcpu := _med(runs, "teardown_cpu_s"))
                           is not None else ""),
                        f"{peer}, {size}" if pr else None,
                        [t for t in (f["teardown_s"] for f in pr) if t is not None] or None if pr else None))
    g = data["gloo"]
    rows.append(row("scale gloo all_reduce (torch workers)", f"podrun ssh (OpenSSH), {g['n']} hosts x 1",
                    g.get("s"), "s", g.get("error") or "init_process_group(gloo) + all_reduce + exit, "
                    "tests/launch/scripts/torchrun_allreduce.py"))
    for name, (up_s, down_s) in data["harness"].items():
        rows.append(row("scale harness", f"{name} up / down", up_s, "s", f"down {down_s:.2f} s"))
    for e in data["errors"]:
        rows.append(row("scale failures", e.split(":", 1)[0], None, "-", e.split(":", 1)[1].strip()))
    return rows


def _knobs(quick: bool) -> tuple[tuple[int, ...], tuple[int, ...], int, tuple[str, ...]]:
    """Sizes, workers per host, rounds and subjects; PODRUN_SCALE_SIZES=64, PODRUN_SCALE_PER_HOST=4,
    PODRUN_SCALE_ROUNDS=3 and PODRUN_SCALE_SUBJECTS='podrun ssh (OpenSSH);mpirun (Open MPI) tree' narrow a run
    to the figures it repeats (the JSON's first row says what was run)."""
    env = os.environ
    ints = lambda name, default: tuple(int(x) for x in env[name].split(",")) if env.get(name) else default  # noqa: E731
    subjects = tuple(x.strip() for x in env["PODRUN_SCALE_SUBJECTS"].split(";")) \
        if env.get("PODRUN_SCALE_SUBJECTS") else DEFAULT_SUBJECTS
    unknown = [x for x in subjects if x not in SUBJECTS]
    if unknown:
        raise ValueError(f"PODRUN_SCALE_SUBJECTS: unknown {unknown}; known: {', '.join(SUBJECTS)}")
    return (ints("PODRUN_SCALE_SIZES", (4, 8) if quick else (8, 16, 32, 64)), ints("PODRUN_SCALE_PER_HOST", (1, 4)),
            ints("PODRUN_SCALE_ROUNDS", (1,))[0], subjects)


def run(quick: bool) -> list[dict]:
    sizes, wpps, rounds, subjects = _knobs(quick)
    data = collect(sizes, wpps, rounds, subjects=subjects, teardown_bound=5.0)
    rows = [row("scale settings", "sizes / per host / rounds", rounds, "rounds",
                f"hosts {'/'.join(map(str, sizes))}; workers per host {'/'.join(map(str, wpps))}; subjects "
                f"{', '.join(subjects)}; podrun launch options {' '.join(_launch_args()) or 'none added'}; load "
                f"average at the end {os.getloadavg()[0]:.1f}")]
    rows += rows_from(data, rounds)
    rows.append({"benchmark": "scale raw", "subject": "per run figures", "value": None, "peer": None,
                 "peer_value": None, "ratio": None, "unit": "-",
                 "note": "", "raw": [{"subject": s, "hosts": n, "per_host": k, "runs": v}
                                     for (s, n, k), v in data["res"].items()]})
    return rows


if __name__ == "__main__":
    from bench.rows import run_alone

    run_alone(run)

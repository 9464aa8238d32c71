"""GridEngineCluster: a real, throwaway Grid Engine cell (sge_qmaster + one sge_execd per network namespace).

    with GridEngineCluster(nodes=3) as ge:
        job = ge.qsub(["-pe", "podrun", "3", "-b", "y", "hostname"])
        ge.wait_job(job)                      # -> {"exit_status": "0", "failed": "0", ...} (qacct -j)

What it is: the OpenSSH hosts of NetnsHosts (node1..nodeN, each a network + UTS + mount namespace
with its own hostname and /etc/hosts that names every host, both ways), plus a Grid Engine cell of
its own under the run directory: SGE_ROOT = <run_dir>/sge, SGE_CELL = podrun, classic (flat file)
spooling, sge_qmaster on node1 (the head: also the submit host, like a login node) and sge_execd
on every node, each started with nsenter so that it sees its own hostname. Ports are the standard
6444/6445 (SGE_QMASTER_PORT / SGE_EXECD_PORT): every namespace has its own port space. Nothing of
the machine's Grid Engine configuration (/var/lib/gridengine, /etc/default/gridengine) is read or
written: the client wrappers in /usr/bin honour SGE_ROOT/SGE_CELL from ``env``.

The cell has one parallel environment ``podrun`` (allocation_rule 1: one slot per host, so a job
asking ``-pe podrun N`` gets N distinct hosts in PE_HOSTFILE; control_slaves TRUE,
job_is_first_task TRUE) and one queue ``all.q`` over every node.
Jobs of root are allowed (min_uid 0), accounting is flushed at once (``qacct -j`` sees a job as
soon as it ends), and the scheduler runs every second.

Commands for the cell (qsub, qstat, qacct, qdel, qconf) run on node1 with ``env``: use ``run``
(or ``exec("node1", ...)`` for a command such as `podrun submit` that calls them). Jobs do not
inherit the submitter's environment (Grid Engine gives them a fixed one); pass what a job needs
with ``qsub -v`` or `podrun submit --env`. Inside a job, other hosts are reached over ssh with
``ssh_config_path`` (the NetnsHosts keys and known hosts).
"""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Sequence

from .common import HarnessError, await_daemonised, check_prerequisites, pid_from_file, run, wait_for
from .netns import NetnsHosts

CELL = "podrun"
QMASTER_PORT = 6444
EXECD_PORT = 6445
PE = "podrun"
QUEUE = "all.q"
UGE_TOOLS = (("/usr/sbin/sge_qmaster", "gridengine-master"), ("/usr/sbin/sge_execd", "gridengine-exec"),
             ("qsub", "gridengine-client"), ("qstat", "gridengine-client"), ("qacct", "gridengine-client"),
             ("qdel", "gridengine-client"), ("qconf", "gridengine-client"),
             ("/usr/lib/gridengine/spoolinit", "gridengine-master"),
             ("/usr/lib/gridengine/spooldefaults", "gridengine-master"),
             ("/var/lib/gridengine/bin/lx-amd64/qrsh", "gridengine-client"))
BASE_CONFIGURATION = Path("/usr/share/gridengine/default-configuration")
BASE_COMPLEXES = Path("/usr/share/gridengine/util/resources/centry")
BASE_USERSETS = Path("/usr/share/gridengine/util/resources/usersets")


class GridEngineCluster(NetnsHosts):
    """sge_qmaster on node1 + sge_execd on node1..nodeN in network namespaces; a context manager."""

    def __init__(self, nodes: int = 3, *, slots_per_host: int = 4, start: bool = True):
        self.num_nodes = nodes
        self.slots_per_host = slots_per_host
        super().__init__(nodes, "node", start=start)

    # ------------------------------------------------------------------ life cycle
    def start(self) -> "GridEngineCluster":
        t0 = time.monotonic()
        check_prerequisites(UGE_TOOLS)
        super().start()
        return self._bring_up(self._start_cell, since=t0)

    def _start_cell(self) -> None:
        """The cell files, sge_qmaster, the queue and every sge_execd, waited for until they report."""
        self.sge_root = self.run_dir / "sge"
        self.cell_dir = self.sge_root / CELL
        self.jobs_dir = self.run_dir / "jobs"
        self.tmp_dir = self.run_dir / "tmp"
        self._write_cell()
        self._spool_objects()
        self._start_qmaster()
        # the queue through the qmaster: only it makes the queue's instances on each host
        queue = self.run_dir / "sge-objects" / "queue"
        queue.write_text(_queue(self.nodes, self.slots_per_host, self.tmp_dir))
        self.run(["qconf", "-Aq", str(queue)])
        self._start_execds(self.nodes)
        wait_for(self._all_up, 60, f"Grid Engine exec hosts {', '.join(self.nodes)} to report "
                                   f"(spool: {self.cell_dir}/spool)", interval=0.2)

    def _teardown(self) -> None:
        """Delete every job, stop the daemons; the namespaces (and all they hold) go with NetnsHosts."""
        if getattr(self, "sge_root", None) is not None and self._qmaster_pid():
            self.run(["qdel", "-f", "-u", "*"], check=False, timeout=10)
            self.run(["qconf", "-ke", "all"], check=False, timeout=10)
            self.run(["qconf", "-km"], check=False, timeout=10)
        super()._teardown()

    # ------------------------------------------------------------------ properties
    @property
    def head(self) -> str:
        """The node running sge_qmaster: the submit host."""
        return "node1"

    @property
    def nodes(self) -> list[str]:
        return self.hosts

    @property
    def daemon_env(self) -> dict[str, str]:
        """What the daemons (and so the jobs, which inherit theirs) start with: a bare PATH, as from
        init, and the cell's variables; not the test session's environment."""
        return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
                "LANG": "C.UTF-8", **self._cell_vars}

    @property
    def _cell_vars(self) -> dict[str, str]:
        return {"SGE_ROOT": str(self.sge_root), "SGE_CELL": CELL,
                "SGE_QMASTER_PORT": str(QMASTER_PORT), "SGE_EXECD_PORT": str(EXECD_PORT)}

    @property
    def env(self) -> dict[str, str]:
        """A copy of os.environ with the cell's SGE_ROOT, SGE_CELL and ports: pass it to every Grid
        Engine command."""
        return {**os.environ, **self._cell_vars}

    # ------------------------------------------------------------------ commands
    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 60, node: str | None = None,
            **kw) -> subprocess.CompletedProcess:
        """Run a Grid Engine client command on the head node (or ``node``) with ``env``; check=True
        raises HarnessError."""
        env = {**self.env, **kw.pop("env", {})}
        cp = self.exec(node or self.head, list(argv), env=env, timeout=timeout, **kw)
        if check and cp.returncode != 0:
            raise HarnessError(f"podrun test harness: `{' '.join(argv)}` failed with exit code "
                               f"{cp.returncode}: {(cp.stderr or cp.stdout).strip()[-2000:]}")
        return cp

    def qsub(self, args: Sequence[str], **kw) -> str:
        """Submit (qsub -terse ARGS) from the head node and return the job id."""
        return self.run(["qsub", "-terse", *args], **kw).stdout.strip().split(".")[0]

    def accounting(self, job_id: str) -> dict[str, str]:
        """`qacct -j JOB` as a dict (exit_status, failed, hostname, ...; where it prints several records, each
        field as the last record has it); {} while the job is not finished."""
        return {k: v for record in self.accounting_records(job_id) for k, v in record.items()}

    def accounting_records(self, job_id: str) -> list[dict[str, str]]:
        """Every record `qacct -j JOB` prints (the master task's, and one per task the job started with
        `qrsh -inherit`), each as a dict; [] while the job is not finished."""
        cp = self.run(["qacct", "-j", str(job_id)], check=False)
        if cp.returncode != 0:
            return []
        records: list[dict[str, str]] = [{}]
        for line in cp.stdout.splitlines():
            key, _, value = line.partition(" ")
            if key.startswith("="):                 # the line of ='s before each record
                records.append({})
            elif key:
                records[-1][key] = value.strip()
        return [r for r in records if r]

    def wait_job(self, job_id: str, timeout: float = 60) -> dict[str, str]:
        """Wait until the job has ended (its accounting record is written); return it."""
        return wait_for(lambda: self.accounting(job_id), timeout, f"Grid Engine job {job_id} to finish",
                        interval=0.2)

    def queued_jobs(self) -> list[str]:
        """Ids of the jobs the qmaster still holds (pending or running)."""
        cp = self.run(["qstat", "-u", "*"], check=False)
        return [line.split()[0] for line in cp.stdout.splitlines()[2:] if line.split()]

    # ------------------------------------------------------------------ internals
    def _write_cell(self) -> None:
        common = self.cell_dir / "common"
        common.mkdir(parents=True)
        (self.sge_root / "util").symlink_to("/usr/share/gridengine/util")
        # $SGE_ROOT/bin/$ARC and utilbin/$ARC as a real install has them (Debian keeps them under
        # /var/lib/gridengine): Open MPI starts its daemons in a job with $SGE_ROOT/bin/$ARC/qrsh
        for sub in ("bin", "utilbin"):
            (self.sge_root / sub).symlink_to(f"/var/lib/gridengine/{sub}")
        for sub in ("spool/qmaster", "spool/execd"):
            (self.cell_dir / sub).mkdir(parents=True)
        self.jobs_dir.mkdir()
        self.tmp_dir.mkdir()
        os.chmod(self.run_dir, 0o755)      # jobs read files under it
        os.chmod(self.jobs_dir, 0o777)
        os.chmod(self.tmp_dir, 0o1777)
        (common / "bootstrap").write_text(f"""\
admin_user              none
default_domain          none
ignore_fqdn             true
spooling_method         classic
spooling_lib            libspoolc
spooling_params         {common};{self.cell_dir}/spool/qmaster
binary_path             /usr/lib/gridengine
qmaster_spool_dir       {self.cell_dir}/spool/qmaster
security_mode           none
listener_threads        2
worker_threads          2
scheduler_threads       1
""")
        (common / "act_qmaster").write_text(self.head + "\n")
        (common / "cluster_name").write_text(f"podrun{self.slot}\n")
        conf = {}
        for line in BASE_CONFIGURATION.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                k, _, v = line.partition(" ")
                conf[k] = v.strip()
        conf.update({
            "execd_spool_dir": f"{self.cell_dir}/spool/execd",
            "min_uid": "0", "min_gid": "0",
            "mailer": "/bin/true",
            "load_report_time": "00:00:05",
            "max_unheard": "00:00:30",
            "reporting_params": "accounting=true reporting=false flush_time=00:00:01 "
                                "accounting_flush_time=00:00:00 joblog=false sharelog=00:00:00",
            "execd_params": "KEEP_ACTIVE=FALSE",
        })
        conf_file = self.run_dir / "sge-global-configuration"
        conf_file.write_text("".join(f"{k} {v}\n" for k, v in conf.items()))
        env = self.env
        run(["/usr/lib/gridengine/spoolinit", "classic", "libspoolc",
             f"{common};{self.cell_dir}/spool/qmaster", "init"], env=env)
        run(["/usr/lib/gridengine/spooldefaults", "configuration", str(conf_file)], env=env)
        run(["/usr/lib/gridengine/spooldefaults", "complexes", str(BASE_COMPLEXES)], env=env)
        run(["/usr/lib/gridengine/spooldefaults", "usersets", str(BASE_USERSETS)], env=env)
        run(["/usr/lib/gridengine/spooldefaults", "managers", "root"], env=env)
        (common / "sched_configuration").write_text(_SCHED)

    def _start_qmaster(self) -> None:
        cp = self.exec(self.head, ["/usr/sbin/sge_qmaster"], env=self.daemon_env, cwd="/", timeout=30)
        if cp.returncode != 0:
            raise HarnessError(f"podrun test harness: sge_qmaster on {self.head} failed to start: "
                               f"{(cp.stderr or cp.stdout).strip()} (messages: {self.cell_dir}/spool/qmaster)")
        wait_for(lambda: self.run(["qstat"], check=False, timeout=10).returncode == 0, 30,
                 f"sge_qmaster on {self.head} to answer (messages: {self.cell_dir}/spool/qmaster/messages)",
                 interval=0.1)

    def _spool_objects(self) -> None:
        """Hosts and the parallel environment, spooled before sge_qmaster starts (one spooldefaults
        call per kind instead of a qconf round trip per object)."""
        d = self.run_dir / "sge-objects"
        nodes = self.nodes
        objects = {
            "adminhosts": {n: f"hostname {n}\n" for n in nodes},
            "submithosts": {self.head: f"hostname {self.head}\n"},
            "exechosts": {n: f"hostname {n}\nload_scaling NONE\ncomplex_values NONE\nuser_lists NONE\n"
                             "xuser_lists NONE\nprojects NONE\nxprojects NONE\nusage_scaling NONE\n"
                             "report_variables NONE\n" for n in nodes},
            "pes": {PE: _PE},
        }
        for kind, files in objects.items():
            (d / kind).mkdir(parents=True)
            for name, text in files.items():
                (d / kind / name).write_text(text)
            run(["/usr/lib/gridengine/spooldefaults", kind, str(d / kind)], env=self.env)

    def _start_execds(self, nodes: Sequence[str]) -> None:
        """Start sge_execd on each node at once (each takes about 2 s to register and daemonize)."""
        procs = {node: self.popen(node, ["/usr/sbin/sge_execd"], env=self.daemon_env, cwd="/",
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
                 for node in nodes}
        for node, p in procs.items():
            await_daemonised(p, f"sge_execd on {node}", f"messages: {self.cell_dir}/spool/execd/{node}/messages")

    def _qmaster_pid(self) -> int | None:
        return pid_from_file(self.cell_dir / "spool" / "qmaster" / "qmaster.pid", "sge_qmaster")

    def _all_up(self) -> bool:
        cp = self.run(["qstat", "-f", "-q", QUEUE], check=False, timeout=10)
        if cp.returncode != 0:
            return False
        up = set()
        for line in cp.stdout.splitlines():
            parts = line.split()
            if parts and parts[0].startswith(f"{QUEUE}@"):
                state = parts[5] if len(parts) > 5 else ""
                if "u" not in state and "E" not in state and "-NA-" not in line:
                    up.add(parts[0].split("@", 1)[1])
        return all(n in up for n in self.nodes)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"slot {getattr(self, 'slot', '?')}"
        return f"GridEngineCluster(nodes={self.num_nodes}, {state})"


_PE = f"""\
pe_name            {PE}
slots              9999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    1
control_slaves     TRUE
job_is_first_task  TRUE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
"""

# Grid Engine's default scheduler configuration, but scheduling every second (default: 15 s)
_SCHED = """\
algorithm default
schedule_interval 0:0:1
maxujobs 0
queue_sort_method 0
job_load_adjustments np_load_avg=0.50
load_adjustment_decay_time 0:7:30
load_formula np_load_avg
schedd_job_info true
flush_submit_sec 0
flush_finish_sec 0
params none
reprioritize_interval 0:0:0
halftime 168
usage_weight_list cpu=1.000000 mem=0.000000 io=0.000000
compensation_factor 5.000000
weight_user 0.250000
weight_project 0.250000
weight_department 0.250000
weight_job 0.250000
weight_tickets_functional 0
weight_tickets_share 0
weight_tickets_override 0
share_override_tickets TRUE
share_functional_shares TRUE
max_functional_jobs_to_schedule 200
report_pjob_tickets TRUE
max_pending_tasks_per_job 50
halflife_decay_list none
policy_hierarchy OFS
weight_ticket 0.500000
weight_waiting_time 0.278000
weight_deadline 3600000.000000
weight_urgency 0.500000
weight_priority 0.000000
max_reservation 0
default_duration INFINITY
"""


def _queue(nodes: Sequence[str], slots: int, tmp_dir: Path) -> str:
    """The queue over every node; a job's TMP (TMP_DIR/JOB.TASK.QUEUE, made at its start and removed at its end) is
    under the cell's own folder: in /tmp, the machine's other cells' jobs of the same id would remove it."""
    return f"""\
qname                 {QUEUE}
hostlist              {' '.join(nodes)}
seq_no                0
load_thresholds       NONE
suspend_thresholds    NONE
nsuspend              1
suspend_interval      00:05:00
priority              0
min_cpu_interval      00:05:00
processors            UNDEFINED
qtype                 BATCH INTERACTIVE
ckpt_list             NONE
pe_list               {PE}
rerun                 FALSE
slots                 {slots}
tmpdir                {tmp_dir}
shell                 /bin/bash
prolog                NONE
epilog                NONE
shell_start_mode      unix_behavior
starter_method        NONE
suspend_method        NONE
resume_method         NONE
terminate_method      NONE
notify                00:00:60
owner_list            NONE
user_lists            NONE
xuser_lists           NONE
subordinate_list      NONE
complex_values        NONE
projects              NONE
xprojects             NONE
calendar              NONE
initial_state         default
s_rt                  INFINITY
h_rt                  INFINITY
s_cpu                 INFINITY
h_cpu                 INFINITY
s_fsize               INFINITY
h_fsize               INFINITY
s_data                INFINITY
h_data                INFINITY
s_stack               INFINITY
h_stack               INFINITY
s_core                INFINITY
h_core                INFINITY
s_rss                 INFINITY
h_rss                 INFINITY
s_vmem                INFINITY
h_vmem                INFINITY
"""

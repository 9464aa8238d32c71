"""The controller's OpenMetrics endpoint (`podrun launch --metrics-port`): the live state (podrun.live.state) as
Prometheus metrics through prometheus_client, built at each scrape; the Prometheus file_sd target file that lets a
server find the run (in the run directory, or a directory the user names), written as the run starts and removed
as it ends."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from podrun import safefs
from podrun.errors import LaunchError
from podrun.launch.observe import RunObserver
from podrun.rundir.account import CATEGORIES
from podrun.rundir.layout import PROMETHEUS_TARGETS as TARGETS, SPLIT_PARTS
from podrun.rundir.metrics import is_number

if TYPE_CHECKING:  # pragma: no cover
    from podrun.launch.options import LiveOptions

SD_MODE = 0o644                          # a Prometheus server running as its own user reads it
LINGER_MAX_S = 30.0                      # the longest the endpoint waits at the end for its scraper's last visit
NEEDS = "prometheus_client"              # the optional package the endpoint is served with
MISSING = ("podrun: --metrics-port needs prometheus_client (pip install 'podrun[metrics]'); "
           "the run goes on without its metrics endpoint")


def _family(kind, name: str, doc: str, labels: list[str], rows, unit: str = ""):
    fam = kind(name, doc, labels=labels, unit=unit) if unit else kind(name, doc, labels=labels)
    for values, v in rows:
        if is_number(v):
            fam.add_metric([("" if x is None else str(x)) for x in values], float(v))
    return fam


class _Collector:
    """Builds every metric from one snapshot of the live state at each scrape."""

    def __init__(self, snapshot):
        self.snapshot = snapshot
        self.scrapes: list[float] = []        # the last two scrapes' times (monotonic)
        self.cpu_s = 0.0                      # CPU the scrapes took building and writing the figures, so far
        self.scraped = threading.Condition()

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        began, cpu = time.monotonic(), time.thread_time()
        s = self.snapshot()
        with self.scraped:
            self.scrapes = [*self.scrapes[-1:], began]
            self.scraped.notify_all()
        base = ["run_id", "recipe", "cluster"]
        b = [s.get("run_id"), s.get("recipe"), s.get("cluster")]
        g = GaugeMetricFamily
        acc = s.get("account") or {}
        secs = acc.get("seconds") or {}
        yield _family(g, "podrun_account_seconds", "The run's wall time so far by category (summary.json's account)",
                      base + ["category"], [(b + [c], secs.get(c)) for c in CATEGORIES])
        yield _family(g, "podrun_goodput", "Training seconds over wall seconds so far (the account's goodput)", base,
                      [(b, acc.get("goodput"))])
        yield _family(g, "podrun_throughput_samples_per_second", "Samples a second over the run, the latest report",
                      base, [(b, s.get("samples_per_sec"))])
        yield _family(g, "podrun_step", "The latest training step reported", base, [(b, s.get("step"))])
        yield _family(g, "podrun_steps", "The run's steps in all", base, [(b, s.get("total"))])
        yield _family(g, "podrun_time_left_seconds", "The steps left times the latest step's seconds", base,
                      [(b, s.get("time_left_s"))])
        yield _family(g, "podrun_running", "1 while the run's workers run", base, [(b, int(bool(s.get("running"))))])
        yield _family(CounterMetricFamily, "podrun_restarts", "Restarts of the run so far", base,
                      [(b, s.get("restarts"))])
        yield _family(g, "podrun_hosts_running", "Hosts whose agents run", base, [(b, s.get("hosts_running"))])
        yield _family(g, "podrun_hosts_lost", "Hosts found lost in this attempt", base, [(b, s.get("hosts_lost"))])
        yield _family(g, "podrun_slow_rank_ratio", "The slowest named rank's busy time over the others' median",
                      base, [(b, s.get("slow_ratio"))])
        hosts, ranks = s.get("hosts") or [], s.get("ranks") or []
        yield _family(g, "podrun_host_heartbeat_age_seconds", "Seconds since the host's agent was last heard",
                      base + ["host"], [(b + [h["host"]], h.get("heartbeat_age_s")) for h in hosts])
        yield _family(g, "podrun_host_up", "1 while the host's agent runs, 0 once it ended or was lost",
                      base + ["host", "state"], [(b + [h["host"], h["state"]], int(h["state"] == "running"))
                                                 for h in hosts])
        yield _family(g, "podrun_rank_busy_seconds", "The rank's own work in its latest step",
                      base + ["host", "rank"], [(b + [r["host"], r["rank"]], r.get("busy_s")) for r in ranks])
        yield _family(g, "podrun_rank_step_split_seconds", "The rank's mean step split over the run, by part",
                      base + ["host", "rank", "part"],
                      [(b + [r["host"], r["rank"], p], (r.get("split") or {}).get(p)) for r in ranks
                       for p in SPLIT_PARTS])
        # this endpoint's own cost: the figures yielded above are written out as they come, so the span holds both
        yield _family(CounterMetricFamily, "podrun_metrics_cpu_seconds", "CPU the controller spent on the scrapes "
                      "before this one (making and writing the figures)", base, [(b, self.cpu_s)])
        self.cpu_s += time.thread_time() - cpu


class MetricsServer(RunObserver):
    """The endpoint of one launch: bound when made (a port in use: LaunchError, before the start), serving the
    live state ``state`` (a podrun.live.state.LiveState) until ``close``: ``opts``' --metrics-port (0: a free
    port), --metrics-address and --metrics-sd-dir."""

    what = "the metrics endpoint"

    def __init__(self, opts: LiveOptions, state):
        from prometheus_client import start_http_server
        from prometheus_client.registry import CollectorRegistry

        self.opts, self.state = opts, state
        if opts.metrics_sd_dir is not None:   # another user's or a shared-writable directory: refused before the start
            safefs.own_dir(opts.metrics_sd_dir, "--metrics-sd-dir", error=LaunchError)
        registry = CollectorRegistry(auto_describe=False)
        self.collector = _Collector(state.snapshot)
        registry.register(self.collector)
        self.final_at: float | None = None
        try:
            self.httpd, self.thread = start_http_server(opts.metrics_port, opts.metrics_address, registry)
        except OSError as exc:
            busy = exc.errno == errno.EADDRINUSE
            raise LaunchError(
                f"--metrics-port {opts.metrics_port}: cannot listen on {opts.metrics_address}:"
                f"{opts.metrics_port}: {'the port is in use' if busy else exc.strerror or exc}",
                hint="pass another --metrics-port, or 0 for a free one") from None
        self.port = self.httpd.server_address[1]
        self.written: list[Path] = []

    @property
    def target(self) -> str:
        """Where a server scrapes it: the address it listens on, this machine's name where that is every address."""
        import socket

        host = self.opts.metrics_address
        host = socket.getfqdn() if host in ("", "0.0.0.0", "::") else host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def started(self, request) -> str:
        record = [{"targets": [self.target], "labels": {"run_id": request.run_id, "job": "podrun"}}]
        text = json.dumps(record, indent=1) + "\n"
        places = [Path(request.run_dir) / TARGETS]
        if self.opts.metrics_sd_dir is not None:
            places.append(Path(self.opts.metrics_sd_dir) / f"podrun-{request.run_id}.json")
        for p in places:
            safefs.write_file(p, text, "Prometheus target file", mode=SD_MODE)
            self.written.append(p)
        return f"metrics on http://{self.target}/metrics"

    def recorded(self, summary) -> None:
        self.final_at = time.monotonic()

    def linger(self) -> None:
        """A server that scrapes this endpoint gets one visit after the run's last record, so that its figures end
        equal to summary.json's: the endpoint waits up to one and a half of its scrape intervals (at most
        LINGER_MAX_S); one never scraped twice is not waited for."""
        c = self.collector
        with c.scraped:
            if len(c.scrapes) < 2 or self.final_at is None:
                return
            deadline = time.monotonic() + min(1.5 * (c.scrapes[1] - c.scrapes[0]), LINGER_MAX_S)
            while c.scrapes[-1] < self.final_at and time.monotonic() < deadline:
                c.scraped.wait(max(deadline - time.monotonic(), 0.01))

    def close(self) -> None:
        if self.httpd is None:
            return
        self.linger()
        for p in self.written:
            with contextlib.suppress(OSError):
                os.unlink(p)
        self.written = []
        httpd, self.httpd = self.httpd, None
        httpd.shutdown()
        httpd.server_close()

"""`podrun launch`: parse, build the launch request, print it (--dry-run) or run and supervise it."""
from __future__ import annotations

import contextlib
import os
import sys

import click

from podrun.cli import types as t

from podrun.cli.engine_options import engine_options
from podrun.cli.network_options import network_options
from podrun.cli.options import PLAN_OPTION_NAMES, PlanOptions, complete_recipes, plan_options, stacked
from podrun.cli.console import Console, notice_line, print_dry_run, say_outcome
from podrun.cli.watch_options import watch_for, watch_options
from podrun.errors import LaunchError
from podrun.launch.transports import transport_choices


# --help's sections, in order: every option of `podrun launch` is declared inside one (``section``), which both
# titles it in --help-all and says which part of LaunchOptions it fills. podrun's own come first, torchrun's last
# (those that map to a podrun option are shown beside it as its alias).
TORCHRUN, COMMON, RESTARTS, HANGS, TRANSPORTS, ENGINES, OUTPUT = (
    "torchrun's options (docs/launch.md)", "The plan: cluster, hosts, batch",
    "Restarts and elastic runs (docs/elastic.md)", "When a run hangs (docs/hangs.md)", "Transports",
    "Engines (poprun, horovod)", "Output and the run directory")
LIVE = "Live metrics and TensorBoard (docs/metrics.md)"
SECTIONS = (COMMON, RESTARTS, HANGS, TRANSPORTS, ENGINES, OUTPUT, LIVE, TORCHRUN)
# the short --help: the options most runs use, by parameter name, under a title each, podrun's first
SHORT_HELP = (
    (COMMON, ("cluster", "pod", "nodes", "hosts_opt", "hostfile", "devices_per_host", "global_batch", "env_items")),
    ("A script or command (as torchrun's)", ("module", "no_python", "standalone", "master_addr", "master_port")),
    (RESTARTS, ("max_restarts", "elastic_min", "resume_run")),
    (HANGS, ("hang_timeout",)),
    (OUTPUT, ("dry_run", "as_json", "runs_dir", "run_id")),
)
# torchrun's names for podrun's options (podrun.launch.torchrun_map maps them), shown in --help as aliases
TORCHRUN_ALIASES = {"nodes": "--nnodes", "devices_per_host": "--nproc-per-node", "grace": "--shutdown-timeout",
                    "cpu_bind": "--numa-binding"}
SECTION_ATTR = "podrun_section"
# podrun launch's options that name the run directory: a resume's own run id and runs dir replace them
RUN_DIR_OPTIONS = ("run_id", "runs_dir", "resume_run", "log_dir")
# torchrun's options that are podrun's own too (declared in the torchrun section, filling other parts)
TORCHRUN_OWN = ("module", "no_python", "run_path", "max_restarts", "master_addr", "master_port")


def section(title: str, *decorators):
    """Apply click option decorators (single options, or blocks such as plan_options) and title every option
    they add with ``title``."""
    def apply(f):
        before = len(getattr(f, "__click_params__", ()))
        f = stacked(*decorators)(f)
        for param in f.__click_params__[before:]:
            setattr(param, SECTION_ATTR, title)
        return f
    return apply


def in_section(ctx, title: str, kw: dict) -> dict:
    """The values of the options titled ``title``, by name."""
    return {p.name: kw[p.name] for p in ctx.command.params if getattr(p, SECTION_ATTR, None) == title}


class LaunchCommand(click.Command):
    """Records whether the user wrote ``-- TARGET`` (click drops a leading ``--``) and how each option was spelled
    (``--nproc_per_node`` or ``--nproc-per-node``, for messages in the user's words); --help in sections."""

    def parse_args(self, ctx, args):
        raw = self.expand_prefixes(list(args), frozenset(ctx.help_option_names))
        ctx.meta["podrun.argv"] = list(raw)
        try:
            rest = super().parse_args(ctx, list(raw))
        except click.BadParameter as exc:      # a bad value: one paragraph naming the option, no usage block
            given = {w.split("=", 1)[0] for w in raw}
            said = next((o for o in (*exc.param.opts, *exc.param.secondary_opts) if o in given), None) \
                if exc.param is not None else None
            raise LaunchError(f"{said or exc.param_hint or 'an option'}: {exc.message}",
                              hint="podrun launch --help says what each option takes") from None
        target = list(ctx.params.get("args") or ())
        ctx.meta["podrun.dashdash"] = raw.count("--") > target.count("--")
        names = {o: p.name for p in self.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
        words = (word.split("=", 1)[0] for word in raw[:len(raw) - len(target)])
        ctx.meta["podrun.spelled"] = {names[name]: name for name in words if name in names}
        return rest

    def shell_complete(self, ctx, incomplete):
        """An option after the target is the target's own: a recipe's options (podrun.specs.recipe_args), none for
        a script or command (``podrun launch recipes/resnet18_cifar10 --da<Tab>``: --data, not --data-interface)."""
        target = ctx.params.get("args") or ()
        if not target or not incomplete.startswith("-"):
            return super().shell_complete(ctx, incomplete)
        from click.shell_completion import CompletionItem

        from podrun.errors import PodrunError
        from podrun.specs import find_recipe_dir
        from podrun.specs.recipe_args import option_table

        try:
            find_recipe_dir(target[0])
        except PodrunError:
            return []
        return [CompletionItem(o) for o in option_table() if o.startswith(incomplete) and "_" not in o]

    def expand_prefixes(self, args: list[str], exact: frozenset[str] = frozenset()) -> list[str]:
        """``args`` with each option before the target written in full where it is an unambiguous prefix of one
        option (``--nproc_per_nod=2``, ``--max-rest 1``), as torchrun's argparse reads them; an ambiguous or unknown
        one is left for the "no such option" error, and ``exact`` (--help) as it is."""
        params = {o: p for p in self.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}
        out = []
        i = 0
        while i < len(args):
            word = args[i]
            if word == "--" or not word.startswith("-"):
                return out + args[i:]
            name, eq, value = word.partition("=")
            if name.startswith("--") and name not in params and name not in exact:
                starting = [o for o in params if o.startswith(name)]       # in the user's spelling (- or _)
                if len({params[o].name for o in starting}) == 1:
                    name = starting[0]
                    word = name + eq + value
            out.append(word)
            p = params.get(name) or next((q for q in self.params if name in q.opts), None)
            takes = isinstance(p, click.Option) and not p.is_flag and not p.count
            if takes and not eq and i + 1 < len(args):
                out.append(args[i + 1])
                i += 1
            i += 1
        return out

    def format_options(self, ctx, formatter):
        """--help: SHORT_HELP's options and a pointer to --help-all; --help-all: every option in SECTIONS."""
        every = ctx.meta.get("podrun.help_all", False)
        records = {}
        for param in self.get_params(ctx):
            # options only: click 8.5 gives an argument a help record too (its metavar, no text)
            record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
            if record is not None:
                records[param.name] = (getattr(param, SECTION_ATTR, None), _row(param.name, record, every))
        if every:
            groups = [(title, [n for n, (t, _) in records.items() if t == title]) for title in SECTIONS]
        else:
            groups = [(title, [n for n in names if n in records]) for title, names in SHORT_HELP]
        for title, names in groups:
            if names:
                with formatter.section(title):
                    formatter.write_dl([records[n][1] for n in names])
        with formatter.section("Help"):
            formatter.write_dl([records[n][1] for n, (t, _) in records.items() if t is None])
        if not every:
            more = len(records) - sum(len(names) for _, names in groups) - sum(t is None for t, _ in records.values())
            formatter.write_paragraph()
            formatter.write(click.wrap_text(f"{more} more options (transports, engines, liveness, CPU binding, all "
                                            "of torchrun's), each in full: podrun launch --help-all",
                                            formatter.width) + "\n")


def _row(name: str, record: tuple[str, str], every: bool) -> tuple[str, str]:
    """An option's --help row with torchrun's name for it after podrun's (``--nodes, --nnodes N``); in the short
    --help without the underscored spellings and with the help's first sentence only."""
    *names, last = record[0].split(", ")
    flag, _, metavar = last.partition(" ")
    names = [n for n in (*names, flag, TORCHRUN_ALIASES.get(name)) if n and (every or "_" not in n)]
    text = record[1] if every else record[1].split(". ", 1)[0].rstrip(".") + "."
    return ", ".join(names) + (f" {metavar}" if metavar else ""), text


def _help_all(ctx, _param, value) -> None:
    if value and not ctx.resilient_parsing:
        ctx.meta["podrun.help_all"] = True
        click.echo(ctx.get_help(), color=ctx.color)
        ctx.exit()


def _tr(*names, **kw):
    """One of torchrun's options, spelled as torchrun spells it (both - and _); its parameter is torchrun's dest."""
    dest = names[-1].lstrip("-").replace("-", "_")
    underscored = ["--" + n[2:].replace("-", "_") for n in names if n.startswith("--") and "-" in n[2:]]
    return click.option(*dict.fromkeys([*names, *underscored]), dest, **kw)


REFUSED = "Refused, saying what to use"
# torchrun 2.x's options, spelled as torchrun spells them, each mapped or refused by podrun.launch.torchrun_map (the
# table in docs/launch.md); each is read from PET_<NAME> when not given
torchrun_options = stacked(
    _tr("--nproc-per-node", metavar="N|auto|cpu|gpu",
        help="Workers per host (podrun's --devices-per-host). Left out: 1 for a script, module or command, as "
             "torchrun's (the cluster spec's with --cluster, a recipe's plan for a recipe)."),
    _tr("--nnodes", metavar="N|MIN:MAX", help="Hosts (--nodes N); MIN:MAX: --nodes MAX --elastic MIN, or the hosts "
        "there are when fewer than MAX (one host: --nnodes 1:2 runs on it)."),
    _tr("--standalone", is_flag=True,
        help="One host, a free rendezvous port (--nodes 1 --master-port 0)."),
    _tr("--rdzv-backend", metavar="c10d|static", help="c10d or static: the same here, podrun's rendezvous (a "
        "TCP store on instance 0's agent); others are refused."),
    _tr("--rdzv-endpoint", metavar="HOST[:PORT]",
        help="--master-addr HOST --master-port PORT (default port 29400; 0: a free port, for jobs stacked on one "
             "host)."),
    _tr("--rdzv-id", metavar="ID", help="Every worker's TORCHELASTIC_RUN_ID; the run directory is ID-TIMESTAMP "
        "(as torchrun's log dir)."),
    _tr("--rdzv-conf", metavar="K=V,...", help="keep_alive_interval (--heartbeat), keep_alive_max_attempt "
        "(--heartbeat-misses); the timeouts are taken; is_host and rank are refused."),
    _tr("--max-restarts", type=t.RESTARTS, default=None,
        help="Restart the whole run after a failure (default 0; with --elastic one per host it can lose)."),
    _tr("--monitor-interval", metavar="SECONDS", help="Taken: podrun's agent notices a worker's end within a few hundredths of a second."),
    _tr("--start-method", metavar="spawn|fork|forkserver",
        help="Taken: workers are new processes, as torchrun's for a script (--warm forks restarts)."),
    _tr("--event-log-handler", metavar="NAME", help="Taken, any handler: podrun records the run's events in the run "
        "directory (summary.json) and calls no torchrun event handler."),
    _tr("--role", metavar="NAME", help="Every worker's ROLE_NAME (default: default)."),
    _tr("-m", "--module", is_flag=True,
        help="Run the target as a Python module (--python -m MODULE ARGS)."),
    _tr("--no-python", is_flag=True,
        help="Run the target as a command, not with --python."),
    _tr("--run-path", is_flag=True, help="Run the target as a Python file (--python PATH ARGS)."),
    _tr("--log-dir", metavar="DIR", help="--runs-dir DIR: a run's logs in DIR/RUN_ID/, each rank's streams (with "
        "--redirects/--tee) in DIR/RUN_ID/attempt_N/RANK/stdout.log and stderr.log, as torchrun lays them out."),
    _tr("-r", "--redirects", metavar="0-3|LR:0-3,...", help="These streams (1 stdout, 2 stderr, 3 both) of each "
        "(or the named) local rank go to its files under attempt_N/RANK/ only, off the console, as torchrun's."),
    _tr("-t", "--tee", metavar="0-3|LR:0-3,...", help="These streams go to each rank's files under attempt_N/RANK/ "
        "and to the console, as torchrun's."),
    _tr("--local-ranks-filter", metavar="R,...", help="Show only these local ranks' output on the console (the "
        "run directory keeps all)."),
    _tr("--duplicate-stdout-filters", metavar="F,...", help="Refused unless empty (grep instance-N.log)."),
    _tr("--duplicate-stderr-filters", metavar="F,...", help="Refused unless empty (grep instance-N.log)."),
    _tr("--node-rank", metavar="N", help="With --nnodes N (N > 1) and --master-addr: one podrun per node, node rank 0 "
        "the controller, the others its joined agents (PODRUN_JOIN_KEY); alone refused: podrun places every host's "
        "instance itself."),
    _tr("--master-addr", help="Rendezvous address (default: the host of instance 0)."),
    _tr("--master-port", type=t.PORT, default=None,
        help="Rendezvous port, every worker's MASTER_PORT. 0: podrun picks a free port (the default on this "
             "machine, like torchrun --standalone); with hosts elsewhere the default is 29500."),
    _tr("--local-addr", metavar="ADDR", help="Taken: podrun reaches each host by its name in --hosts and the "
        "workers meet at --master-addr (--data-interface picks their network)."),
    _tr("--logs-specs", metavar="NAME", help=f"{REFUSED} (--runs-dir)."),
    _tr("--numa-binding", metavar="MODE", help="--cpu-bind auto (node, socket, exclusive, core-complex)."),
    _tr("--signals-to-handle", metavar="SIG,...", help="Taken when within the signals podrun passes on to the "
        "workers (SIGTERM,SIGINT,SIGHUP,SIGUSR1: Slurm's preemption warning)."),
    _tr("--shutdown-timeout", metavar="SECONDS", help="--grace SECONDS."),
    _tr("--virtual-local-rank", is_flag=True, help="Every worker's LOCAL_RANK is 0 and CUDA_VISIBLE_DEVICES its own "
        "device, as torchrun's."),
)


@click.command(cls=LaunchCommand, context_settings={
    "ignore_unknown_options": True, "allow_extra_args": True, "allow_interspersed_args": False})
@click.option("--help-all", is_flag=True, expose_value=False, is_eager=True, callback=_help_all,
              help="Show every option (torchrun's all) and exit.")
@section(TORCHRUN, torchrun_options)
@section(COMMON, plan_options,
         click.option("--env", "env_items", multiple=True, metavar="NAME[=VALUE]",
                      help="Set a variable for every worker (repeatable); NAME alone passes podrun's own value. "
                           "Values never go on a command line (the agents get them over stdin or the launcher's "
                           "environment)."),
         click.option("--calibration", metavar="FILE|NAME",
                      help="Plan a recipe with what `podrun calibrate` measured (a file, or a name under "
                           "RUNS_DIR/calibrations): its largest local batch, rate and all-reduce (docs/calibrate.md)."))
@section(RESTARTS,
         click.option("--resume", "resume_run", metavar="RUN",
                      help="Run RUN (a run id under --runs-dir, or a run directory) again with its own recorded "
                           "arguments, into its own directory, from its newest good state (as `podrun resume RUN`)."),
         click.option("--elastic", "elastic_min", type=t.NODES, metavar="MIN",
                      help="On a restart, drop the failed host (or take a spare) and re-plan on the hosts left at the "
                           "same global batch, down to MIN hosts; the run ends when no host count >= MIN keeps it "
                           "exactly."),
         click.option("--spare-hosts", metavar="H,...", help="Hosts that take a lost host's place in an --elastic run."),
         click.option("--warm/--no-warm", default=True, show_default=True,
                      help="Over local or ssh, in a run that can restart (--max-restarts > 0, --elastic) or where a "
                           "host runs several workers of a program that imports torch: a zygote per host that has "
                           "torch imported and forks the workers (the first attempt's too, where a host runs several; "
                           "later attempts'), so a worker skips the interpreter start and torch import "
                           "(docs/launch.md, docs/elastic.md)."))
@section(HANGS, watch_options,
         click.option("--straggler-timeout", type=t.STRAGGLER, metavar="SECONDS",
                      help="Once a worker has exited 0, the others have this long to end; then they are ended and "
                           "the run fails (exit 124) naming the ranks still running. Default: no bound."))
@section(TRANSPORTS,
         click.option("--transport", type=click.Choice(transport_choices()),
                      help="How instances start (default: local for this machine, srun in Slurm, else ssh)."),
         network_options,
         click.option("--ssh-config", type=click.Path(dir_okay=False),
                      help="OpenSSH client config (default ~/.ssh/config)."),
         click.option("--no-host-key-check", is_flag=True,
                      help="Accept unknown host keys (explicit opt-out of known_hosts)."),
         click.option("--python", "python_", help="Python on the hosts (default: this one, sys.executable)."),
         click.option("--workdir", help="Working directory on the hosts (default: the current directory)."),
         click.option("--agent-store/--no-agent-store", "--store-relay/--no-store-relay", "agent_store", default=True,
                      show_default=True,
                      help="Rank 0's agent holds the rendezvous port from the start and serves torch's TCPStore on "
                           "it (TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun), so no worker waits in torch's "
                           "reconnect backoff. Off: rank 0 hosts the store itself (for programs that serve their own "
                           "MASTER_PORT)."),
         click.option("--max-concurrency", type=t.CONCURRENCY, default=64, show_default=True,
                      help="SSH handshakes in flight at once (commands over open connections are not limited)."),
         click.option("--heartbeat", type=t.HEARTBEAT, default=None, metavar="SECONDS",
                      help="Seconds between heartbeats, both ways: the controller to each agent and each agent to "
                           "the controller (default 0.25 up to 16 hosts, 0.25 x hosts/16 beyond, at most 5; the cluster "
                           "spec's heartbeat)."),
         click.option("--heartbeat-misses", type=t.MISSES, default=None, metavar="N",
                      help="Heartbeats missed in a row before a host is declared lost, and before an agent ends its "
                           "workers for want of its controller (default 4; the cluster spec's heartbeat_misses). The "
                           "bound is --heartbeat x N: 1 s by default up to 16 hosts."),
         click.option("--keepalive", type=t.KEEPALIVE, default=None, metavar="SECONDS",
                      help="The bound itself: seconds of silence after which a host is declared lost (--heartbeat x "
                           "--heartbeat-misses; alone it means 4 missed heartbeats of SECONDS/4)."),
         click.option("--join-address", metavar="HOST[:PORT]",
                      help="Where agents that join reach this controller (srun's agents; the copies of `srun podrun "
                           "launch`): HOST (default: this machine's address on the route to the first other host, "
                           "else its host name; node rank 0's for copies) and PORT (default: a free one; 29400 for "
                           "copies)."),
         click.option("--join-window", type=t.JOIN_WINDOW, default=None, metavar="SECONDS",
                      help="Seconds each agent that joins has to join; then its host is lost, named (default 60)."),
         click.option("--mpi-ranks", is_flag=True,
                      help="Under --transport mpirun: one MPI rank per worker, each under an agent of its own, so "
                           "the workers form one MPI world (mpi4py; the horovod engine always). Default: one agent "
                           "per host, started by mpirun, that joins this controller and starts the host's workers."),
         click.option("--grace", type=t.GRACE, default=None,
                      help="Seconds a worker gets to end: after a Ctrl-C (SIGINT, SIGHUP, SIGUSR1) passed on, before "
                           "SIGTERM (default 30, torchrun's), and after SIGTERM (a failed run's teardown), before "
                           "SIGKILL (default 5); torchrun's --shutdown-timeout."),
         click.option("--no-preflight", is_flag=True, help="Skip the checks on every host before starting."),
         click.option("--cpu-bind", metavar="auto|none|LIST", default=None,
                      help="Bind each worker to its cores: auto (each local rank its share of the host's cores, in "
                           "its NUMA domain), none (default), or LIST: one core set per local rank (0-3,4-7)."))
@section(ENGINES, engine_options)
@section(OUTPUT,
         click.option("--dry-run", is_flag=True, help="Print the exact commands and env, run nothing: every host's and "
                      "worker's for a small run, a summary that fits a screen at scale (the first and last in full)."),
         click.option("--dry-run-all", is_flag=True, help="As --dry-run, every host's command and worker's env in full."),
         click.option("--dry-run-host", metavar="HOST", help="As --dry-run, HOST's commands and workers' env in full."),
         click.option("--json", "as_json", is_flag=True,
                      help="Print a summary JSON on stdout at the end (output goes to stderr)."),
         click.option("--prefix/--no-prefix", default=True, show_default=True,
                      help="Each worker line on the console starts with [instance:local_rank host]; --no-prefix "
                           "prints the workers' lines as they wrote them, as torchrun does (the run directory's logs "
                           "are unchanged)."),
         click.option("--only-output-from-instance", type=t.INSTANCE_INDEX,
                      help="Show stdout of this instance only (errors from all)."),
         click.option("--runs-dir", default=None, help="Where run directories go (default: runs)."),
         click.option("--run-id", help="Name of the run directory (default: a timestamp)."))
@section(LIVE,
         click.option("--metrics-port", type=t.PORT, default=None, metavar="PORT",
                      help="Serve the run's live state as OpenMetrics on PORT (0: a free one) for Prometheus; its "
                           "address is in the start line and the run directory's prometheus-targets.json."),
         click.option("--metrics-address", default="127.0.0.1", show_default=True, metavar="ADDR",
                      help="The address the metrics endpoint listens on (docs/security.md: what it shows)."),
         click.option("--metrics-sd-dir", metavar="DIR",
                      help="Also write the run's Prometheus file_sd target file in DIR (podrun-RUN_ID.json)."),
         click.option("--tensorboard", is_flag=True,
                      help="Write TensorBoard event files in the run directory's tensorboard/ (tensorboard --logdir "
                           "runs/)."))
@click.argument("args", nargs=-1, type=click.UNPROCESSED, shell_complete=complete_recipes,
                metavar="SCRIPT.py [ARGS]... | -m MODULE [ARGS]... | RECIPE [ARGS]... | -- COMMAND [ARGS]...")
@click.pass_context
def launch(ctx, args, **kw):
    """Launch SCRIPT.py as torchrun would (or -m MODULE, --no-python COMMAND), a podrun RECIPE, or -- COMMAND,
    on the plan's hosts; torchrun's options are taken as torchrun's (and from PET_ variables).

    \b
      podrun launch --nproc-per-node 2 train.py --epochs 1     # as torchrun
      podrun launch --hosts h1,h2 --nproc-per-node 2 train.py  # two hosts
      podrun launch recipes/resnet18_cifar10 --data digits     # a recipe
      podrun launch --hosts h1,h2 --devices-per-host 2 -- ./run.sh --epochs 1
    """
    from podrun.cli.render import print_json
    from podrun.launch.prepare import prepare_launch
    from podrun.launch.run import dry_run_record, execute

    opts = launch_options(ctx, tuple(args), kw)
    out = opts.output
    if opts.restarts.resume_run is not None:
        _resume(ctx, opts.restarts.resume_run, out.runs_dir, out.dry_run)
        return
    resuming = (ctx.obj or {}).get("podrun.resume") if isinstance(ctx.obj, dict) else None
    if resuming is not None and (out.run_id, os.path.realpath(out.runs_dir or "")) != \
            (os.path.basename(resuming), os.path.dirname(resuming)):
        raise click.UsageError(f"a resume of {resuming} runs into it, and its recorded arguments name another "
                               f"run directory: {out.runs_dir}/{out.run_id}")
    opts = _as_copy(opts)                # one of several copies (srun podrun launch, --node-rank)?
    prepared = prepare_launch(opts)
    request, out = prepared.request, opts.output
    watch = watch_for(opts.hangs, prepared.recipe, prepared.cluster)
    notes = [*prepared.notes, *([prepared.long_run] if prepared.long_run else [])]
    if out.dry_run:
        record = {**dry_run_record(request), "max_restarts": request.max_restarts, "notes": notes}
        print_json(record) if out.as_json else print_dry_run(record, out.dry_run_shows)
        return
    for note in notes:
        print(f"podrun: {note}", file=sys.stderr, flush=True)
    if prepared.long_run and sys.stdin.isatty() and sys.stderr.isatty() and not click.confirm(
            "podrun: start it anyway?", default=False, err=True):
        print("podrun: not started", file=sys.stderr)
        sys.exit(1)
    from podrun.cli.render import ProgressView
    from podrun.cli.watch_options import live_console

    observer = _live_views(opts.live)
    view = ProgressView(live_console(out.as_json))
    try:
        from podrun.launch.resume import record

        console = Console(request.plan, out.as_json, prepared.local_ranks,
                           bool((ctx.find_root().obj or {}).get("debug")), view, out.prefix)
        _, summary = execute(request, sink=console, notice=console.notice,
                             only_output_from=out.only_output_from_instance, elastic=prepared.elastic,
                             watch=watch, progress=view, resuming=resuming is not None,
                             launch_record=record(ctx.meta.get("podrun.argv", []), os.getcwd()),
                             said=lambda s: say_outcome(s, request, view, console), observer=observer)
    finally:
        view.close()
        observer.close()
    if out.as_json:
        with contextlib.suppress(OSError):
            print_json(summary.to_dict())
    sys.exit(summary.exit_code)   # main.py turns SystemExit into the exit code


def _live_views(live):
    """The run's observers (podrun.launch.observe) that ``live`` (podrun.launch.options.LiveOptions) asks for: its
    live state (podrun top's), the metrics endpoint when --metrics-port is given (bound now: a port in use ends the
    launch before it starts), TensorBoard files with --tensorboard; a view whose optional package is missing is said
    in one line and left out."""
    from podrun.launch.observe import Observers
    from podrun.live.state import LiveState

    from podrun.live import importable, prom, tensorboard

    state = LiveState()
    views = [state]
    for asked, view, make in ((live.metrics_port is not None, prom, lambda: prom.MetricsServer(live, state)),
                              (live.tensorboard, tensorboard, tensorboard.EventFiles)):
        if asked and importable(view.NEEDS):
            views.append(make())
        elif asked:
            notice_line(view.MISSING.removeprefix("podrun: "))
    return Observers(views, notice_line)


def _as_copy(opts):
    """``opts`` for the one podrun of a run; copy 0's of one podrun per node (the controller); a later copy becomes
    its node's agent here and does not return (podrun.launch.copies)."""
    from podrun.launch.copies import become_agent, controller_options, detect

    tr, net = opts.torchrun, opts.transports
    copy = detect(os.environ, tr.node_rank, tr.nnodes, net.master_addr, opts.output.run_id or tr.rdzv_id,
                  net.join_address)
    if copy is None:
        return opts
    if copy.rank > 0 and not opts.output.dry_run:   # --dry-run shows copy 0's run
        become_agent(copy, net.env_items, net.join_window)
    return controller_options(copy, opts)


def launch_options(ctx, args: tuple[str, ...], kw: dict, environ=None):
    """LaunchOptions from the parsed command line and torchrun's PET_ variables (``environ``, default os.environ;
    a flag wins over its PET_ variable): each section's values into its part, once."""
    from click.core import ParameterSource

    from podrun.launch.options import (EngineOptions, HangOptions, LaunchOptions, LiveOptions, PoprunOptions,
                                       RestartOptions, TargetOptions, TransportOptions)
    from podrun.launch.request import SSHOptions
    from podrun.launch.torchrun_cli import TorchrunOptions, pet_name, pet_values
    from podrun.launch.torchrun_map import pet_own_options

    common, tr = in_section(ctx, COMMON, kw), in_section(ctx, TORCHRUN, kw)
    hangs, net, eng = in_section(ctx, HANGS, kw), in_section(ctx, TRANSPORTS, kw), in_section(ctx, ENGINES, kw)
    given = {p.name for p in ctx.command.params if ctx.get_parameter_source(p.name) == ParameterSource.COMMANDLINE}
    pet = pet_values(os.environ if environ is None else environ, given)
    spelled = {**{name: pet_name(name) for name in pet}, **ctx.meta.get("podrun.spelled", {})}
    own = {k: tr.pop(k) for k in TORCHRUN_OWN}
    for name in ("module", "no_python", "run_path"):
        own[name] = bool(own[name] or pet.pop(name, False))
    pet_own = pet_own_options({k: pet.pop(k) for k in ("max_restarts", "master_addr", "master_port") if k in pet},
                              spelled)
    tr.update({k: v for k, v in pet.items() if tr.get(k) in (None, False)})
    names = frozenset(o for p in ctx.command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-"))
    # the transport section's options go whole into TransportOptions, but for the ssh client's and two named otherwise
    ssh = SSHOptions(config_path=net.pop("ssh_config"), host_key_check=not net.pop("no_host_key_check"),
                     max_concurrency=net.pop("max_concurrency"), client=net.pop("ssh_client"))
    net.update(python=net.pop("python_"), preflight=not net.pop("no_preflight"))
    return LaunchOptions(
        target=TargetOptions(args=args, dashdash=bool(ctx.meta.get("podrun.dashdash")), module=own["module"],
                             no_python=own["no_python"], run_path=own["run_path"], option_names=names),
        torchrun=TorchrunOptions(**tr, spelled=spelled),
        pet_own=pet_own,
        plan=PlanOptions(**{k: common[k] for k in PLAN_OPTION_NAMES}),
        engine=EngineOptions(eng.pop("engine"), eng.pop("mpi_args"), PoprunOptions(**eng)),
        hangs=HangOptions(hang_timeout=hangs["hang_timeout"], on_hang=hangs["on_hang"]),
        transports=TransportOptions(**net, ssh=ssh, master_addr=own["master_addr"], master_port=own["master_port"],
                                    env_items=tuple(common["env_items"])),
        restarts=RestartOptions(straggler_timeout=hangs["straggler_timeout"], max_restarts=own["max_restarts"],
                                **in_section(ctx, RESTARTS, kw)),
        output=_output_options(in_section(ctx, OUTPUT, kw)),
        calibration=common.get("calibration"),
        live=LiveOptions(**in_section(ctx, LIVE, kw)),
    )


def _output_options(given: dict):
    """OutputOptions from the output section: --dry-run-all and --dry-run-host are --dry-run showing more."""
    from podrun.launch.options import OutputOptions

    every, host = given.pop("dry_run_all"), given.pop("dry_run_host")
    shows = "all" if every else host or "auto"
    return OutputOptions(**{**given, "dry_run": given["dry_run"] or shows != "auto"}, dry_run_shows=shows)


def _resume(ctx, run: str, runs_dir: str | None, dry_run: bool) -> None:
    """`podrun launch --resume RUN`: the run's recorded `podrun launch` arguments, run again in its working
    directory into its own run directory (any other arguments given are refused)."""
    from podrun.launch.resume import relaunch

    given = [a for a in ctx.meta.get("podrun.argv", []) if a not in ("--resume", run) and not a.startswith("--resume=")]
    extra = [a for a in given if a not in ("--runs-dir", runs_dir, "--dry-run") and not a.startswith("--runs-dir=")]
    if extra:
        raise click.UsageError(f"--resume runs the run's own recorded arguments; these cannot be added: "
                               f"{' '.join(extra)}")
    takes = {o: (p.name in RUN_DIR_OPTIONS, not (p.is_flag or p.count)) for p in launch.params
             if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}
    argv, cwd, run_dir = relaunch(run, runs_dir, takes)
    run_dir = run_dir.resolve()            # before the chdir
    notice_line(f"resuming run {run_dir.name} in {cwd}: podrun launch {' '.join(argv[4:])}")
    try:
        os.chdir(cwd)
    except OSError as exc:
        raise LaunchError(f"cannot enter the run's working directory {cwd}: {exc.strerror or exc}") from None
    obj = dict(ctx.obj) if isinstance(ctx.obj, dict) else {}
    obj["podrun.resume"] = str(run_dir)
    rc = launch.main(args=(["--dry-run"] if dry_run else []) + argv, prog_name="podrun launch",
                     standalone_mode=False, obj=obj)
    sys.exit(rc if isinstance(rc, int) else 0)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("run")
@click.option("--runs-dir", default=None, help="Where run directories are (default: runs).")
@click.option("--dry-run", is_flag=True, help="Print the commands the resume would run, run nothing.")
def resume(run, runs_dir, dry_run):
    """Resume RUN (a run id under --runs-dir, or a run directory) from its newest good state.

    Runs the run's own recorded `podrun launch` arguments again, in the directory it was launched from,
    into the same run directory (its attempts are recorded with the earlier ones); refused while another
    process holds the run.
    """
    argv = ["--resume", run] + (["--runs-dir", runs_dir] if runs_dir is not None else []) + \
        (["--dry-run"] if dry_run else [])
    rc = launch.main(args=argv, prog_name="podrun launch", standalone_mode=False)
    sys.exit(rc if isinstance(rc, int) else 0)

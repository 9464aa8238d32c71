"""In a process the zygote forked: becoming the worker (its descriptors, env, cwd, stdio) and running it as __main__."""
from __future__ import annotations

import fcntl
import functools
import io
import os
import runpy
import signal
import sys
import traceback

from podrun.host.stackdump import SITE_DIR
from podrun.host.workers import bind_worker
from podrun.proctl import PR_SET_PDEATHSIG, prctl
from podrun.wire.worker_env import STACK_DIR_ENV

WARM_ENV = "PODRUN_WARM"        # in a worker the zygote forked: the zygote's pid
HIGH_FD = 256            # a forked process gets the fds it is told of by name at or above this number
_KEPT: list = []         # the process groups destroy_process_group destroyed: kept until os._exit (see below)
SITE_FILE = os.path.join(SITE_DIR, "sitecustomize.py")


def _stdio(unbuffered: bool) -> None:
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        f = io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding="utf-8",
                             errors="backslashreplace" if fd == 2 else "strict",
                             line_buffering=fd == 2, write_through=unbuffered)
        setattr(sys, name, f)
        setattr(sys, f"__{name}__", f)


def become_worker(req: dict, fds: list[int], zygote_pid: int, preloaded: dict[str, str] | None = None) -> int:
    """In the forked worker: become the worker, run the script; returns its exit code. ``preloaded``: what the
    zygote's imports set in its environment, which the worker's own imports would have set (the request's env
    wins)."""
    os.setsid()
    signal.set_wakeup_fd(-1)                       # the zygote's wake-up on its children's exits is not the worker's
    prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))   # the zygote's death ends this process
    if os.getppid() != zygote_pid:
        return 128 + int(signal.SIGKILL)
    kind, target, args, unbuffered = req["target"]
    env = {**(preloaded or {}), **req["env"], WARM_ENV: str(zygote_pid)}
    _take_fds(req["fds"], fds, env)
    unbuffered = unbuffered or bool(env.get("PYTHONUNBUFFERED"))
    _stdio(unbuffered)
    os.environ.clear()
    os.environ.update(env)
    cores = bind_worker(env)
    if cores is not None:            # --cpu-bind: before the worker's first thread
        os.sched_setaffinity(0, cores)
    os.chdir(req["cwd"])
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(s, signal.SIG_DFL)
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    # sys.path[0] as python puts it: the script's directory, the working directory (-m), or '' (-c: which a
    # helper's boot, podrun.pystart, takes off)
    first = {"script": os.path.dirname(os.path.abspath(target)), "module": os.getcwd()}.get(kind, "")
    sys.path[:] = [first, *extra, *sys.path[1:]]
    if env.get(STACK_DIR_ENV) and os.path.exists(SITE_FILE):
        globals()["_stack_site"] = runpy.run_path(SITE_FILE, run_name="podrun_stack_site")
    torch = sys.modules.get("torch")
    threads = env.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    _keep_destroyed_groups(sys.modules.get("torch.distributed"))
    return _run_target(kind, target, args)


def _keep_destroyed_groups(dist) -> None:
    """Make ``destroy_process_group`` keep each group it destroys referenced until the process ends (by os._exit in
    ``podrun.proctl.exit_now``: their C++ teardown never runs). A gloo group's destructor joins its run-loop threads
    while the caller holds the GIL, and a run-loop thread still freeing its last work (whose saved thread-local
    state holds a Python object: the context backward stashes) waits for the GIL: freeing the group there (a DDP
    model dropped after destroy_process_group, or the group's last reference in it) deadlocks the worker at its end,
    seen in 6 of 12 forked 2-rank runs (docs/hangs.md, "A worker that hangs at exit")."""
    if dist is None or not hasattr(dist, "destroy_process_group"):
        return
    c10d = dist.distributed_c10d
    original = c10d.destroy_process_group

    @functools.wraps(original)
    def destroy_process_group(group=None):
        _KEPT.extend(list(getattr(getattr(c10d, "_world", None), "pg_map", ())) if group is None else [group])
        return original(group)
    dist.destroy_process_group = c10d.destroy_process_group = destroy_process_group


def _take_fds(targets: list, fds: list[int], env: dict[str, str]) -> None:
    """Put each descriptor the agent sent where it is told (fd 0, 1 or 2, or a variable naming its number, set in
    ``env``), moved at or above HIGH_FD first; stdin is /dev/null unless given."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, HIGH_FD) for fd in fds]
    for fd in fds:
        os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for where, fd in zip(targets, high):
        if isinstance(where, int):
            os.dup2(fd, where)
            os.close(fd)
        else:
            os.set_inheritable(fd, True)
            env[where] = str(fd)


def _run_target(kind: str, target: str, args: list[str]) -> int:
    """Run the script, module or ``-c`` code as ``__main__``; its exit code, as python's own."""
    try:
        if kind == "module":
            sys.argv = [target, *args]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        elif kind == "code":
            sys.argv = ["-c", *args]
            exec(compile(target, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = [target, *args]
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return (exc.code or 0) & 0xFF
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return 128 + int(signal.SIGINT)
    except BaseException:  # noqa: BLE001 - the worker's uncaught error, printed as python would
        traceback.print_exc()
        return 1
    return 0



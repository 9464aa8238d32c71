"""The local transport: each instance agent is a subprocess on this machine (the default cluster).

An agent notices its controller's death two ways: its stdin closes, and PR_SET_PDEATHSIG sends it
SIGTERM (not SIGKILL: it must live to end its workers and whatever they left behind).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess

from podrun.errors import LaunchError
from podrun.wire.probe import port_free
from podrun.proctl import die_with_parent, stat_fields
from podrun.launch.transports.base import InstanceHandle, PipedAgentHandle, Problem, Transport, busy_port_problem


def _terminal_copy() -> int | None:
    """A copy of podrun's own stdin for the worker of global rank 0 (as torchrun's workers inherit its
    stdin: ``breakpoint()`` and ``input()`` read the terminal or the pipe); None when podrun has no stdin."""
    try:
        return os.dup(0)
    except OSError:
        return None


class LocalHandle(PipedAgentHandle):
    """The agent, a child of this process: a stop is also the signal itself."""

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        super().terminate(sig)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    def close(self) -> None:
        super().close()
        self._merger.close()

    def busy_here(self) -> bool:
        """A thread of the agent runnable (R) or in the kernel (D): a loaded machine starves it, a lost one cannot
        be this one; stopped (T), a zombie or every thread asleep is silence that counts."""
        if self.proc.poll() is not None:
            return False
        try:
            tasks = os.listdir(f"/proc/{self.proc.pid}/task")
        except OSError:
            return False
        states = (stat_fields(f"{self.proc.pid}/task/{tid}") or [b""] for tid in tasks)   # [b""]: gone meanwhile
        return any(state[0] in (b"R", b"D") for state in states)


class LocalTransport(Transport):
    name = "local"

    def preflight(self) -> list[Problem]:
        req = self.request
        problems = []
        host = req.instances[0].host if req.instances else "localhost"
        if not os.path.isdir(req.workdir):
            problems.append(Problem(host, f"working directory {req.workdir} does not exist",
                                    "create it or pass --workdir"))
        if shutil.which(req.python) is None and not os.access(req.python, os.X_OK):
            problems.append(Problem(host, f"python {req.python} not found", "pass --python PATH"))
        for port in req.rendezvous_ports():
            if not port_free(port):
                problems.append(busy_port_problem(host, req, port))
        return problems

    def start(self) -> list[InstanceHandle]:
        req = self.request
        env = {**os.environ, **dict(req.env)}
        handles = []
        for inst in req.instances:
            stdin_fd = _terminal_copy() if inst.index == 0 else None   # the instance of global rank 0
            argv = req.agent_argv(inst.index, worker_stdin_fd=stdin_fd, lean=True)
            # preexec_fn: SIGTERM to the agent when this controller dies, also when it died before prctl
            try:
                proc = subprocess.Popen(argv, cwd=req.workdir, env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM),
                                        pass_fds=(*req.pass_fds(inst.index), *(() if stdin_fd is None else (stdin_fd,))))
            except OSError as exc:
                for h in handles:
                    h.kill()
                raise LaunchError(f"{inst.host}: cannot start the instance agent with {req.python}: "
                                  f"{exc.strerror}", hint="pass --python PATH") from None
            finally:
                if stdin_fd is not None:
                    os.close(stdin_fd)
            handles.append(LocalHandle(inst.index, inst.host, proc))
        return handles


"""In-memory snapshots of the training state: two shared-memory slots per host, a background writer, the recovery.

After a restart the ranks agree on the newest snapshot any of them holds and the lowest rank holding it
sends it to the ranks that do not.

A slot is ``slot-<k>.pt`` (the state, torch.save) and ``slot-<k>.json`` (its header: step and size),
the header written last and removed first: a slot counts only when its header names a data file of the
size it says. The writer alternates the slots, so a host holds its last two updates. torch is imported
only by the functions that need it (the agent removes a finished run's directory without it).
"""
from __future__ import annotations

import io
import json
import os
import shutil
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SLOTS = 2
# Test knob, for the fallback tests only: "HOST=STEP,..." makes the named hosts write no snapshot after STEP
# (0: none at all), so that the newest snapshot has a single holder. Unset in every real run.
TEST_UNTIL_ENV = "PODRUN_TEST_SNAPSHOT_UNTIL"
# Test knob: seconds every rank waits between agreeing and the transfer on restart 1 (a second failure then
# falls inside the recovery), after rank 0 printed "snapshot recovery: holding". Unset in every real run.
TEST_HOLD_ENV = "PODRUN_TEST_RECOVERY_HOLD_S"


def _data(d: Path, k: int) -> Path:
    return d / f"slot-{k}.pt"


def _header(d: Path, k: int) -> Path:
    return d / f"slot-{k}.json"


def held(directory: str | os.PathLike | None) -> list[tuple[int, int]]:
    """(step, slot) of this host's complete snapshots, newest first; [] without a directory."""
    if not directory:
        return []
    d, out = Path(directory), []
    for k in range(SLOTS):
        try:
            h = json.loads(_header(d, k).read_text())
            if _data(d, k).stat().st_size == h["bytes"]:
                out.append((int(h["step"]), k))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(out, reverse=True)


def remove(directory: str | os.PathLike | None) -> None:
    """Remove a host's snapshot directory, and the run's directory above it once no host's is left."""
    if not directory:
        return
    d = Path(directory)
    shutil.rmtree(d, ignore_errors=True)
    try:
        d.parent.rmdir()
    except OSError:
        pass


def drop_when_done(envs: list[dict[str, str]], code: int | None, ended: bool) -> None:
    """The agent's end (torch-free): remove its workers' snapshot directories when no restart will read them:
    the workers all succeeded (code 0), the run is being ended (``ended``: the agent got SIGINT or SIGTERM before
    any other reason to stop, or lost its controller, which then drops this host; a signal after a worker's
    failure is the teardown before a restart, which reads them), or this was the attempt with the last restart
    (PODRUN_RESTART_COUNT >= TORCHELASTIC_MAX_RESTARTS)."""
    from podrun.plan.env import PODRUN_FIELDS

    for env in envs:
        try:
            last = int(env.get(PODRUN_FIELDS["restart_count"], "0")) >= int(env.get("TORCHELASTIC_MAX_RESTARTS", "0"))
        except ValueError:
            last = True
        if code == 0 or ended or last:
            remove(env.get(PODRUN_FIELDS["snapshot_dir"]))


def _until(directory: Path) -> int | None:
    spec = os.environ.get(TEST_UNTIL_ENV, "")
    for item in filter(None, spec.split(",")):
        host, _, last = item.partition("=")
        if host == directory.name:
            return int(last)
    return None


_writers: "weakref.WeakSet[Writer]" = weakref.WeakSet()
_hooked = False


def _before_step(*_args) -> None:
    """Optimizer step pre-hook: no write may still read the weights the step is about to change."""
    for w in list(_writers):
        w.wait()


class Writer:
    """One host's snapshot writer. ``submit`` returns at once; the copy runs on a thread that every optimizer's
    next step waits for (a global step pre-hook). A write that fails (shared memory full) turns snapshots off
    for this process, with one line on stderr."""

    def __init__(self, directory: str | os.PathLike, writes: bool = True):
        global _hooked
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.writes = writes               # False: this rank reads its host's snapshots, another rank writes them
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self._last = _until(self.dir)
        newest = held(self.dir)
        self._next = (newest[0][1] + 1) % SLOTS if newest else 0
        _writers.add(self)
        if not _hooked:
            register_optimizer_step_pre_hook(_before_step)
            _hooked = True

    def submit(self, step: int, state: dict[str, Any]) -> None:
        """Snapshot ``state`` (tensors, state dicts, plain values) as update ``step``, in the background."""
        self.wait()
        if not self.writes or self.error is not None or (self._last is not None and step > self._last):
            return
        k, self._next = self._next, (self._next + 1) % SLOTS
        _header(self.dir, k).unlink(missing_ok=True)          # the slot stops counting before it changes
        self._thread = threading.Thread(target=self._write, args=(k, step, state), name="podrun-snapshot",
                                        daemon=True)
        self._thread.start()

    def _write(self, k: int, step: int, state: dict[str, Any]) -> None:
        import torch

        try:
            path = _data(self.dir, k)
            # over the slot's old bytes (its header is gone): tmpfs reuses the pages instead of freeing and
            # zero-filling them again (61 -> 48 ms for the resnet18 state here)
            with open(path, "r+b" if path.exists() else "wb") as f:
                torch.save(state, f)
                size = f.tell()
                f.truncate()
            self._commit(k, step, size)
        except Exception as exc:  # noqa: BLE001 - any failure turns snapshots off, training goes on
            self.error = f"{type(exc).__name__}: {exc}"

    def _commit(self, k: int, step: int, size: int) -> None:
        tmp = self.dir / f".slot-{k}.json.tmp"
        tmp.write_text(json.dumps({"step": step, "bytes": size}))
        os.replace(tmp, _header(self.dir, k))

    def put(self, step: int, data: bytes) -> None:
        """Hold ``data`` (a snapshot received from another rank) as update ``step``, now."""
        self.wait()
        if not self.writes or self.error is not None:
            return
        k, self._next = self._next, (self._next + 1) % SLOTS
        _header(self.dir, k).unlink(missing_ok=True)
        try:
            _data(self.dir, k).write_bytes(data)
            self._commit(k, step, len(data))
        except OSError as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def read(self, step: int) -> bytes | None:
        """The bytes of this host's complete snapshot of ``step``; None when it holds none."""
        self.wait()
        for s, k in held(self.dir):
            if s == step:
                return _data(self.dir, k).read_bytes()
        return None

    def wait(self) -> None:
        t = self._thread
        if t is not None:
            t.join()
            self._thread = None
            if self.error is not None:
                import sys

                print(f"podrun: snapshots in {self.dir} turned off: {self.error}", file=sys.stderr, flush=True)
                self.error = self.error + " (reported)"

    def close(self) -> None:
        self.wait()
        _writers.discard(self)


@dataclass(frozen=True)
class Recovered:
    """The state every rank resumed from: its update ``step``, the rank whose copy was used, the ranks that
    received it over the network (those that did not hold it)."""

    step: int
    state: dict[str, Any]
    from_rank: int
    fetched_by: tuple[int, ...]


def recover(writer: Writer | None, newer_than: int, restart_count: int = 0) -> Recovered | None:
    """After the process group formed (every rank calls it): the newest complete snapshot any rank holds, when it
    is newer than update ``newer_than`` (the disk checkpoint's; -1: none). Ranks agree with one all-gather of
    the steps they hold; the lowest rank holding the newest sends it to each rank that does not. None: no rank
    holds one newer (the disk checkpoint, or a fresh start, is the resume)."""
    import torch
    import torch.distributed as dist

    if writer is not None:
        writer.wait()                # a write still running counts once it is complete
    mine = [s for s, _ in held(writer.dir)] if writer is not None else []
    mine = (mine + [-1] * SLOTS)[:SLOTS]
    on = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    rank = dist.get_rank() if on else 0
    # NCCL moves device tensors only; gloo host ones
    dev = f"cuda:{torch.cuda.current_device()}" if on and dist.get_backend() == "nccl" else "cpu"
    if on:
        mark = torch.tensor(mine, dtype=torch.int64, device=dev)
        table = [torch.zeros(SLOTS, dtype=torch.int64, device=dev) for _ in range(dist.get_world_size())]
        dist.all_gather(table, mark)
        steps = [t.tolist() for t in table]
    else:
        steps = [mine]
    newest = max(max(s) for s in steps)
    if newest < 0 or newest <= newer_than:
        return None
    holders = [r for r, s in enumerate(steps) if newest in s]
    lacking = tuple(r for r in range(len(steps)) if r not in holders)
    src = holders[0]
    hold = os.environ.get(TEST_HOLD_ENV)
    if hold and restart_count == 1:
        if rank == 0:
            print(f"snapshot recovery: holding {hold} s at step {newest}", flush=True)
        import time

        time.sleep(float(hold))
    data = writer.read(newest) if rank in holders else None
    if on and lacking:
        if rank == src:
            size = torch.tensor([len(data)], dtype=torch.int64, device=dev)
            payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
            for r in lacking:
                dist.send(size, dst=r)
                dist.send(payload, dst=r)
        elif rank in lacking:
            size = torch.zeros(1, dtype=torch.int64, device=dev)
            dist.recv(size, src=src)
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=dev)
            dist.recv(payload, src=src)
            data = payload.cpu().numpy().tobytes()
            if writer is not None:
                writer.put(newest, data)   # a second failure before the next update finds it here too
    state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    return Recovered(newest, state, src, lacking)


def freeze(module) -> dict[str, Any]:
    """A module's state dict for a background write: the parameters as they are (only an optimizer step changes
    them, and it waits for the write), the buffers copied now (a forward changes BatchNorm's running stats)."""
    buffers = {name for name, _ in module.named_buffers()}
    return {k: (v.detach().clone() if k in buffers else v) for k, v in module.state_dict().items()}

"""In-memory snapshots of the training state: two shared-memory slots per host, a background writer, the recovery.

After a restart the ranks agree on the newest snapshot any of them holds and the lowest rank holding it
sends it to the ranks that do not.

A slot is ``slot-<k>.bin`` (the state: podrun.runtime.rawstate, or for a state that format cannot express
torch.save, read back with ``weights_only=True``) and ``slot-<k>.json`` (its header: step, size, kind and its seal:
a Poly1305 tag of all of it under a one-time key derived from the run's key and a fresh nonce, or HMAC-SHA256 where
Poly1305 is not available), the header written last and removed first: a slot counts only when its header names a
data file of the size it says, and is read only when its seal matches. The writer alternates
the slots, so a host holds its last two updates. The run's directory (``/dev/shm/podrun-<run id>-<tag>``) and the
host's in it are made exclusively, 0700, and checked with lstat before each use (a real directory, this user's,
open to nobody else); the files are 0600 and opened without following links, all through podrun.safefs. torch is
imported only by the functions that need it (the agent makes and removes the directories without it).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import io
import json
import os
import stat
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podrun import safefs
from podrun.errors import PodrunError
from podrun.wire.worker_env import PODRUN_FIELDS, SNAPSHOT_KEY_NAME

SLOTS = 2
RAW, TORCH = "raw", "torch"      # a slot's kind: podrun.runtime.rawstate, or torch.save (weights_only=True)
KINDS = (RAW, TORCH)
# Test knob, for the fallback tests only: "HOST=STEP,..." makes the named hosts write no snapshot after STEP
# (0: none at all), so that the newest snapshot has a single holder. Unset in every real run.
TEST_UNTIL_ENV = "PODRUN_TEST_SNAPSHOT_UNTIL"
# Test knob: seconds every rank waits between agreeing and the transfer on restart 1 (a second failure then
# falls inside the recovery), after rank 0 printed "snapshot recovery: holding". Unset in every real run.
TEST_HOLD_ENV = "PODRUN_TEST_RECOVERY_HOLD_S"
_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class SnapshotError(PodrunError):
    """A snapshot that cannot be used: its directory, a missing key, a transfer or a state that does not check."""


class SnapshotDirError(SnapshotError):
    """A snapshot directory podrun will not use: a link, not a directory, another user's, or open to others."""


class SnapshotKeyError(SnapshotError):
    """No snapshot key in the environment: no snapshots."""


_HINT = "remove it (a run's directory is made afresh, private, by its first attempt)"


def check_private(path: str | os.PathLike) -> None:
    """Refuse (SnapshotDirError, one line naming the path, its owner, and its mode where that is why) unless
    ``path`` is, by lstat, a real directory owned by this user with no group or other permission bits
    (safefs.dir_problem); OSError when it is not there."""
    os.lstat(path)
    problem = safefs.dir_problem(path)
    if problem is not None:
        raise SnapshotDirError(f"snapshot directory {problem}: podrun will not use it", hint=_HINT)


def make_private(path: str | os.PathLike) -> None:
    """Make ``path`` exclusively (0700), or find it made (another host's agent or worker on this machine, or an
    earlier attempt of the run); either way check it (safefs.make_dir)."""
    try:
        safefs.make_dir(path, "snapshot directory", error=SnapshotDirError, hint=_HINT)
    except SnapshotDirError:
        check_private(path)    # says it in this module's words; OSError when the parent went away in between
        raise


def open_dir(directory: str | os.PathLike) -> Path:
    """The host's snapshot directory, made or found, with the run's directory above it, both checked (again when
    another host's agent on this machine removed the run's directory, then empty, in between)."""
    d = Path(directory)
    for attempt in range(3):
        make_private(d.parent)
        try:
            make_private(d)
            return d
        except FileNotFoundError:
            if attempt == 2:
                raise


def prepare_dirs(envs: list[dict[str, str]]) -> list[str]:
    """The agent's start (torch-free): make or check the snapshot directory of each worker env before any worker
    starts; where one cannot be used its PODRUN_SNAPSHOT_DIR is dropped (those workers keep no snapshot, a restart
    resumes from the disk checkpoint). The lines saying why, one per directory."""
    name, problems = PODRUN_FIELDS["snapshot_dir"], {}
    for env in envs:
        d = env.get(name)
        if not d:
            continue
        if d not in problems:
            try:
                open_dir(d)
                problems[d] = None
            except (SnapshotDirError, OSError) as exc:
                problems[d] = f"podrun agent: snapshots off on this host: {_one_line(exc)}"
        if problems[d] is not None:
            del env[name]
    return [p for p in problems.values() if p is not None]


def _one_line(exc: BaseException) -> str:
    return exc.message if isinstance(exc, PodrunError) else f"{type(exc).__name__}: {exc}"


def _data(d: Path, k: int) -> Path:
    return d / f"slot-{k}.bin"


def _header(d: Path, k: int) -> Path:
    return d / f"slot-{k}.json"


def _read_small(path: Path, limit: int = 1 << 16) -> bytes:
    return safefs.read_trusted(path, "snapshot header", limit=limit, shared_dir=False)


def _listed(d: Path) -> list[tuple[int, int, dict]]:
    """(step, slot, header) of the slots whose header names a data file of its size, newest first."""
    out = []
    for k in range(SLOTS):
        try:
            h = json.loads(_read_small(_header(d, k)))
            st = os.lstat(_data(d, k))
            if stat.S_ISREG(st.st_mode) and st.st_size == h["bytes"] and type(h["step"]) is int:
                out.append((h["step"], k, h))
        except (OSError, ValueError, KeyError, TypeError, safefs.UnsafePath):
            continue
    return sorted(out, key=lambda x: (x[0], x[1]), reverse=True)


def held(directory: str | os.PathLike | None) -> list[tuple[int, int]]:
    """(step, slot) of this host's complete snapshots, newest first; [] without a directory."""
    if not directory:
        return []
    return [(s, k) for s, k, _ in _listed(Path(directory))]


POLY1305, HMAC_SHA256 = "poly1305", "hmac-sha256"   # a seal's MAC: the fast one, or where it is not available
_CHUNK = 1 << 20        # bytes copied, then MACed while still in the cache
SEAL_FIELDS = ("mac", "nonce", "tag")               # a seal's fields in a header or a transfer


def _chunks(pieces, size: int = _CHUNK):
    """The bytes of ``pieces`` (buffers, in order) as memoryviews of at most ``size`` bytes."""
    for piece in pieces:
        view = memoryview(piece).cast("B")
        for at in range(0, view.nbytes, size):
            yield view[at:at + size]


@functools.cache
def _poly1305():
    """cryptography's Poly1305 class (OpenSSL's, at memory speed), or None where this build has none."""
    try:
        from cryptography.hazmat.primitives.poly1305 import Poly1305

        Poly1305(b"\0" * 32)
        return Poly1305
    except Exception:   # noqa: BLE001 - no cryptography, or an OpenSSL without Poly1305: HMAC-SHA256
        return None


class _Seal:
    """The MAC of one slot's bytes under the run's key: ``POLY1305`` with a one-time key that is HMAC-SHA256 of
    the run's key over the slot's nonce (16 random bytes per write), step, kind and size (the standard one-time use
    of Poly1305, which a key used for two messages would break), or ``HMAC_SHA256`` over the same and the bytes.
    ``update`` the bytes in order, then ``tag``."""

    def __init__(self, key: bytes, step: int, kind: str, size: int, mac: str, nonce: bytes):
        meta = f"podrun snapshot\0{mac}\0{step}\0{kind}\0{size}\0".encode() + nonce
        self.mac, self.nonce = mac, nonce
        if mac == POLY1305:
            cls = _poly1305()
            if cls is None:
                raise SnapshotError("a snapshot sealed with Poly1305 cannot be checked: this Python's cryptography "
                                    "has no Poly1305")
            self._h = cls(hmac.new(key, meta, hashlib.sha256).digest())
        elif mac == HMAC_SHA256:
            self._h = hmac.new(key, meta, hashlib.sha256)
        else:
            raise SnapshotError(f"a snapshot sealed with {mac!r}, which podrun does not know")

    @classmethod
    def new(cls, key: bytes, step: int, kind: str, size: int) -> _Seal:
        return cls(key, step, kind, size, POLY1305 if _poly1305() is not None else HMAC_SHA256, os.urandom(16))

    def update(self, data) -> None:
        self._h.update(data)

    def tag(self) -> dict[str, str]:
        """The header's fields: ``mac``, ``nonce`` and ``tag`` (hex)."""
        t = self._h.finalize() if self.mac == POLY1305 else self._h.digest()
        return {"mac": self.mac, "nonce": self.nonce.hex(), "tag": t.hex()}


def _matches(key: bytes, step: int, kind: str, data, seal: dict) -> bool:
    """Whether ``data`` is what was sealed as update ``step`` of ``kind`` under ``key`` (``seal``: a header's or a
    transfer's mac, nonce and tag); False for a seal that is malformed or names an unknown MAC."""
    try:
        mac, nonce, want = seal["mac"], bytes.fromhex(seal["nonce"]), seal["tag"]
        if not isinstance(mac, str) or not isinstance(want, str) or len(nonce) != 16:
            return False
        s = _Seal(key, step, kind, len(data), mac, nonce)
    except (KeyError, TypeError, ValueError, SnapshotError):
        return False
    for chunk in _chunks([data], 64 * _CHUNK):
        s.update(chunk)
    return hmac.compare_digest(s.tag()["tag"], want)


def _remove_tree(d: Path) -> None:
    """Remove directory ``d`` and its files when it is this user's real directory; never through a link, never
    another user's file (those are left, and so is the directory holding them)."""
    try:
        check_private(d)
    except (SnapshotDirError, OSError):
        return
    with contextlib.suppress(OSError):
        with os.scandir(d) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                if st.st_uid == os.geteuid() and not stat.S_ISDIR(st.st_mode):
                    os.unlink(e.path)       # a link is removed itself, not what it names
        os.rmdir(d)


def remove(directory: str | os.PathLike | None) -> None:
    """Remove a host's snapshot directory, and the run's directory above it once no host's is left (only this
    user's real directories and files; links are not followed)."""
    if not directory:
        return
    d = Path(directory)
    _remove_tree(d)
    with contextlib.suppress(SnapshotDirError, OSError):
        check_private(d.parent)
        os.rmdir(d.parent)


def drop_when_done(envs: list[dict[str, str]], code: int | None, ended: bool) -> None:
    """The agent's end (torch-free): remove its workers' snapshot directories when no restart will read them:
    the workers all succeeded (code 0), the run is being ended (``ended``: the agent got SIGINT or SIGTERM before
    any other reason to stop, or lost its controller, which then drops this host; a signal after a worker's
    failure is the teardown before a restart, which reads them), or this was the attempt with the last restart
    (PODRUN_RESTART_COUNT >= TORCHELASTIC_MAX_RESTARTS)."""
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


_writers: weakref.WeakSet[Writer] = weakref.WeakSet()
_hooked = False


def _before_step(*_args) -> None:
    """Optimizer step pre-hook: no write may still read the weights the step is about to change (and every slot
    written before it is complete: its header committed)."""
    for w in list(_writers):
        w.wait()


class Writer:
    """One host's snapshot writer. ``submit`` returns at once; the copy runs on a thread that every optimizer's
    next step waits for (a global step pre-hook), into a shared mapping of the slot's file kept from one write to
    the next; the same thread seals the slot as it copies (each megabyte MACed while the copy left it in the
    cache) and commits the header. A write that fails (shared memory full) turns snapshots off
    for this process, with one line on stderr. ``key``: the run's (SNAPSHOT_KEY_NAME); the directory is made or
    checked (open_dir): SnapshotDirError when it cannot be used, SnapshotKeyError without a key."""

    def __init__(self, directory: str | os.PathLike, writes: bool = True, key: str | None = None):
        global _hooked
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        key = os.environ.get(SNAPSHOT_KEY_NAME) if key is None else key
        if not key:
            raise SnapshotKeyError(f"no {SNAPSHOT_KEY_NAME} in the environment (podrun launch sets it in a run "
                                   "that can restart): snapshots off")
        self.key = key.encode()
        self.writes = writes               # False: this rank reads its host's snapshots, another rank writes them
        self.dir = open_dir(directory)
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self._fallback_said = False
        self._verified: tuple[int, str, bytes, dict] | None = None   # (step, kind, data, seal) of the newest good slot
        self._maps: dict[int, tuple[tuple[int, int, int], Any]] = {}   # slot -> (its file and size, its mapping)
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
        try:
            self._uncommit(k)                                 # the slot stops counting before it changes
        except (SnapshotDirError, OSError) as exc:            # the directory was changed under the run
            self.error = _one_line(exc)
            self._report()
            return
        self._thread = threading.Thread(target=self._write, args=(k, step, state), name="podrun-snapshot",
                                        daemon=True)
        self._thread.start()

    def _uncommit(self, k: int) -> None:
        check_private(self.dir)
        _header(self.dir, k).unlink(missing_ok=True)
        self._verified = None

    def _open_data(self, k: int):
        """The slot's data file for writing over its old bytes (tmpfs reuses the pages instead of freeing and
        zero-filling them again), or a new one (0600); never through a link, never a file that is not this user's
        private one (safefs.open_private: UnsafePath)."""
        return os.fdopen(safefs.open_private(_data(self.dir, k), append=False, read=True), "r+b")

    def _encode(self, state: dict[str, Any]):
        """(kind, the bytes in order, size): the raw format, or torch.save for a state it cannot express."""
        from podrun.runtime import rawstate

        try:
            head, blobs, size = rawstate.layout(state)
            return RAW, rawstate.pieces(head, blobs), size
        except rawstate.Unsupported as exc:
            import torch

            if not self._fallback_said:
                self._fallback_said = True
                print(f"podrun: the snapshot state holds {exc}, which the raw format cannot express: written with "
                      "torch.save and read back with torch.load(weights_only=True)", file=sys.stderr, flush=True)
            buf = io.BytesIO()
            torch.save(state, buf)
            data = buf.getbuffer()
            return TORCH, [data], data.nbytes

    def _write(self, k: int, step: int, state: dict[str, Any]) -> None:
        try:
            kind, pieces, size = self._encode(state)
            seal = _Seal.new(self.key, step, kind, size)
            dst = self._mapped(k, size)
            if dst is None:
                with self._open_data(k) as f:
                    for chunk in _chunks(pieces):   # one pass over the bytes: the copy, then the MAC from the cache
                        f.write(chunk)
                        seal.update(chunk)
                    f.truncate(size)
            else:
                import numpy as np

                at = 0
                for chunk in _chunks(pieces):       # the copy (numpy's, without the GIL), then the MAC from the cache
                    dst[at:at + chunk.nbytes] = np.frombuffer(chunk, np.uint8)
                    seal.update(chunk)
                    at += chunk.nbytes
                del dst
            self._commit(k, step, size, kind, seal.tag())
        except Exception as exc:  # noqa: BLE001 - any failure turns snapshots off, training goes on
            self.error = f"{type(exc).__name__}: {exc}"

    def _mapped(self, k: int, size: int):
        """Slot ``k``'s data file of ``size`` bytes as a writable numpy array over a shared mapping of it, kept from
        one write to the next (no system call nor page fault per megabyte: the copy costs what a memcpy costs). The
        file is opened through _open_data each time and mapped again when it is another file or size; its pages
        are allocated first (posix_fallocate), so that shared memory that is full fails the write as a write()
        would, instead of a fault in the copy. None without numpy or mmap (the caller writes through the file)."""
        try:
            import mmap

            import numpy as np
        except ImportError:
            return None
        with self._open_data(k) as f:
            st = os.fstat(f.fileno())
            ident = (st.st_dev, st.st_ino, size)
            held = self._maps.get(k)
            if held is None or held[0] != ident or st.st_size != size:
                if held is not None:
                    held[1].close()
                    del self._maps[k]
                f.truncate(size)
                if size == 0:
                    return None
                os.posix_fallocate(f.fileno(), 0, size)     # shared memory full: OSError here, not SIGBUS later
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                held = self._maps[k] = (ident, mmap.mmap(f.fileno(), size, flags=flags))
        return np.frombuffer(held[1], np.uint8)

    def _commit(self, k: int, step: int, size: int, kind: str, seal: dict) -> None:
        header = {"step": step, "bytes": size, "kind": kind, **seal}
        safefs.write_file(_header(self.dir, k), json.dumps(header), "snapshot header", durable=False)   # tmpfs

    def put(self, step: int, data: bytes, kind: str, seal: dict) -> None:
        """Hold ``data`` (a snapshot received from another rank, its seal checked) as update ``step``, now."""
        self.wait()
        if not self.writes or self.error is not None:
            return
        k, self._next = self._next, (self._next + 1) % SLOTS
        try:
            self._uncommit(k)
            with self._open_data(k) as f:
                f.write(data)
                f.truncate(len(data))
            self._commit(k, step, len(data), kind, seal)
        except (OSError, PodrunError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def verified(self) -> list[int]:
        """[step] of this host's newest complete snapshot whose seal matches (its bytes kept for ``read``), or [];
        a newer slot whose MAC does not match is refused with one line on stderr naming it and counts as absent."""
        self.wait()
        self._verified = None
        try:
            check_private(self.dir)
        except (SnapshotDirError, OSError) as exc:
            print(f"podrun: snapshots ignored: {_one_line(exc)}", file=sys.stderr, flush=True)
            return []
        for step, k, h in _listed(self.dir):
            path = _data(self.dir, k)
            try:
                fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
                with os.fdopen(fd, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            kind, seal = h.get("kind"), {f: h.get(f) for f in SEAL_FIELDS}
            if kind in KINDS and len(data) == h["bytes"] and _matches(self.key, step, kind, data, seal):
                self._verified = (step, kind, data, seal)
                return [step]
            print(f"podrun: snapshot slot {path} (update {step}) does not match its MAC under this run's key: "
                  "refused, treated as absent", file=sys.stderr, flush=True)
        return []

    def read(self, step: int) -> tuple[str, bytes, dict] | None:
        """(kind, bytes, seal) of this host's verified snapshot of ``step`` (``verified`` found it); None otherwise."""
        v = self._verified
        return v[1:] if v is not None and v[0] == step else None

    def wait(self) -> None:
        t = self._thread
        if t is not None:
            t.join()
            self._thread = None
            if self.error is not None:
                self._report()

    def _report(self) -> None:
        """Say once, on stderr, why snapshots turned off (the error is marked reported)."""
        print(f"podrun: snapshots in {self.dir} turned off: {self.error}", file=sys.stderr, flush=True)
        self.error += " (reported)"

    def close(self) -> None:
        self.wait()
        _writers.discard(self)
        for _, m in self._maps.values():
            m.close()
        self._maps.clear()


def open_writer(directory: str | os.PathLike | None, writes: bool) -> Writer | None:
    """This host's writer for a worker, or None (no directory: none kept; no key or a directory podrun will not
    use: one line on stderr, snapshots off, a restart resumes from the disk checkpoint)."""
    if not directory:
        return None
    try:
        return Writer(directory, writes=writes)
    except (SnapshotDirError, SnapshotKeyError) as exc:
        print(f"podrun: snapshots off: {_one_line(exc)}", file=sys.stderr, flush=True)
    except OSError as exc:
        print(f"podrun: snapshots off: {directory}: {exc.strerror or exc}", file=sys.stderr, flush=True)
    return None


@dataclass(frozen=True)
class Restored:
    """The state every rank resumed from: the update ``step`` it was taken after, the ``state`` as given to the
    writer (podrun.runtime.elastic.snapshot: modules and optimizers as state dicts), the rank whose copy was used,
    the ranks that received it over the network (those that did not hold it)."""

    step: int
    state: dict[str, Any]
    from_rank: int
    fetched_by: tuple[int, ...]


def recover(writer: Writer | None, newer_than: int, restart_count: int = 0) -> Restored | None:
    """After the process group formed (every rank calls it): the newest complete snapshot any rank holds, when it
    is newer than update ``newer_than`` (the disk checkpoint's; -1: none). Ranks agree with one all-gather of
    the steps they hold; the lowest rank holding the newest sends it to each rank that does not. None: no rank
    holds one newer (the disk checkpoint, or a fresh start, is the resume)."""
    import torch
    import torch.distributed as dist

    mine = writer.verified() if writer is not None else []   # waits for a write still running
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
        time.sleep(float(hold))
    kind, data, seal = writer.read(newest) if rank in holders else (None, None, None)
    if on and lacking:
        if rank == src:        # the slot's bytes, after its kind and seal (the receiver checks it with its key)
            meta = json.dumps({"kind": kind, **seal}).encode()
            head = len(meta).to_bytes(2, "little") + meta
            payload = torch.frombuffer(bytearray(head + data), dtype=torch.uint8).to(dev)
            size = torch.tensor([payload.numel()], dtype=torch.int64, device=dev)
            for r in lacking:
                dist.send(size, dst=r)
                dist.send(payload, dst=r)
        elif rank in lacking:
            size = torch.zeros(1, dtype=torch.int64, device=dev)
            dist.recv(size, src=src)
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=dev)
            dist.recv(payload, src=src)
            got = payload.cpu().numpy().tobytes()
            n = int.from_bytes(got[:2], "little")
            try:
                meta = json.loads(got[2:2 + n])
                kind, seal = meta["kind"], {f: meta[f] for f in SEAL_FIELDS}
            except (ValueError, KeyError, TypeError):
                kind, seal = None, {}
            data = got[2 + n:]
            key = writer.key if writer is not None else os.environ.get(SNAPSHOT_KEY_NAME, "").encode()
            if kind not in KINDS or not _matches(key, newest, kind, data, seal):
                raise SnapshotError(f"the snapshot of update {newest} received from rank {src} does not match "
                                       "its MAC under this run's key")
            if writer is not None:
                writer.put(newest, data, kind, seal)   # a second failure before the next update finds it here too
    return Restored(newest, _load(kind, data, f"the snapshot of update {newest} (rank {src})"), src, lacking)


def _load(kind: str, data: bytes, what: str) -> dict[str, Any]:
    """A slot's state, without unpickling anything but what torch.load(weights_only=True) allows."""
    import torch

    from podrun.runtime import rawstate

    if kind == RAW:
        return rawstate.load(data)
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:   # noqa: BLE001 - weights_only refuses a type: say which, on every rank alike
        raise SnapshotError(f"{what} holds what torch.load(weights_only=True) refuses: {exc}".splitlines()[0],
                               hint="keep tensors, numbers, strings, None and lists, tuples and dicts of them in "
                                    "the state given to podrun.runtime.elastic.snapshot") from None


def freeze(module) -> dict[str, Any]:
    """A module's state dict for a background write: the parameters as they are (only an optimizer step changes
    them, and it waits for the write), the buffers copied now (a forward changes BatchNorm's running stats)."""
    buffers = {name for name, _ in module.named_buffers()}
    return {k: (v.detach().clone() if k in buffers else v) for k, v in module.state_dict().items()}

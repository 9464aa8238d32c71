"""One training step of a recipe's model on random data (forward, backward, optimiser), and its peak memory in a
child process: what the calibration times and sizes."""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from podrun import models
from podrun.safefs import write_kernel
from podrun.specs.recipe import RecipeSpec
from podrun.train.optim import build_optimizer
from podrun.train.recipe_main import model_kwargs     # the model's options as the recipe's train.py builds it


def input_size(recipe: RecipeSpec, image_size: int | None) -> int:
    """The side in pixels of the inputs: ``image_size`` when given, else the recipe's dataset's."""
    return recipe.dataset.image_size if image_size is None else image_size


def autocast_dtype(recipe: RecipeSpec, device: str):
    """The recipe's precision as the training loop runs it: bf16/amp on CUDA, fp16 on CUDA; fp32 on CPU."""
    if device != "cuda" or recipe.precision == "fp32":
        return None
    return torch.float16 if recipe.precision == "fp16" else torch.bfloat16


@dataclass
class Stepper:
    """The recipe's model and optimiser on one device, stepping on random data of a fixed local batch, at inputs of
    ``image_size`` pixels (None: the recipe's)."""

    recipe: RecipeSpec
    device: str = "cpu"
    image_size: int | None = None

    def __post_init__(self):
        torch.manual_seed(0)
        r = self.recipe
        self.model = models.build(r.model.name, num_classes=r.dataset.num_classes,
                                  **model_kwargs(r, input_size(r, self.image_size))).to(self.device)
        self.model.train()
        o = r.optimizer
        self.opt = build_optimizer(self.model, o.name, r.lr.base, momentum=o.momentum, weight_decay=o.weight_decay,
                                   eeta=o.eeta, nesterov=o.nesterov, exclude_bias_and_norm=o.exclude_bias_and_norm)
        self.dtype = autocast_dtype(r, self.device)
        self.batch = 0

    def _data(self, b: int):
        size = input_size(self.recipe, self.image_size)
        self.x = torch.randn(b, 3, size, size, device=self.device)
        self.y = torch.randint(0, self.recipe.dataset.num_classes, (b,), device=self.device)
        self.batch = b

    def step(self, b: int) -> None:
        if self.batch != b:
            self._data(b)
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device, dtype=self.dtype, enabled=self.dtype is not None):
            loss = F.cross_entropy(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()
        if self.device == "cuda":
            torch.cuda.synchronize()

    def time_steps(self, b: int, steps: int, warmup: int = 1) -> list[float]:
        """Each timed step's wall seconds; ``cpu_seconds`` keeps each one's CPU seconds (this process, all its
        threads): the cores a step keeps busy on a CPU device are the two's ratio."""
        for _ in range(warmup):
            self.step(b)
        out, self.cpu_seconds = [], []
        for _ in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            self.step(b)
            out.append(time.perf_counter() - t0)
            self.cpu_seconds.append(time.process_time() - c0)
        return out


def _status_kb(name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {name} in /proc/self/status")


def _fixed_malloc() -> None:
    """glibc's malloc with a fixed mmap threshold: each block of 64 KiB or more is its own mapping, returned when
    freed (glibc otherwise raises the threshold after frees, and keeps freed tensors in the heap), so the resident
    set follows the live tensors and a probe measures the same peak each time."""
    with contextlib.suppress(OSError, AttributeError):   # not glibc: the resident set as it comes
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 * 1024)     # M_MMAP_THRESHOLD
        libc.malloc_trim(0)


def _probe_child(recipe: RecipeSpec, b: int, device: str, image_size: int | None, conn) -> None:
    """In the child: two steps at local batch ``b``; sends the peak bytes (or the error) and exits."""
    try:
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        else:
            _fixed_malloc()
            write_kernel("/proc/self/clear_refs", "5")     # reset VmHWM to the current resident set
            base = _status_kb("VmRSS") * 1024
        s = Stepper(recipe, device, image_size)
        s.step(b)
        s.step(b)
        peak = (torch.cuda.max_memory_allocated() if device == "cuda" else _status_kb("VmHWM") * 1024) - base
        conn.send({"peak_bytes": int(max(peak, 0))})
    except torch.cuda.OutOfMemoryError as exc:
        conn.send({"peak_bytes": None, "error": f"out of memory: {str(exc).splitlines()[0][:200]}"})
    except MemoryError:
        conn.send({"peak_bytes": None, "error": "out of memory (MemoryError)"})
    except Exception as exc:  # noqa: BLE001 - not a memory limit: the probe could not run, said as it is
        conn.send({"failed": f"{type(exc).__name__}: {str(exc)[:500]}"})
    finally:
        conn.close()
        os._exit(0)


def probe(recipe: RecipeSpec, b: int, device: str = "cpu", timeout: float = 600.0,
          image_size: int | None = None) -> dict:
    """One probe in a child process, forked on a CPU (torch already loaded here, so the child starts at once) and
    spawned on CUDA (a forked child of a process that has initialised CUDA cannot use it): {"peak_bytes": int}
    or {"peak_bytes": None, "error": why} when it ran out of memory or died; RuntimeError with the child's error
    when the probe could not run for another reason (that is no memory limit: the calibration stops on it)."""
    ctx = mp.get_context("fork" if device == "cpu" else "spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_probe_child, args=(recipe, b, device, image_size, child), daemon=True)
    p.start()
    child.close()
    try:
        got = parent.recv() if parent.poll(timeout) else None
    except EOFError:                       # the child ended without a word: its exit says how
        got = None
    p.join(timeout=30)
    if p.is_alive():
        p.kill()
        p.join()
    if got is None:
        why = f"killed by signal {-p.exitcode}" if p.exitcode is not None and p.exitcode < 0 else \
            f"exited {p.exitcode} without a result"
        return {"peak_bytes": None, "error": f"the probe process {why} (out of memory?)"}
    if "failed" in got:
        raise RuntimeError(f"the memory probe at local batch {b} could not run: {got['failed']}")
    return got

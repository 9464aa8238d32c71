"""FAKE poptorch for contract tests only (the real one ships with the Poplar SDK, not on PyPI).

It implements the few calls podrun.train.ipu makes, runs the model on the CPU, and logs every call
as JSON lines to $FAKE_POPTORCH_LOG so a test can check the contract (options, batch shapes, dtypes).
"""
from __future__ import annotations

import json
import os

import torch

__fake__ = True


def _log(**record):
    path = os.environ.get("FAKE_POPTORCH_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


class _Training:
    def __init__(self, opts):
        self._opts = opts

    def gradientAccumulation(self, n):
        self._opts.values["gradient_accumulation"] = int(n)
        return self._opts


class _Distributed:
    def __init__(self, opts):
        self._opts = opts

    def configureProcessId(self, process_id, num_processes):
        self._opts.values["process"] = [int(process_id), int(num_processes)]
        return self._opts


class Options:
    def __init__(self):
        self.values = {"replication_factor": 1, "gradient_accumulation": 1, "device_iterations": 1}
        self.Training = _Training(self)
        self.Distributed = _Distributed(self)

    def replicationFactor(self, n):
        self.values["replication_factor"] = int(n)
        return self

    def deviceIterations(self, n):
        self.values["device_iterations"] = int(n)
        return self

    def randomSeed(self, seed):
        self.values["seed"] = int(seed)
        return self


def identity_loss(x, reduction="none"):
    return x.mean() if reduction == "mean" else x.sum() if reduction == "sum" else x


class optim:  # noqa: N801 - poptorch.optim is a module in the real package
    class SGD(torch.optim.SGD):
        def __init__(self, params, lr, loss_scaling=None, **kw):
            super().__init__(params, lr=lr, **kw)

    class AdamW(torch.optim.AdamW):
        def __init__(self, params, lr, loss_scaling=None, **kw):
            super().__init__(params, lr=lr, **kw)

    class RMSprop(torch.optim.RMSprop):
        def __init__(self, params, lr, loss_scaling=None, **kw):
            super().__init__(params, lr=lr, **kw)


class _TrainingModel:
    """Splits each call's batch into replicas x GA micro batches, accumulates, steps once (as the IPU would)."""

    def __init__(self, model, options, optimizer):
        self.model, self.options, self.optimizer = model, options, optimizer
        _log(call="trainingModel", options=options.values, optimizer=type(optimizer).__name__,
             lr=optimizer.param_groups[0]["lr"])

    def __call__(self, x, y):
        v = self.options.values
        parts = v["replication_factor"] * v["gradient_accumulation"] * v["device_iterations"]
        assert x.shape[0] % parts == 0, f"batch {x.shape[0]} not divisible into {parts} micro batches"
        _log(call="run", batch=list(x.shape), dtype=str(x.dtype).replace("torch.", ""), micro=x.shape[0] // parts,
             checksum=int(x.long().sum()), labels=y.tolist())
        losses, outs = [], []
        for xs, ys in zip(x.chunk(parts), y.chunk(parts)):
            logits, loss = self.model(xs, ys)
            (loss / parts).backward()
            losses.append(loss.detach())
            outs.append(logits.detach())
        self.optimizer.step()
        self.optimizer.zero_grad()
        return torch.cat(outs), torch.stack(losses).view(v["replication_factor"], -1).mean(1)

    def setOptimizer(self, optimizer):
        state = self.optimizer.state_dict()["state"]
        self.optimizer = optimizer
        if state:
            sd = optimizer.state_dict()
            sd["state"] = state
            optimizer.load_state_dict(sd)
        _log(call="setOptimizer", lr=optimizer.param_groups[0]["lr"])

    def copyWeightsToHost(self):
        _log(call="copyWeightsToHost")

    def detachFromDevice(self):
        _log(call="detachFromDevice")


class DataLoaderMode:
    Sync, Async, AsyncRebatched = "sync", "async", "async_rebatched"


class DataLoader:
    """FAKE of poptorch.DataLoader: a call's batch is batch_size x device iterations x replicas x GA consecutive
    samples of the dataset (as the real one combines them); Async mode reads ahead on a thread (the real one in a
    process of its own with a ring buffer). Its options are logged."""

    def __init__(self, options, dataset, batch_size=1, shuffle=False, num_workers=0, drop_last=True,
                 persistent_workers=None, auto_distributed_partitioning=True, mode=DataLoaderMode.Sync,
                 async_options=None, **kwargs):
        v = options.values
        self.combined = batch_size * v["device_iterations"] * v["replication_factor"] * v["gradient_accumulation"]
        self.mode = mode
        self.inner = torch.utils.data.DataLoader(dataset, batch_size=self.combined, shuffle=shuffle,
                                                 num_workers=num_workers, drop_last=drop_last)
        _log(call="DataLoader", batch_size=batch_size, combined=self.combined, num_workers=num_workers,
             shuffle=shuffle, mode=mode, auto_distributed_partitioning=auto_distributed_partitioning,
             async_options=async_options, samples=len(dataset))

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        if self.mode == DataLoaderMode.Sync:
            yield from self.inner
            return
        import queue
        import threading

        q: queue.Queue = queue.Queue(maxsize=3)
        done = object()

        def ahead():
            for item in self.inner:
                q.put(item)
            q.put(done)

        threading.Thread(target=ahead, daemon=True).start()
        while (item := q.get()) is not done:
            yield item


def trainingModel(model, options=None, optimizer=None):
    return _TrainingModel(model, options or Options(), optimizer)

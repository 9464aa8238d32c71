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
        _log(call="run", batch=list(x.shape), dtype=str(x.dtype).replace("torch.", ""), micro=x.shape[0] // parts)
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


def trainingModel(model, options=None, optimizer=None):
    return _TrainingModel(model, options or Options(), optimizer)

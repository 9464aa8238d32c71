"""The GroupNorm regression that tests/elastic/train_groupnorm.py and bench/scripts/elastic_train.py train: its
fixed data, its model, the data order (a function of the seed and the epoch only) and one micro step's loss.

GroupNorm works per sample, so the loss of a global batch does not depend on how it is split into
replicas x local batch x GA beyond float rounding."""
from __future__ import annotations

import torch


def data(samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets): ``samples`` fixed samples of a noisy regression."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 4, 6, generator=gen)
    y = x.sum(dim=(1, 2)).tanh().unsqueeze(1) + 0.1 * torch.randn(samples, 1, generator=gen)
    return x, y


def model() -> torch.nn.Module:
    """The same initial weights in every process."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv1d(4, 8, 3), torch.nn.GroupNorm(2, 8), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(32, 1))


def order(epoch: int, samples: int) -> torch.Tensor:
    return torch.randperm(samples, generator=torch.Generator().manual_seed(1000 + epoch))


def global_batch(pos: int, size: int, samples: int) -> torch.Tensor:
    """The sample indices of the global batch of ``size`` that starts at global position ``pos``."""
    return torch.stack([order((pos + i) // samples, samples)[(pos + i) % samples] for i in range(size)])


def micro_loss(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, *, micro: int,
               replicas: int, local_batch: int, replica: int) -> torch.Tensor:
    """Micro step ``micro`` of replica ``replica``: its ``local_batch`` samples of ``idx``, squared error summed
    and divided by the global batch (so the gradients summed over replicas and micro steps are the mean's)."""
    start = micro * replicas * local_batch + replica * local_batch
    mine = idx[start: start + local_batch]
    return ((net(x[mine]) - y[mine]) ** 2).sum() / len(idx)

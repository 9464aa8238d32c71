"""Building blocks shared by the models: norm factory, conv-norm-activation, squeeze-excitation, stochastic depth."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from podrun.errors import SpecError

NormFactory = Callable[[int], nn.Module]


def make_norm(kind: str, *, model: str, groups: int | Callable[[int], int] = 32,
              eps: float = 1e-5, momentum: float = 0.1) -> NormFactory:
    """A factory ``channels -> norm module`` for ``kind`` 'batch' (BatchNorm2d) or 'group' (GroupNorm).

    ``groups`` is either a fixed group count or a rule ``channels -> groups``. GroupNorm has the same
    parameters as BatchNorm (weight and bias per channel) but no running statistics.
    """
    if kind == "batch":
        return lambda c: nn.BatchNorm2d(c, eps=eps, momentum=momentum)
    if kind == "group":
        rule = groups if callable(groups) else (lambda c, g=groups: g)

        def group_norm(c: int) -> nn.Module:
            g = rule(c)
            if c % g:
                raise SpecError(f"model {model}: GroupNorm with {g} groups cannot split {c} channels",
                                hint="choose a group count that divides every channel width")
            return nn.GroupNorm(g, c, eps=eps)

        return group_norm
    raise SpecError(f"model {model}: norm={kind!r} is not one of 'batch', 'group'",
                    hint="use norm='batch' (BatchNorm2d) or norm='group' (GroupNorm, batch-independent)")


class Conv2dNormActivation(nn.Sequential):
    """Conv2d (no bias when a norm follows) -> norm -> activation; same layout as torchvision.ops' one."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 groups: int = 1, norm_layer: NormFactory | None = None,
                 activation_layer: Callable[..., nn.Module] | None = nn.ReLU):
        padding = (kernel_size - 1) // 2
        layers: list[nn.Module] = [nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding,
                                             groups=groups, bias=norm_layer is None)]
        if norm_layer is not None:
            layers.append(norm_layer(out_channels))
        if activation_layer is not None:
            layers.append(activation_layer(inplace=True))
        super().__init__(*layers)
        self.out_channels = out_channels


class SqueezeExcitation(nn.Module):
    """Squeeze-and-excitation: global pool -> 1x1 conv -> act -> 1x1 conv -> sigmoid, scales the input."""

    def __init__(self, input_channels: int, squeeze_channels: int,
                 activation: Callable[..., nn.Module] = nn.SiLU):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(input_channels, squeeze_channels, 1)
        self.fc2 = nn.Conv2d(squeeze_channels, input_channels, 1)
        self.activation = activation(inplace=True)
        self.scale_activation = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class StochasticDepth(nn.Module):
    """Drops whole residual branches per sample ("row" mode) with probability ``p`` while training."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise SpecError(f"stochastic depth probability {p} is outside [0, 1]",
                            hint="use a probability such as 0.2")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        survival = 1.0 - self.p
        noise = torch.empty([x.shape[0]] + [1] * (x.ndim - 1), dtype=x.dtype, device=x.device).bernoulli_(survival)
        if survival > 0.0:
            noise = noise.div_(survival)
        return x * noise

    def extra_repr(self) -> str:
        return f"p={self.p}"

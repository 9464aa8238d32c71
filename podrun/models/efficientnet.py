"""EfficientNet v1 (B0-B7) in plain torch, layer-for-layer torchvision's, plus Graphcore's G16 variant.

Scaling: each stage's channels are ``_make_divisible(c * width_mult, 8)`` (round to the nearest
multiple of 8, never more than 10 % down) and its depth is ``ceil(n * depth_mult)``; the head conv
has 4x the last stage's channels; dropout before the classifier; stochastic depth rising linearly
from 0 to ``stochastic_depth_prob`` over the blocks.

G16 (Graphcore, "Making EfficientNet More Efficient", arXiv 2106.03640): every depthwise conv becomes
a group conv with 16 channels per group (groups = channels // 16), every MBConv whose expansion is 6
uses 4 (the first stage keeps 1), and every BatchNorm becomes GroupNorm with 4 groups (eps 1e-3).
Graphcore's group rule is groups = max(channels // 16, 1): in B4 the one width that is not a multiple
of 16 (the second block of stage 1, 24 channels, expansion 1) gets a single group of 24.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from podrun.errors import SpecError
from podrun.models.layers import (Conv2dNormActivation, NormFactory, SqueezeExcitation,
                                  StochasticDepth, make_norm)

# name: (width_mult, depth_mult, dropout, native image size, bn eps, bn momentum)
VARIANTS: dict[str, tuple[float, float, float, int, float, float]] = {
    "efficientnet_b0": (1.0, 1.0, 0.2, 224, 1e-5, 0.1),
    "efficientnet_b1": (1.0, 1.1, 0.2, 240, 1e-5, 0.1),
    "efficientnet_b2": (1.1, 1.2, 0.3, 288, 1e-5, 0.1),
    "efficientnet_b3": (1.2, 1.4, 0.3, 300, 1e-5, 0.1),
    "efficientnet_b4": (1.4, 1.8, 0.4, 380, 1e-5, 0.1),
    "efficientnet_b5": (1.6, 2.2, 0.4, 456, 1e-3, 0.01),
    "efficientnet_b6": (1.8, 2.6, 0.5, 528, 1e-3, 0.01),
    "efficientnet_b7": (2.0, 3.1, 0.5, 600, 1e-3, 0.01),
}

# The B0 stages: (expand_ratio, kernel, stride, in_channels, out_channels, num_layers)
BASE_STAGES = [
    (1, 3, 1, 32, 16, 1),
    (6, 3, 2, 16, 24, 2),
    (6, 5, 2, 24, 40, 2),
    (6, 3, 2, 40, 80, 3),
    (6, 5, 1, 80, 112, 3),
    (6, 5, 2, 112, 192, 4),
    (6, 3, 1, 192, 320, 1),
]

GN_GROUPS = 4  # GroupNorm groups for norm='group' (Graphcore's choice for G16)


def _make_divisible(v: float, divisor: int = 8) -> int:
    """Round ``v`` to the nearest multiple of ``divisor`` (at least ``divisor``), never below 90 % of v."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


@dataclass
class MBConvConfig:
    """One stage of MBConv blocks, already scaled by width and depth."""

    expand_ratio: float
    kernel: int
    stride: int
    input_channels: int
    out_channels: int
    num_layers: int


def stage_configs(width_mult: float, depth_mult: float,
                  expand_ratio: float | None = None) -> list[MBConvConfig]:
    """The seven scaled stages; ``expand_ratio`` replaces every ratio that is not 1 (G16 uses 4)."""
    out = []
    for e, k, s, cin, cout, n in BASE_STAGES:
        if expand_ratio is not None and e != 1:
            e = expand_ratio
        out.append(MBConvConfig(e, k, s, _make_divisible(cin * width_mult), _make_divisible(cout * width_mult),
                                int(math.ceil(n * depth_mult))))
    return out


class MBConv(nn.Module):
    """Inverted residual: 1x1 expand, k x k depthwise (or group) conv, SE, 1x1 project, residual."""

    def __init__(self, cnf: MBConvConfig, stochastic_depth_prob: float, norm_layer: NormFactory,
                 group_size: int | None = None, model: str = "efficientnet"):
        super().__init__()
        if not 1 <= cnf.stride <= 2:
            raise SpecError(f"model {model}: MBConv stride {cnf.stride} is not 1 or 2")
        self.use_res_connect = cnf.stride == 1 and cnf.input_channels == cnf.out_channels
        expanded = _make_divisible(cnf.input_channels * cnf.expand_ratio)
        layers: list[nn.Module] = []
        if expanded != cnf.input_channels:
            layers.append(Conv2dNormActivation(cnf.input_channels, expanded, kernel_size=1,
                                               norm_layer=norm_layer, activation_layer=nn.SiLU))
        if group_size is None:
            groups = expanded  # depthwise
        else:
            # Graphcore's rule: groups = channels // group_size, at least 1 (so a width below the
            # group size, or not a multiple of it, gets fewer, larger groups).
            groups = max(expanded // group_size, 1)
            if expanded % groups:
                raise SpecError(f"model {model}: group_size={group_size} gives {groups} groups, which "
                                f"do not divide an MBConv width of {expanded} channels",
                                hint="use a group size that divides the expanded widths (16 for B4)")
        layers.append(Conv2dNormActivation(expanded, expanded, kernel_size=cnf.kernel, stride=cnf.stride,
                                           groups=groups, norm_layer=norm_layer,
                                           activation_layer=nn.SiLU))
        squeeze = max(1, cnf.input_channels // 4)
        layers.append(SqueezeExcitation(expanded, squeeze, activation=nn.SiLU))
        layers.append(Conv2dNormActivation(expanded, cnf.out_channels, kernel_size=1,
                                           norm_layer=norm_layer, activation_layer=None))
        self.block = nn.Sequential(*layers)
        self.stochastic_depth = StochasticDepth(stochastic_depth_prob)
        self.out_channels = cnf.out_channels
        self.expanded_channels = expanded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.block(x)
        if self.use_res_connect:
            result = self.stochastic_depth(result) + x
        return result


class EfficientNet(nn.Module):
    """torchvision's EfficientNet: ``features`` (stem, 7 stages, head conv), ``avgpool``, ``classifier``."""

    def __init__(self, stages: list[MBConvConfig], *, num_classes: int = 1000, dropout: float = 0.2,
                 stochastic_depth_prob: float = 0.2, norm_layer: NormFactory,
                 group_size: int | None = None, model: str = "efficientnet"):
        super().__init__()
        layers: list[nn.Module] = [Conv2dNormActivation(3, stages[0].input_channels, kernel_size=3,
                                                        stride=2, norm_layer=norm_layer,
                                                        activation_layer=nn.SiLU)]
        total_blocks = sum(c.num_layers for c in stages)
        block_id = 0
        for cnf in stages:
            stage: list[nn.Module] = []
            for _ in range(cnf.num_layers):
                block_cnf = copy.copy(cnf)
                if stage:
                    block_cnf.input_channels = block_cnf.out_channels
                    block_cnf.stride = 1
                sd_prob = stochastic_depth_prob * float(block_id) / total_blocks
                stage.append(MBConv(block_cnf, sd_prob, norm_layer, group_size, model))
                block_id += 1
            layers.append(nn.Sequential(*stage))
        last_in = stages[-1].out_channels
        last_out = 4 * last_in
        layers.append(Conv2dNormActivation(last_in, last_out, kernel_size=1, norm_layer=norm_layer,
                                           activation_layer=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout, inplace=True),
                                        nn.Linear(last_out, num_classes))
        self.num_features = last_out

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                init_range = 1.0 / math.sqrt(m.out_features)
                nn.init.uniform_(m.weight, -init_range, init_range)
                nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.avgpool(self.features(x)), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.forward_features(x))


def efficientnet(name: str, num_classes: int = 1000, *, norm: str = "batch",
                 dropout: float | None = None, stochastic_depth_prob: float = 0.2,
                 group_size: int | None = None, expand_ratio: float | None = None) -> EfficientNet:
    """Build ``efficientnet_b0`` .. ``efficientnet_b7`` (torchvision's definitions by default).

    norm='group' uses GroupNorm with 4 groups; ``group_size`` turns depthwise convs into group
    convs with that many channels per group; ``expand_ratio`` replaces the ratio 6 of stages 2-7.
    """
    width, depth, default_dropout, _size, eps, momentum = VARIANTS[name]
    norm_layer = make_norm(norm, model=name, groups=GN_GROUPS, eps=eps if norm == "batch" else 1e-3,
                           momentum=momentum)
    return EfficientNet(stage_configs(width, depth, expand_ratio), num_classes=num_classes,
                        dropout=default_dropout if dropout is None else dropout,
                        stochastic_depth_prob=stochastic_depth_prob, norm_layer=norm_layer,
                        group_size=group_size, model=name)


def efficientnet_b4_g16(num_classes: int = 1000, *, norm: str = "group", dropout: float | None = None,
                        stochastic_depth_prob: float = 0.2) -> EfficientNet:
    """Graphcore's EfficientNet-B4 G16: group size 16, expansion 4, GroupNorm(4 groups).

    19,328,168 parameters at 1000 classes (B4: 19,341,616): expansion 4 shrinks every MBConv's
    1x1 convs and the group convs hold 16 weights per output channel per tap instead of 1.
    """
    return efficientnet("efficientnet_b4", num_classes, norm=norm, dropout=dropout,
                        stochastic_depth_prob=stochastic_depth_prob, group_size=16, expand_ratio=4)

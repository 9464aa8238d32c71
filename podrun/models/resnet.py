"""ResNet-18/50 in plain torch, layer-for-layer torchvision's (same names, same parameter counts).

Options beyond torchvision: ``norm='group'`` swaps every BatchNorm2d for GroupNorm(min(32, C), C)
(batch-independent; ResNet widths are all multiples of 32, so every group has C/32 >= 2 channels),
and ``stem='cifar'`` swaps the 7x7/2 conv + 3x3/2 max-pool for one 3x3/1 conv and no pool
(for 32 px inputs; 9,408 -> 1,728 stem weights, so resnet18 has 11,681,832 parameters at 1000 classes).
"""
from __future__ import annotations

import torch
from torch import nn

from podrun.errors import SpecError
from podrun.models.layers import NormFactory, make_norm


def gn_groups(channels: int) -> int:
    """The GroupNorm rule for ResNets: min(32, channels) groups."""
    return min(32, channels)


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection (ResNet-18/34)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int, downsample: nn.Module | None,
                 norm_layer: NormFactory):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = norm_layer(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = norm_layer(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (stride here, as in ResNet v1.5), 1x1 expand x4, residual (ResNet-50+)."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int, downsample: nn.Module | None,
                 norm_layer: NormFactory):
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = norm_layer(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = norm_layer(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = norm_layer(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ResNet: stem, layer1..layer4, global average pool, fc."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], *,
                 num_classes: int = 1000, norm: str = "batch", stem: str = "imagenet",
                 zero_init_residual: bool = False, name: str = "resnet"):
        super().__init__()
        norm_layer = make_norm(norm, model=name, groups=gn_groups)
        self.inplanes = 64
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
            self.maxpool: nn.Module = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        elif stem == "cifar":
            self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool = nn.Identity()
        else:
            raise SpecError(f"model {name}: stem={stem!r} is not one of 'imagenet', 'cifar'",
                            hint="use stem='cifar' for 32 px inputs, 'imagenet' otherwise")
        self.bn1 = norm_layer(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(block, 64, layers[0], 1, norm_layer)
        self.layer2 = self._make_layer(block, 128, layers[1], 2, norm_layer)
        self.layer3 = self._make_layer(block, 256, layers[2], 2, norm_layer)
        self.layer4 = self._make_layer(block, 512, layers[3], 2, norm_layer)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * block.expansion, num_classes)

        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.constant_(m.bn3.weight, 0)
                elif isinstance(m, BasicBlock):
                    nn.init.constant_(m.bn2.weight, 0)

    def _make_layer(self, block, planes: int, blocks: int, stride: int,
                    norm_layer: NormFactory) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       norm_layer(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample, norm_layer)]
        self.inplanes = planes * block.expansion
        for _ in range(1, blocks):
            layers.append(block(self.inplanes, planes, 1, None, norm_layer))
        return nn.Sequential(*layers)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return torch.flatten(self.avgpool(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.forward_features(x))


def resnet18(num_classes: int = 1000, *, norm: str = "batch", stem: str = "imagenet",
             zero_init_residual: bool = False) -> ResNet:
    """ResNet-18: 11,689,512 parameters at 1000 classes (imagenet stem)."""
    return ResNet(BasicBlock, [2, 2, 2, 2], num_classes=num_classes, norm=norm, stem=stem,
                  zero_init_residual=zero_init_residual, name="resnet18")


def resnet50(num_classes: int = 1000, *, norm: str = "batch", stem: str = "imagenet",
             zero_init_residual: bool = False) -> ResNet:
    """ResNet-50 (v1.5, stride in the 3x3): 25,557,032 parameters at 1000 classes (imagenet stem)."""
    return ResNet(Bottleneck, [3, 4, 6, 3], num_classes=num_classes, norm=norm, stem=stem,
                  zero_init_residual=zero_init_residual, name="resnet50")

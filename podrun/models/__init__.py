"""The model zoo: names, static facts (info) and build(); torch is imported only when a model is built.

    >>> from podrun import models
    >>> models.names()[:2]
    ['resnet18', 'resnet50']
    >>> m = models.build("resnet18", num_classes=10, stem="cifar")      # doctest: +SKIP
    >>> models.count_parameters(m)                                      # doctest: +SKIP

``names()`` and ``info()`` never import torch, so the planner and the specs can use them.
"""
from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from podrun.errors import SpecError

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn


@dataclass(frozen=True)
class ModelInfo:
    """Static facts about one model at its defaults (1000 classes)."""

    name: str
    family: str          # resnet | efficientnet | vit
    builder: str         # "module:function" under podrun.models
    params: int          # parameters at 1000 classes and default options (asserted by the tests)
    image_size: int      # native (evaluation) input size in pixels
    norm: str            # default normalisation: batch | group | layer
    note: str = ""


_M = "podrun.models"
_REGISTRY: dict[str, ModelInfo] = {m.name: m for m in [
    ModelInfo("resnet18", "resnet", f"{_M}.resnet:resnet18", 11_689_512, 224, "batch",
              "stem='cifar' for 32 px inputs (11,681,832 params)"),
    ModelInfo("resnet50", "resnet", f"{_M}.resnet:resnet50", 25_557_032, 224, "batch"),
    ModelInfo("efficientnet_b0", "efficientnet", f"{_M}.efficientnet:efficientnet", 5_288_548, 224, "batch"),
    ModelInfo("efficientnet_b1", "efficientnet", f"{_M}.efficientnet:efficientnet", 7_794_184, 240, "batch"),
    ModelInfo("efficientnet_b2", "efficientnet", f"{_M}.efficientnet:efficientnet", 9_109_994, 288, "batch",
              "288 px is torchvision's eval size; the paper uses 260"),
    ModelInfo("efficientnet_b3", "efficientnet", f"{_M}.efficientnet:efficientnet", 12_233_232, 300, "batch"),
    ModelInfo("efficientnet_b4", "efficientnet", f"{_M}.efficientnet:efficientnet", 19_341_616, 380, "batch"),
    ModelInfo("efficientnet_b5", "efficientnet", f"{_M}.efficientnet:efficientnet", 30_389_784, 456, "batch"),
    ModelInfo("efficientnet_b6", "efficientnet", f"{_M}.efficientnet:efficientnet", 43_040_704, 528, "batch"),
    ModelInfo("efficientnet_b7", "efficientnet", f"{_M}.efficientnet:efficientnet", 66_347_960, 600, "batch"),
    ModelInfo("efficientnet_b4_g16", "efficientnet", f"{_M}.efficientnet:efficientnet_b4_g16", 19_328_168,
              380, "group", "Graphcore G16: group size 16, expansion 4, GroupNorm(4) (arXiv 2106.03640)"),
    ModelInfo("vit_b16", "vit", f"{_M}.vit:vit_b16", 86_567_656, 224, "layer",
              "classifier='pooled' drops the class token: 86,566,120 params"),
]}


def names() -> list[str]:
    """Every model name build() accepts, in a stable order."""
    return list(_REGISTRY)


def _lookup(name: str) -> ModelInfo:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise SpecError(f"unknown model {name!r}",
                        hint="known models: " + ", ".join(_REGISTRY)) from None


def info(name: str) -> dict[str, Any]:
    """Facts for recipes: params (1000 classes, defaults), native image_size, default norm, family."""
    return {k: v for k, v in asdict(_lookup(name)).items() if k != "builder"}


def _builder(m: ModelInfo):
    module, _, attr = m.builder.partition(":")
    fn = getattr(importlib.import_module(module), attr)
    if attr == "efficientnet":  # the B0-B7 builder takes the variant name first
        return functools.partial(fn, m.name)
    return fn


def options(name: str) -> dict[str, Any]:
    """The keyword options build(name, ...) accepts, with their defaults."""
    params = inspect.signature(_builder(_lookup(name))).parameters
    return {k: p.default for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def build(name: str, num_classes: int = 1000, **kwargs: Any) -> "nn.Module":
    """Build model ``name`` (see names()) with fresh weights from torch's global RNG.

    Same ``torch.manual_seed`` before build -> bitwise-equal state_dicts (what large-batch recipes rely
    on to start every worker with equal weights without a broadcast). Unknown options raise SpecError.
    """
    m = _lookup(name)
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 1:
        raise SpecError(f"model {name}: num_classes={num_classes!r} is not a positive integer",
                        hint="e.g. 1000 for ImageNet, 10 for CIFAR-10")
    allowed = options(name)
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise SpecError(f"model {name}: unknown option(s) {', '.join(unknown)}",
                        hint="options for this model: " + ", ".join(f"{k}={v!r}" for k, v in allowed.items()))
    return _builder(m)(num_classes, **kwargs)


def count_parameters(model: "nn.Module", trainable_only: bool = False) -> int:
    """Number of parameters (shared ones once); ``trainable_only`` counts those with requires_grad."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


__all__ = ["ModelInfo", "build", "count_parameters", "info", "names", "options"]

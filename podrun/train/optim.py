"""Optimisers (LARS, SGD momentum, TF-style RMSProp, AdamW), LR schedules and the losses with label smoothing."""
from __future__ import annotations

import math

import torch
from torch import nn

from podrun.errors import SpecError


def _loss(closure):
    """An optimiser step's loss: ``closure``'s, computed with gradients on; None without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class LARS(torch.optim.Optimizer):
    """Layer-wise Adaptive Rate Scaling (You et al. 2017), as used by the large-batch ResNet/EfficientNet runs.

    For a parameter w with gradient g in a group with ``lars=True``:
        trust = eeta * ||w|| / (||g|| + wd * ||w||)   (1 when ||w|| or ||g|| is 0)
        v     = momentum * v + lr * trust * (g + wd * w)
        w     = w - v
    Groups with ``lars=False`` (bias and norm parameters, see param_groups_for) skip both the
    weight decay and the trust ratio: plain SGD with momentum.
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 eeta: float = 0.001, eps: float = 0.0, nesterov: bool = False):
        if lr < 0 or eeta <= 0:
            raise ValueError("LARS needs lr >= 0 and eeta > 0")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eeta=eeta, eps=eps,
                        nesterov=nesterov, lars=True)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = _loss(closure)
        for group in self.param_groups:
            # multi-tensor (foreach) ops: one kernel launch per step per group, not ~10 per parameter
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            lr, mom, wd, eeta = group["lr"], group["momentum"], group["weight_decay"], group["eeta"]
            if group["lars"]:
                w_norm = torch.stack(torch._foreach_norm(params))
                g_norm = torch.stack(torch._foreach_norm(grads))
                trust = torch.where((w_norm > 0) & (g_norm > 0),
                                    eeta * w_norm / (g_norm + wd * w_norm + group["eps"]),
                                    torch.ones_like(w_norm)) * lr
                updates = torch._foreach_add(grads, params, alpha=wd) if wd else [g.clone() for g in grads]
                torch._foreach_mul_(updates, list(trust.unbind(0)))
            else:
                updates = torch._foreach_mul(grads, lr)
            if mom != 0:
                bufs, fresh = [], []
                for p, u in zip(params, updates):
                    state = self.state[p]
                    if "momentum_buffer" in state:
                        bufs.append(state["momentum_buffer"])
                        fresh.append(u)
                    else:
                        state["momentum_buffer"] = u.clone()
                if bufs:
                    torch._foreach_mul_(bufs, mom)
                    torch._foreach_add_(bufs, fresh)
                all_bufs = [self.state[p]["momentum_buffer"] for p in params]
                if group["nesterov"]:
                    torch._foreach_add_(updates, all_bufs, alpha=mom)
                else:
                    updates = all_bufs
            torch._foreach_sub_(params, updates)
        return loss


class RMSpropTF(torch.optim.Optimizer):
    """RMSProp as TensorFlow defines it (the EfficientNet papers' optimiser).

    Differences from torch.optim.RMSprop: the square average starts at 1 (not 0), eps is added
    inside the square root, and the learning rate is applied inside the momentum buffer:
        ms  = rho * ms + (1 - rho) * g^2
        mom = momentum * mom + lr * g / sqrt(ms + eps)
        w   = w - mom
    """

    def __init__(self, params, lr: float, rho: float = 0.9, momentum: float = 0.9, eps: float = 1e-3,
                 weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, rho=rho, momentum=momentum, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = _loss(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if group["weight_decay"]:
                    g = g.add(p, alpha=group["weight_decay"])
                st = self.state[p]
                if not st:
                    st["square_avg"] = torch.ones_like(p)
                    st["momentum_buffer"] = torch.zeros_like(p)
                ms, buf = st["square_avg"], st["momentum_buffer"]
                ms.mul_(group["rho"]).addcmul_(g, g, value=1 - group["rho"])
                buf.mul_(group["momentum"]).addcdiv_(g, (ms + group["eps"]).sqrt_(), value=group["lr"])
                p.sub_(buf)
        return loss


def is_no_decay(name: str, param: torch.Tensor) -> bool:
    """Bias and normalisation parameters (any 0/1-d tensor) and ViT's tokens/embeddings."""
    return param.ndim <= 1 or name.endswith(".bias") or any(
        k in name for k in ("cls_token", "pos_embed", "position_embedding"))


def param_groups_for(model: nn.Module, weight_decay: float, exclude_bias_and_norm: bool = True) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if exclude_bias_and_norm and is_no_decay(name, p) else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay, "lars": True}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "lars": False})
    return groups


OPTIMIZERS = ("lars", "sgd", "rmsprop", "rmsprop_tf", "adamw")


def build_optimizer(model: nn.Module, name: str, lr: float, *, momentum: float = 0.9,
                    weight_decay: float = 0.0, eeta: float = 0.001, eps: float | None = None,
                    betas: tuple[float, float] = (0.9, 0.999), rho: float = 0.9,
                    nesterov: bool = False, exclude_bias_and_norm: bool = True,
                    fused: bool | None = None) -> torch.optim.Optimizer:
    name = name.lower().replace("-", "_")
    groups = param_groups_for(model, weight_decay, exclude_bias_and_norm)
    if name == "lars":
        return LARS(groups, lr=lr, momentum=momentum, weight_decay=weight_decay, eeta=eeta,
                    eps=0.0 if eps is None else eps, nesterov=nesterov)
    for g in groups:
        g.pop("lars", None)
    if name == "sgd":
        kw = {"fused": fused} if fused is not None else {}      # fused: one kernel for the whole step (CUDA)
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=nesterov and momentum > 0, **kw)
    if name in ("rmsprop", "rmsprop_tf"):
        return RMSpropTF(groups, lr=lr, rho=rho, momentum=momentum, eps=1e-3 if eps is None else eps)
    if name == "adamw":
        kw = {"fused": fused} if fused is not None else {"foreach": True}     # else multi-tensor apply
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=1e-8 if eps is None else eps, **kw)
    raise SpecError(f"unknown optimizer {name!r}", hint=f"use one of {', '.join(OPTIMIZERS)}")


def lr_factor(step: int, *, total_steps: int, warmup_steps: int, schedule: str = "cosine",
              power: float = 2.0, end_factor: float = 0.0, warmup_start: float = 0.0,
              step_every: int | None = None, gamma: float = 0.1) -> float:
    """Multiplier of the peak LR at update ``step`` (0-based): linear warmup then the decay."""
    if warmup_steps > 0 and step < warmup_steps:
        return warmup_start + (1.0 - warmup_start) * (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    t = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule in ("poly", "polynomial"):
        return end_factor + (1.0 - end_factor) * (1.0 - t) ** power
    if schedule == "cosine":
        return end_factor + (1.0 - end_factor) * 0.5 * (1.0 + math.cos(math.pi * t))
    if schedule == "step":
        every = step_every or max(1, decay_steps // 3)
        return gamma ** ((step - warmup_steps) // every)
    if schedule in ("constant", "none"):
        return 1.0
    raise SpecError(f"unknown schedule {schedule!r}", hint="use poly, cosine, step or constant")


def build_scheduler(optimizer: torch.optim.Optimizer, **kw) -> torch.optim.lr_scheduler.LambdaLR:
    lr_factor(0, **kw)  # validate the name now, not at the first step
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, **kw))


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor, smoothing: float = 0.0,
                       reduction: str = "mean") -> torch.Tensor:
    """Cross entropy against class indices or soft targets (mixup/cutmix), with label smoothing."""
    if target.ndim == 1:  # class indices: torch's fused path
        return torch.nn.functional.cross_entropy(logits.float(), target, label_smoothing=smoothing,
                                                 reduction=reduction)
    logp = torch.log_softmax(logits.float(), dim=-1)
    n = logits.shape[-1]
    if smoothing:
        target = target * (1.0 - smoothing) + smoothing / n
    loss = -(target * logp).sum(-1)
    return loss.mean() if reduction == "mean" else loss.sum() if reduction == "sum" else loss


def mix_batch(x: torch.Tensor, y: torch.Tensor, num_classes: int, generator: torch.Generator,
              mixup: float = 0.0, cutmix: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Mixup (alpha ``mixup``) or CutMix (alpha ``cutmix``), picked with equal odds when both are on.

    Randomness comes from ``generator`` (seeded per step by the runner, so resume is exact).
    Returns the mixed images and soft targets.
    """
    y1 = torch.nn.functional.one_hot(y, num_classes).float()
    if not (mixup or cutmix) or x.shape[0] < 2:
        return x, y1
    use_cut = cutmix > 0 and (mixup <= 0 or torch.rand((), generator=generator).item() < 0.5)
    alpha = cutmix if use_cut else mixup
    lam = _beta(alpha, generator)
    perm = torch.randperm(x.shape[0], generator=generator).to(x.device)
    if use_cut:
        h, w = x.shape[-2:]
        cut = math.sqrt(1.0 - lam)
        ch, cw = int(h * cut), int(w * cut)
        cy = int(torch.randint(h, (), generator=generator))
        cx = int(torch.randint(w, (), generator=generator))
        y0, y1_, x0, x1 = max(cy - ch // 2, 0), min(cy + ch // 2, h), max(cx - cw // 2, 0), min(cx + cw // 2, w)
        x = x.clone()
        x[..., y0:y1_, x0:x1] = x[perm][..., y0:y1_, x0:x1]
        lam = 1.0 - (y1_ - y0) * (x1 - x0) / (h * w)
    else:
        x = x * lam + x[perm] * (1.0 - lam)
    return x, y1 * lam + y1[perm.to(y1.device)] * (1.0 - lam)


def _beta(alpha: float, generator: torch.Generator) -> float:
    # Beta(a, a) from two Gammas via the seeded generator (torch's Beta has no generator argument); a torch
    # whose _standard_gamma takes no generator: the ratio of two uniforms
    try:
        a = torch._standard_gamma(torch.full((2,), float(alpha)), generator=generator)
    except TypeError:
        u = torch.rand(2, generator=generator)
        return float(u[0] / (u[0] + u[1] + 1e-12))
    return float(a[0] / (a[0] + a[1]))

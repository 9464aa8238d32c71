"""LARS against a hand computation, TF-style RMSProp, the schedules, label smoothing and mixup/cutmix."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from podrun.errors import SpecError
from podrun.train.optim import (LARS, RMSpropTF, build_optimizer, build_scheduler, lr_factor, mix_batch,
                                param_groups_for, soft_cross_entropy)


def test_lars_matches_hand_computation():
    w = torch.tensor([3.0, 4.0])            # ||w|| = 5
    g = torch.tensor([0.6, 0.8])            # ||g|| = 1
    b = torch.tensor([1.0])                 # excluded (bias): plain SGD momentum
    w.grad, b.grad = g.clone(), torch.tensor([0.5])
    lr, mom, wd, eeta = 0.1, 0.9, 0.01, 0.001
    opt = LARS([{"params": [w], "lars": True, "weight_decay": wd},
                {"params": [b], "lars": False, "weight_decay": 0.0}], lr=lr, momentum=mom, weight_decay=wd, eeta=eeta)
    opt.step()
    trust = eeta * 5.0 / (1.0 + wd * 5.0)                    # 0.005 / 1.05
    v1 = lr * trust * (torch.tensor([0.6, 0.8]) + wd * torch.tensor([3.0, 4.0]))
    expect_w1 = torch.tensor([3.0, 4.0]) - v1
    torch.testing.assert_close(w.detach(), expect_w1)
    torch.testing.assert_close(b.detach(), torch.tensor([1.0 - lr * 0.5]))
    # second step: momentum buffer carries over, trust ratio recomputed from the new weights
    w.grad = g.clone()
    b.grad = torch.tensor([0.5])
    opt.step()
    wn = expect_w1.norm().item()
    trust2 = eeta * wn / (1.0 + wd * wn)
    v2 = mom * v1 + lr * trust2 * (g + wd * expect_w1)
    torch.testing.assert_close(w.detach(), expect_w1 - v2)
    torch.testing.assert_close(b.detach(), torch.tensor([1.0 - lr * 0.5 - (mom * lr * 0.5 + lr * 0.5)]))


def test_lars_zero_weight_uses_trust_one():
    w = torch.zeros(3)
    w.grad = torch.ones(3)
    LARS([w], lr=0.5, momentum=0.0, weight_decay=0.1, eeta=0.001).step()
    torch.testing.assert_close(w.detach(), torch.full((3,), -0.5))


def test_param_groups_exclude_bias_and_norm():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.GroupNorm(2, 4), nn.Linear(4, 2))
    groups = param_groups_for(m, 1e-4)
    decay = {id(p) for p in groups[0]["params"]}
    assert decay == {id(m[0].weight), id(m[3].weight)}
    assert groups[1]["weight_decay"] == 0.0 and groups[1]["lars"] is False
    assert len(groups[1]["params"]) == 6        # conv bias, bn w/b, gn w/b, linear bias


def test_rmsprop_tf_hand_computation():
    w = torch.tensor([1.0])
    w.grad = torch.tensor([2.0])
    RMSpropTF([w], lr=0.1, rho=0.9, momentum=0.5, eps=1e-3).step()
    ms = 0.9 * 1.0 + 0.1 * 4.0                      # starts at 1, not 0
    torch.testing.assert_close(w.detach(), torch.tensor([1.0 - 0.1 * 2.0 / math.sqrt(ms + 1e-3)]))


@pytest.mark.parametrize("name", ["lars", "sgd", "rmsprop", "adamw"])
def test_build_optimizer_steps(name):
    torch.manual_seed(0)
    m = nn.Linear(4, 2)
    opt = build_optimizer(m, name, 0.01, weight_decay=1e-4)
    before = m.weight.detach().clone()
    m(torch.randn(8, 4)).sum().backward()
    opt.step()
    assert not torch.equal(before, m.weight.detach())


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_fused_optimizers_match_the_unfused_steps(name):
    """fused=True (what the runner asks for on CUDA) is the same update as the default path; checked on
    CPU, where torch also has the fused kernels."""
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    b = copy.deepcopy(a)
    oa = build_optimizer(a, name, 0.05, weight_decay=1e-3, nesterov=True)
    ob = build_optimizer(b, name, 0.05, weight_decay=1e-3, nesterov=True, fused=True)
    assert ob.defaults.get("fused") is True and not oa.defaults.get("fused")
    for _ in range(3):
        x, t = torch.randn(8, 6), torch.randn(8, 3)
        for m, o in ((a, oa), (b, ob)):
            (m(x) - t).square().mean().backward()
            o.step()
            o.zero_grad(set_to_none=True)
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_unknown_optimizer_and_schedule_are_spec_errors():
    with pytest.raises(SpecError, match="unknown optimizer 'adagrad'"):
        build_optimizer(nn.Linear(2, 2), "adagrad", 0.1)
    with pytest.raises(SpecError, match="unknown schedule"):
        lr_factor(0, total_steps=10, warmup_steps=0, schedule="exp")


def test_schedules():
    kw = dict(total_steps=110, warmup_steps=10)
    assert [lr_factor(s, **kw, schedule="cosine") for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert lr_factor(10, **kw, schedule="cosine") == pytest.approx(1.0)
    assert lr_factor(60, **kw, schedule="cosine") == pytest.approx(0.5)
    assert lr_factor(110, **kw, schedule="cosine") == pytest.approx(0.0)
    assert lr_factor(60, **kw, schedule="poly", power=2, end_factor=1e-5) == pytest.approx(1e-5 + (1 - 1e-5) * 0.25)
    assert lr_factor(110, **kw, schedule="polynomial", power=2, end_factor=1e-5) == pytest.approx(1e-5)
    assert lr_factor(45, **kw, schedule="step", step_every=30, gamma=0.1) == pytest.approx(0.1)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=2.0)
    sched = build_scheduler(opt, total_steps=20, warmup_steps=4, schedule="cosine")
    seen = []
    for _ in range(20):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen[:4] == pytest.approx([0.5, 1.0, 1.5, 2.0]) and seen[-1] < 0.1


def test_label_smoothing_and_soft_targets():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.0]])
    y = torch.tensor([0, 1])
    torch.testing.assert_close(soft_cross_entropy(logits, y, 0.1),
                               nn.functional.cross_entropy(logits, y, label_smoothing=0.1))
    soft = nn.functional.one_hot(y, 3).float()
    torch.testing.assert_close(soft_cross_entropy(logits, soft), nn.functional.cross_entropy(logits, y))


@pytest.mark.parametrize("mixup,cutmix", [(0.2, 0.0), (0.0, 0.85), (0.2, 0.85)])
def test_mixup_cutmix_targets_sum_to_one_and_are_seeded(mixup, cutmix):
    x = torch.rand(8, 3, 16, 16)
    y = torch.arange(8) % 4
    a = mix_batch(x, y, 4, torch.Generator().manual_seed(5), mixup, cutmix)
    b = mix_batch(x, y, 4, torch.Generator().manual_seed(5), mixup, cutmix)
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[1].sum(-1), torch.ones(8))
    assert a[0].shape == x.shape and not torch.equal(a[1], nn.functional.one_hot(y, 4).float())

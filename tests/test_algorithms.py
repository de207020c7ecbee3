"""GRPO advantages, PPO-clip loss and loss aggregation on hand-computed cases."""

import math

import pytest
import torch

from asyncrl.trainer.algorithms import agg_loss, grpo_advantages, kl_k3, ppo_clip_loss


def test_grpo_advantages():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    adv = grpo_advantages(r, ["a", "a", "a", "a", "b", "b"])
    std = torch.tensor([1.0, 0, 0, 0]).std()
    assert adv[0].item() == pytest.approx(((1 - 0.25) / (std + 1e-6)).item(), rel=1e-5)
    assert adv[1].item() == pytest.approx(((0 - 0.25) / (std + 1e-6)).item(), rel=1e-5)
    assert adv[4] == 0 and adv[5] == 0  # all-equal group -> no signal
    dr = grpo_advantages(r, ["a"] * 4 + ["b"] * 2, norm_by_std=False)
    assert dr[0].item() == pytest.approx(0.75)


def test_ppo_clip_loss_on_policy_gradient_equals_advantage():
    logp = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0]])
    loss, m = ppo_clip_loss(logp, logp.detach(), torch.tensor([2.0]), mask)
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -1.0]]))  # d(-A*ratio)/dlogp / 2 tokens
    assert m["actor/pg_clipfrac"] == 0.0


def test_ppo_clip_is_clipped_above():
    old = torch.zeros(1, 1)
    new = torch.full((1, 1), math.log(2.0), requires_grad=True)
    loss, m = ppo_clip_loss(new, old, torch.tensor([1.0]), torch.ones(1, 1), 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.28)
    assert m["actor/pg_clipfrac"] == 1.0
    loss.backward()
    assert new.grad.abs().sum() == 0  # clipped -> no gradient


def test_agg_modes_and_mask():
    loss = torch.tensor([[1.0, 3.0, 100.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(2.0)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)
    with pytest.raises(ValueError):
        agg_loss(loss, mask, "nope")


def test_kl_k3_zero_when_equal_and_positive_otherwise():
    a = torch.log(torch.tensor([[0.3, 0.6]]))
    assert torch.allclose(kl_k3(a, a), torch.zeros_like(a))
    assert (kl_k3(a, a - 0.5) > 0).all()

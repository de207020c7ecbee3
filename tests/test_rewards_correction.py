"""Reward shaping, KL in the reward with its controllers, and rollout correction, on hand-worked cases."""

import math
from types import SimpleNamespace

import pytest
import torch

from asyncrl.config_algorithm import KLControlConfig, RolloutCorrectionConfig
from asyncrl.trainer.rewards import (AdaptiveKLController, FixedKLController, has_signal, make_kl_controller,
                                     overlong_penalty, token_level_rewards)
from asyncrl.trainer.rollout_correction import rollout_correction


def test_overlong_penalty_by_hand():
    # cap 24, buffer 4: no penalty up to 20 tokens, then -1/4 per token, -1 x factor at the cap
    pen = overlong_penalty(torch.tensor([10, 20, 21, 22, 24]), 24, 4, 1.0)
    assert pen.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0])
    assert overlong_penalty(torch.tensor([24]), 24, 4, 0.5).item() == pytest.approx(-0.5)


def test_kl_in_reward_and_controllers():
    mask = torch.ones(1, 2)
    old = torch.tensor([[-1.0, -1.0]])
    ref = torch.tensor([[-2.0, -1.0]])
    ctrl = FixedKLController(0.1)
    r, m = token_level_rewards(torch.tensor([1.0]), mask, old, ref, ctrl, "k1")
    assert r.tolist()[0] == pytest.approx([-0.1, 1.0])  # k1 = old - ref = [1, 0]; score on the last token
    assert m["actor/reward_kl_penalty"] == pytest.approx(0.5) and m["actor/reward_kl_penalty_coeff"] == 0.1
    ada = AdaptiveKLController(0.1, target_kl=0.1, horizon=10)
    ada.update(0.5, n_steps=1)  # error 4 clipped to .2 -> x (1 + .2 / 10)
    assert ada.value == pytest.approx(0.102)
    ada.update(0.05, n_steps=5)  # error -.5 clipped to -.2 -> x (1 - .2 * 5 / 10)
    assert ada.value == pytest.approx(0.102 * 0.9)
    assert isinstance(make_kl_controller(KLControlConfig(type="adaptive")), AdaptiveKLController)
    r2, m2 = token_level_rewards(torch.tensor([1.0]), mask)
    assert r2.tolist()[0] == [0.0, 1.0] and m2 == {}


def test_has_signal():
    assert not has_signal([0.9] * 8) and has_signal([1.0, 0.0, 1.0])


def _rc(**kw):
    return RolloutCorrectionConfig(bypass_mode=False, **kw)


def test_rollout_correction_by_hand():
    # rho = pi_old / pi_rollout = [2, 1] on one sequence of two tokens
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    rollout = torch.log(torch.tensor([[0.25, 0.5]]))
    mask = torch.ones(1, 2)
    w, keep, m = rollout_correction(old, rollout, mask, _rc(rollout_is="token", rollout_is_threshold=1.5))
    assert w.tolist()[0] == pytest.approx([1.5, 1.0]) and keep.tolist()[0] == [1.0, 1.0]
    assert m["rollout_corr/kl_k1"] == pytest.approx(-math.log(2) / 2)
    assert m["rollout_corr/kl_k3"] == pytest.approx((1 - math.log(2)) / 2)
    assert m["rollout_corr/ratio_max"] == pytest.approx(2.0) and m["rollout_corr/is_truncated_frac"] == 0.5
    w, _, _ = rollout_correction(old, rollout, mask, _rc(rollout_is="sequence", rollout_is_threshold=1.5))
    assert w.tolist()[0] == pytest.approx([1.5, 1.5])  # prod rho = 2, truncated
    _, keep, m = rollout_correction(old, rollout, mask, _rc(rollout_rs="token", rollout_rs_threshold=1.5,
                                                            rollout_rs_threshold_lower=0.8))
    assert keep.tolist()[0] == [0.0, 1.0] and m["rollout_corr/rs_rejected_frac"] == 0.5
    _, keep, _ = rollout_correction(old, rollout, mask, _rc(rollout_rs="sequence", rollout_rs_threshold=1.5))
    assert keep.tolist()[0] == [0.0, 0.0]
    _, keep, _ = rollout_correction(old, rollout, mask, _rc(rollout_rs="geometric", rollout_rs_threshold=1.5))
    assert keep.tolist()[0] == [1.0, 1.0]  # geometric mean sqrt(2) = 1.41 < 1.5


def test_rollout_correction_counts_tokens_outside_the_trainers_support():
    from asyncrl.rollout.sampling import LOGP_FLOOR

    old = torch.tensor([[LOGP_FLOOR, -1.0]])
    w, keep, m = rollout_correction(old, torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2),
                                    _rc(rollout_is="token", rollout_rs="token"))
    assert m["rollout_corr/out_of_support"] == 1.0
    assert keep.tolist()[0] == [0.0, 1.0] and torch.isfinite(w).all()

"""Advantage estimators on hand-worked cases (to 1e-6), equal-reward groups, order invariance."""

import math
from types import SimpleNamespace

import pytest
import torch

from asyncrl.config_algorithm import ADV_ESTIMATORS as CONFIG_NAMES
from asyncrl.trainer.advantages import (ADV_ESTIMATORS, compute_advantages, discounted_returns, gae, group_centred,
                                        masked_whiten, outcome_token_rewards)


def algo(**kw):
    base = dict(norm_adv_by_std_in_grpo=True, gamma=1.0, lam=1.0)
    base.update(kw)
    return SimpleNamespace(**base)


def test_registry_matches_config_names():
    assert tuple(ADV_ESTIMATORS) == CONFIG_NAMES


def test_grpo_and_dr_grpo_by_hand():
    # group a: 1 0 0 0 -> mean .25, unbiased std .5; group b: 1 1 -> no signal
    scores = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    ids = ["a"] * 4 + ["b"] * 2
    adv = group_centred(scores, ids, norm_by_std=True)
    assert adv.tolist() == pytest.approx([0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6)] + [-0.25 / (0.5 + 1e-6)] * 2
                                         + [0.0, 0.0], abs=1e-6)
    assert group_centred(scores, ids).tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.0, 0.0], abs=1e-6)


@pytest.mark.parametrize("value,n", [(0.9, 8), (0.3, 6), (1 / 3, 5), (0.1, 16)])
@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_equal_rewards_give_exactly_zero(value, n, estimator):
    """8 x 0.9 gave -0.056 each (rounding in the mean over a ~1e-8 std); the right value is 0."""
    mask = torch.ones(n + 2, 3)
    scores = torch.tensor([value] * n + [0.0, 1.0])  # plus a group with signal, so whitening has a scale
    ids = ["eq"] * n + ["x", "x"]
    adv, _ = compute_advantages(estimator, outcome_token_rewards(scores, mask), mask, ids, algo())
    assert torch.all(adv[:n] == 0.0), adv[:n]
    assert adv[n:].abs().sum() > 0


def test_rloo_by_hand():
    adv = group_centred(torch.tensor([1.0, 0.0, 0.0, 0.0]), ["g"] * 4, leave_one_out=True)
    assert adv.tolist() == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3], abs=1e-6)  # r_i - mean of the others


def test_outcome_reward_on_last_model_token():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    r = outcome_token_rewards(torch.tensor([2.0, 3.0, 4.0, 5.0]), mask)
    assert r.tolist() == [[0, 2, 0], [3, 0, 0], [0, 0, 0], [0, 0, 5]]


def test_reinforce_pp_returns_and_whitening_by_hand():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    rewards = outcome_token_rewards(torch.tensor([1.0, 0.0]), mask)
    ret = discounted_returns(rewards, mask, 0.5)
    assert ret.flatten().tolist() == pytest.approx([0.25, 0.5, 1.0, 0.0, 0.0, 0.0])
    # a mask-0 (tool) token passes the return through, it does not cut it
    skip = discounted_returns(outcome_token_rewards(torch.tensor([1.0]), mask[1:]), mask[1:], 0.5)
    assert skip[0].tolist() == pytest.approx([0.5, 0.0, 1.0])
    # whitening over the 5 mask-1 tokens: mean .35, unbiased var .175
    adv, _ = compute_advantages("reinforce_plus_plus", rewards, mask, ["a", "b"], algo(gamma=0.5))
    assert adv[0, 0].item() == pytest.approx((0.25 - 0.35) / math.sqrt(0.175 + 1e-8), abs=1e-6)
    assert adv[1, 1].item() == 0.0 and float(adv[mask > 0].mean()) == pytest.approx(0.0, abs=1e-6)


def test_reinforce_pp_baseline_by_hand():
    mask = torch.ones(4, 2)
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])  # group a: +.5 -.5; group b: 0 0
    adv, _ = compute_advantages("reinforce_plus_plus_baseline", outcome_token_rewards(scores, mask), mask,
                                ["a", "a", "b", "b"], algo())
    # centred tokens .5 .5 -.5 -.5 0 0 0 0: mean 0, unbiased var = 4 * .25 / 7
    want = 0.5 / math.sqrt(1.0 / 7 + 1e-8)
    assert adv[0].tolist() == pytest.approx([want, want], abs=1e-6)
    assert adv[2:].abs().sum() == 0


def test_gae_by_hand():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    m = torch.ones(1, 3)
    adv, ret = gae(r, v, m, gamma=1.0, lam=1.0)
    assert adv.tolist()[0] == pytest.approx([0.5, 0.4, 0.3]) and ret.tolist()[0] == pytest.approx([1.0, 1.0, 1.0])
    adv, _ = gae(r, v, m, gamma=1.0, lam=0.5)
    assert adv.tolist()[0] == pytest.approx([0.225, 0.25, 0.3])
    # a mask-0 token in the middle is skipped: its value and reward do not enter the recursion
    adv, _ = gae(r, torch.tensor([[0.5, 9.0, 0.7]]), torch.tensor([[1.0, 0.0, 1.0]]), gamma=1.0, lam=0.5)
    assert adv.tolist()[0] == pytest.approx([0.2 + 0.5 * 0.3, 0.0, 0.3])
    with pytest.raises(ValueError, match="critic"):
        compute_advantages("gae", r, m, [0], algo())


def test_masked_whiten_ignores_mask_zero():
    x = torch.tensor([[1.0, 100.0, 3.0]])
    w = masked_whiten(x, torch.tensor([[1.0, 0.0, 1.0]]))
    assert w.tolist()[0] == pytest.approx([-1 / math.sqrt(2 + 1e-8), 0.0, 1 / math.sqrt(2 + 1e-8)])


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_order_of_samples_in_a_group_does_not_matter(estimator):
    g = torch.Generator().manual_seed(1)
    mask = (torch.rand(6, 5, generator=g) > 0.2).float()
    mask[:, 0] = 1
    scores = torch.tensor([0.3, 0.9, 0.1, 1.0, 0.0, 0.5])
    ids = ["a", "a", "a", "b", "b", "b"]
    perm = [2, 0, 1, 5, 3, 4]
    adv, _ = compute_advantages(estimator, outcome_token_rewards(scores, mask), mask, ids, algo())
    adv_p, _ = compute_advantages(estimator, outcome_token_rewards(scores[perm], mask[perm]), mask[perm],
                                  [ids[i] for i in perm], algo())
    assert torch.allclose(adv[perm], adv_p, atol=1e-6)


def test_advantage_metrics_average_over_response_tokens_only():
    from asyncrl.trainer.advantages import advantage_metrics

    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, -3.0, 99.0], [2.0, 99.0, 99.0]])
    ret = torch.tensor([[0.5, 0.5, 99.0], [2.0, 99.0, 99.0]])
    m = advantage_metrics(mask, torch.tensor([1.0, 0.0]), adv, ret)
    assert m == {"critic/score_mean": 0.5, "critic/advantages_mean": 0.0, "critic/advantages_abs_mean": 2.0,
                 "critic/returns_mean": 1.0}
    empty = advantage_metrics(torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), torch.ones(1, 2))
    assert empty["critic/advantages_mean"] == 0.0 and empty["critic/score_mean"] == 1.0

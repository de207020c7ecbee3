"""Advantage estimators (verl ``algorithm.adv_estimator`` names), pure tensor functions.

Every estimator takes token-level rewards ``(batch, resp_len)`` (the outcome score on the last
model token, plus per-token KL penalties when ``algorithm.use_kl_in_reward``), the response mask
and the prompt-group ids, and returns ``(advantages, returns)``, both ``(batch, resp_len)``, 0 on
mask-0 tokens. Sources:

- ``grpo``: ``(s_i - mean_g) / (std_g + eps)`` (Shao et al. 2024, DeepSeekMath); without the std
  division (``norm_adv_by_std_in_grpo=False``) it is Dr.GRPO's advantage (Liu et al. 2025).
- ``rloo``: ``s_i - mean_{j != i} s_j`` (Ahmadian et al. 2024, arXiv:2402.14740).
- ``reinforce_plus_plus``: discounted return-to-go of the token rewards, whitened over the batch
  (Hu 2025, arXiv:2501.03262).
- ``reinforce_plus_plus_baseline``: ``s_i - mean_g``, broadcast to tokens, whitened over the batch.
- ``gae``: generalised advantage estimation with a critic's values (Schulman et al. 2016),
  whitened over the batch; ``returns = advantages (before whitening) + values``.

Group statistics are exact for equal scores: a group whose scores are all equal gets advantage 0
exactly (``8 x 0.9`` would otherwise leave ``-0.056`` from rounding in the mean divided by a tiny
std), and means are taken in float64. Mask-0 tokens (tool output inside a multi-turn response) are
skipped by the return / GAE recursions: they neither add reward nor cut the flow of later rewards
to earlier model tokens.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Optional, Sequence

import torch

WHITEN_EPS = 1e-8


def outcome_token_rewards(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each response's scalar score on its last mask-1 token: ``(batch,)`` -> ``(batch, resp_len)``.

    A response without mask-1 tokens gets no reward anywhere (it trains nothing).
    """
    out = torch.zeros(mask.shape, dtype=torch.float32)
    m = mask > 0
    has = m.any(-1)
    last = (m.long() * torch.arange(1, mask.shape[-1] + 1)).argmax(-1)
    rows = torch.nonzero(has).squeeze(-1)
    out[rows, last[rows]] = scores.float()[rows]
    return out


def _groups(group_ids: Sequence) -> list[list[int]]:
    idx: dict = defaultdict(list)
    for i, g in enumerate(group_ids):
        idx[g].append(i)
    return list(idx.values())


def group_centred(scores: torch.Tensor, group_ids: Sequence, norm_by_std: bool = False, eps: float = 1e-6,
                  leave_one_out: bool = False) -> torch.Tensor:
    """``s_i`` minus its group's mean (or the mean of the others), optionally over the group std.

    Args:
        scores: ``(batch,)`` one scalar per response.
        group_ids: ``batch`` hashables; a prompt's responses share one.
        norm_by_std: divide by the (unbiased) group std + ``eps``.
        leave_one_out: RLOO baseline ``mean_{j != i}``; equals ``n/(n-1) (s_i - mean)``.

    Returns:
        ``(batch,)`` float32; exactly 0 for groups of one response or of equal scores.
    """
    s = scores.double()
    out = torch.zeros_like(s)
    for idx in _groups(group_ids):
        g = s[idx]
        if len(idx) < 2 or bool((g == g[0]).all()):
            continue  # no baseline / no signal: exactly zero, not rounding noise
        c = g - g.mean()
        if leave_one_out:
            c = c * len(idx) / (len(idx) - 1)
        if norm_by_std:
            c = c / (g.std() + eps)
        out[idx] = c
    return out.float()


def masked_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(x - mean) / sqrt(var + 1e-8)`` over mask-1 entries (unbiased var, verl ``masked_whiten``); 0 off-mask."""
    m = mask.double()
    n = m.sum()
    if n < 1:
        return torch.zeros_like(x)
    xd = x.double()
    mean = (xd * m).sum() / n
    var = ((xd - mean).square() * m).sum() / n
    if n > 1:
        var = var * n / (n - 1)
    return ((xd - mean) * torch.rsqrt(var + WHITEN_EPS) * m).to(x.dtype)


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return-to-go over mask-1 tokens: ``G_t = r_t + gamma * G_{t'}``, ``t'`` the next mask-1 token."""
    out = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype)
    for t in reversed(range(token_rewards.shape[1])):
        m = mask[:, t].to(token_rewards.dtype)
        running = m * (token_rewards[:, t] + gamma * running) + (1 - m) * running
        out[:, t] = running * m
    return out


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over mask-1 tokens (mask-0 tokens are skipped, as verl does for observations).

    ``delta_t = r_t + gamma V_{t'} - V_t``, ``A_t = delta_t + gamma lam A_{t'}`` with ``t'`` the next
    mask-1 token (``V = 0``, ``A = 0`` after the last one).

    Returns:
        ``(advantages, returns)`` before whitening, ``returns = advantages + values``; 0 off-mask.
    """
    b, n = token_rewards.shape
    adv = torch.zeros_like(token_rewards)
    next_v = torch.zeros(b, dtype=token_rewards.dtype)
    next_a = torch.zeros(b, dtype=token_rewards.dtype)
    for t in reversed(range(n)):
        m = mask[:, t].to(token_rewards.dtype)
        delta = token_rewards[:, t] + gamma * next_v - values[:, t]
        a = delta + gamma * lam * next_a
        adv[:, t] = a * m
        next_v = m * values[:, t] + (1 - m) * next_v
        next_a = m * a + (1 - m) * next_a
    m = mask.to(token_rewards.dtype)
    return adv, (adv + values) * m


# ------------------------------------------------------------------ the estimators
def _grpo(token_rewards, mask, group_ids, values, cfg):
    a = group_centred(token_rewards.sum(-1), group_ids, norm_by_std=cfg.norm_adv_by_std_in_grpo)
    a = a.unsqueeze(-1) * mask
    return a, a


def _rloo(token_rewards, mask, group_ids, values, cfg):
    a = group_centred(token_rewards.sum(-1), group_ids, leave_one_out=True).unsqueeze(-1) * mask
    return a, a


def _reinforce_pp(token_rewards, mask, group_ids, values, cfg):
    returns = discounted_returns(token_rewards, mask, cfg.gamma)
    return masked_whiten(returns, mask), returns


def _reinforce_pp_baseline(token_rewards, mask, group_ids, values, cfg):
    a = group_centred(token_rewards.sum(-1), group_ids).unsqueeze(-1) * mask
    return masked_whiten(a, mask), a


def _gae(token_rewards, mask, group_ids, values, cfg):
    if values is None:
        raise ValueError("adv_estimator=gae needs the critic's values")
    adv, returns = gae(token_rewards, values, mask, cfg.gamma, cfg.lam)
    return masked_whiten(adv, mask), returns


ADV_ESTIMATORS: dict[str, Callable] = {
    "grpo": _grpo, "rloo": _rloo, "reinforce_plus_plus": _reinforce_pp,
    "reinforce_plus_plus_baseline": _reinforce_pp_baseline, "gae": _gae,
}
"""verl names of the estimators; ``gae`` needs a critic (``critic.*``)."""
GROUP_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline")
"""Estimators whose baseline is the prompt group (need ``rollout.n >= 2``)."""


def compute_advantages(estimator: str, token_rewards: torch.Tensor, mask: torch.Tensor, group_ids: Sequence,
                       algorithm_cfg, values: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the named estimator.

    Args:
        estimator: one of :data:`ADV_ESTIMATORS`.
        token_rewards: ``(batch, resp_len)`` (see :func:`outcome_token_rewards`).
        mask: ``(batch, resp_len)`` response mask.
        group_ids: ``batch`` prompt-group ids.
        algorithm_cfg: :class:`asyncrl.config.AlgorithmConfig` (``gamma``, ``lam``,
            ``norm_adv_by_std_in_grpo``).
        values: ``(batch, resp_len)`` critic values (``gae`` only).

    Returns:
        ``(advantages, returns)``, ``(batch, resp_len)`` float32, 0 off-mask.

    Raises:
        ValueError: unknown estimator, or ``gae`` without values.
    """
    if estimator not in ADV_ESTIMATORS:
        raise ValueError(f"unknown adv_estimator {estimator!r}; valid: {', '.join(ADV_ESTIMATORS)}")
    return ADV_ESTIMATORS[estimator](token_rewards.float(), mask.float(), group_ids, values, algorithm_cfg)


def advantage_metrics(response_mask: torch.Tensor, scores: torch.Tensor, advantages: torch.Tensor,
                      returns: torch.Tensor) -> dict[str, float]:
    """verl's ``critic/*`` step metrics: mean score (``(B,)``), and the mean advantage, mean absolute
    advantage and mean return over response tokens (``(B, T)`` each, masked by ``response_mask``)."""
    m = response_mask > 0
    adv = advantages[m]
    if not adv.numel():
        return {"critic/score_mean": float(scores.mean()), "critic/advantages_mean": 0.0,
                "critic/advantages_abs_mean": 0.0, "critic/returns_mean": 0.0}
    return {"critic/score_mean": float(scores.mean()), "critic/advantages_mean": float(adv.mean()),
            "critic/advantages_abs_mean": float(adv.abs().mean()), "critic/returns_mean": float(returns[m].mean())}

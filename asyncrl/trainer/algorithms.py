"""Policy-gradient maths: GRPO advantages, PPO-clip loss, KL penalty, loss aggregation.

Pure tensor functions (no model, no Ray) so each is unit-tested on its own. Formulas:

- GRPO (Shao et al. 2024, DeepSeekMath): ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)``,
  broadcast to every response token; Dr.GRPO (Liu et al. 2025) drops the std division.
- PPO-clip (Schulman et al. 2017) with asymmetric clip-higher (DAPO, Yu et al. 2025):
  ``L = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)``, ``ratio = exp(logp - old_logp)``.
  In bypass mode the rollout engine's logprobs are the old logprobs (verl ``use_rollout_log_probs``).
- KL penalty: the k3 estimator ``exp(ref - logp) - (ref - logp) - 1`` (Schulman's "approximating KL").
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import torch


def grpo_advantages(rewards: torch.Tensor, group_ids: Sequence, norm_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised outcome advantages.

    Args:
        rewards: ``(batch,)`` float scalar reward per response.
        group_ids: ``batch`` hashables; responses of one prompt share an id.
        norm_by_std: divide by the group std (GRPO) or not (Dr.GRPO).
        eps: added to the std.

    Returns:
        ``(batch,)`` float32 advantages; 0 for groups of size 1 or with equal rewards.
    """
    rewards = rewards.float()
    groups: dict = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[g].append(i)
    adv = torch.zeros_like(rewards)
    for idx in groups.values():
        if len(idx) < 2:
            continue
        r = rewards[idx]
        centred = r - r.mean()
        adv[idx] = centred / (r.std() + eps) if norm_by_std else centred
    return adv


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """Aggregate a ``(batch, resp_len)`` per-token loss over mask-1 tokens.

    Modes (verl names): ``token-mean`` (all tokens weigh the same), ``seq-mean-token-mean``,
    ``seq-mean-token-sum``. Raises ``ValueError`` for another mode.
    """
    mask = mask.to(loss_mat.dtype)
    if mode == "token-mean":
        return (loss_mat * mask).sum() / mask.sum().clamp(min=1.0)
    seq_tok = (loss_mat * mask).sum(-1)
    if mode == "seq-mean-token-mean":
        seq_tok = seq_tok / mask.sum(-1).clamp(min=1.0)
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown loss_agg_mode {mode!r}")
    return seq_tok.mean()


def ppo_clip_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  clip_low: float = 0.2, clip_high: float = 0.2, agg_mode: str = "token-mean") -> tuple[torch.Tensor, dict]:
    """PPO clipped surrogate.

    Args:
        log_probs: ``(batch, resp_len)`` current-policy logprobs (requires grad).
        old_log_probs: ``(batch, resp_len)`` behaviour logprobs (rollout engine's in bypass mode).
        advantages: ``(batch, resp_len)`` or ``(batch,)`` (broadcast over tokens).
        mask: ``(batch, resp_len)`` response_mask (1 = model token).

    Returns:
        ``(loss, metrics)`` with ``actor/pg_clipfrac``, ``actor/ppo_kl`` (mean of old - new), ``actor/ratio_mean``.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_probs)
    log_ratio = (log_probs - old_log_probs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    loss = agg_loss(loss_mat, mask, agg_mode)
    m = mask.float()
    denom = m.sum().clamp(min=1.0)
    with torch.no_grad():
        metrics = {
            "actor/pg_clipfrac": float(((clipped > unclipped).float() * m).sum() / denom),
            "actor/ppo_kl": float((-log_ratio * m).sum() / denom),
            "actor/ratio_mean": float((ratio * m).sum() / denom),
        }
    return loss, metrics


def kl_k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || ref), ``(batch, resp_len)``, clamped to [-10, 10]."""
    d = (ref_log_probs - log_probs).clamp(-20.0, 20.0)
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)

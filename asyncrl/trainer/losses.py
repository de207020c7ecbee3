"""Policy / value / KL / entropy losses and their aggregation, exact under any micro-batch split.

Pure tensor functions (no model, no Ray). Formulas and sources:

- PPO clip (Schulman et al. 2017) with asymmetric clip-higher (DAPO, Yu et al. 2025) and dual clip
  (Ye et al. 2020, arXiv:1912.09729): for ``A < 0`` the loss is also capped at ``-A * clip_ratio_c``.
  ``ratio = exp(logp - old_logp)``, log-ratio clamped to ``[-20, 20]`` (verl).
- KL estimators of ``KL(pi || ref)`` per token (Schulman, "Approximating KL divergence", 2020):
  ``k1 = logp - ref``, ``k2 = (logp - ref)^2 / 2``, ``k3 = low_var_kl = exp(ref - logp) - (ref - logp) - 1``
  (clamped to ``[-10, 10]`` as verl), ``abs = |logp - ref|``.
- Clipped value loss (PPO2 / verl ``compute_value_loss``):
  ``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)``.

Aggregation (:func:`agg_loss`, verl ``loss_agg_mode`` names). With ``l`` the per-token loss, ``m`` the
loss mask, ``N`` the sequences with at least one mask-1 token and ``T`` the mask-1 tokens, all
counted over the **whole optimizer step** (every micro-batch, every rank):

=============================  ==============================================================
``token-mean``                 ``sum_i sum_t l m / T``
``seq-mean-token-mean``        ``sum_i (sum_t l m / n_i) / N``  (original GRPO)
``seq-mean-token-sum``         ``sum_i sum_t l m / N``
``seq-mean-token-sum-norm``    ``sum_i sum_t l m / (N * L)``, ``L`` a constant (Dr.GRPO, Liu et al. 2025,
                               eq. 3: ``1/G sum_i sum_t`` over a constant; verl's single-batch
                               formula omits ``1/N``, so its scale grows with the batch)
=============================  ==============================================================

Every mode is a sum over sequences of a per-sequence term divided by a step-wide constant, so the
micro-batch losses *add up* to the full-batch loss: an engine computes the step-wide
:class:`LossScale` once (:meth:`LossScale.of`, summed over ranks) and simply back-propagates each
micro-batch's loss. That is the one place both engines (``engine.py``, ``fsdp_engine.py``) take
the normaliser from; ``tests/test_losses.py`` checks every mode under every split to 1e-6.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from asyncrl.config_algorithm import KL_ESTIMATORS, LOSS_AGG_MODES


@dataclass(frozen=True)
class LossScale:
    """Step-wide normalisers of the aggregated loss (see the module table).

    Attributes:
        tokens: mask-1 tokens in the optimizer step (all micro-batches, all ranks).
        seqs: sequences with at least one mask-1 token in the step.
    """

    tokens: float
    seqs: float

    @classmethod
    def of(cls, mask: torch.Tensor, all_reduce: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> "LossScale":
        """Count ``mask`` ``(batch, resp_len)``; ``all_reduce`` sums a ``(2,)`` tensor over ranks (FSDP)."""
        m = mask.detach().float()
        counts = torch.stack([m.sum(), (m.sum(-1) > 0).float().sum()])
        if all_reduce is not None:
            counts = all_reduce(counts)
        tokens, seqs = counts.tolist()
        return cls(tokens=float(tokens), seqs=float(seqs))


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean", scale: Optional[LossScale] = None,
             loss_scale_factor: Optional[float] = None) -> torch.Tensor:
    """Aggregate a per-token loss into this micro-batch's share of the step's loss.

    Args:
        loss_mat: ``(batch, resp_len)`` per-token loss.
        mask: ``(batch, resp_len)`` loss mask (1 = counts).
        mode: one of :data:`LOSS_AGG_MODES`.
        scale: the step-wide normalisers; ``None`` = this batch is the whole step.
        loss_scale_factor: the constant ``L`` of ``seq-mean-token-sum-norm`` (e.g. the rollout's
            ``response_length``; never the padded width, which would make the loss depend on padding).

    Returns:
        A scalar; summing it over the step's micro-batches gives the full-batch loss.

    Raises:
        ValueError: unknown ``mode``, or ``seq-mean-token-sum-norm`` without ``loss_scale_factor``.
    """
    scale = scale if scale is not None else LossScale.of(mask)
    mask = mask.to(loss_mat.dtype)
    tok_sum = (loss_mat * mask).sum(-1)  # (batch,)
    if mode == "token-mean":
        return tok_sum.sum() / max(scale.tokens, 1.0)
    if mode == "seq-mean-token-mean":
        return (tok_sum / mask.sum(-1).clamp(min=1.0)).sum() / max(scale.seqs, 1.0)
    if mode == "seq-mean-token-sum":
        return tok_sum.sum() / max(scale.seqs, 1.0)
    if mode == "seq-mean-token-sum-norm":
        if not loss_scale_factor or loss_scale_factor <= 0:
            raise ValueError("seq-mean-token-sum-norm needs a positive loss_scale_factor (a constant length)")
        return tok_sum.sum() / (max(scale.seqs, 1.0) * float(loss_scale_factor))
    raise ValueError(f"unknown loss_agg_mode {mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Plain float mean of ``x`` over mask-1 entries (0.0 when the mask is empty); for metrics."""
    m = mask.float()
    return float((x.detach().float() * m).sum() / m.sum().clamp(min=1.0))


def ppo_clip_loss_mat(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                      mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
                      clip_ratio_c: Optional[float] = 3.0) -> tuple[torch.Tensor, dict]:
    """Per-token PPO-clip loss with clip-higher and dual clip.

    Args:
        log_probs: ``(batch, resp_len)`` current-policy log-probs (requires grad).
        old_log_probs: ``(batch, resp_len)`` behaviour (bypass) or recomputed old log-probs.
        advantages: ``(batch, resp_len)`` or ``(batch,)`` (broadcast over tokens).
        mask: ``(batch, resp_len)`` loss mask (only used for the metrics).
        clip_low / clip_high: ``ratio`` is clipped to ``[1 - clip_low, 1 + clip_high]``.
        clip_ratio_c: dual-clip bound (> 1) for negative advantages; ``None`` disables.

    Returns:
        ``(loss_mat (batch, resp_len), metrics)``; metrics ``actor/pg_clipfrac``,
        ``actor/pg_clipfrac_lower``, ``actor/ppo_kl`` (mean of old - new), ``actor/ratio_mean``.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_probs)
    log_ratio = (log_probs - old_log_probs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    lower = torch.zeros_like(loss_mat, dtype=torch.bool)
    if clip_ratio_c is not None:
        dual = -advantages * clip_ratio_c
        lower = (advantages < 0) & (loss_mat > dual)
        loss_mat = torch.where(advantages < 0, torch.minimum(loss_mat, dual), loss_mat)
    metrics = {
        "actor/pg_clipfrac": masked_mean((clipped > unclipped).float(), mask),
        "actor/pg_clipfrac_lower": masked_mean(lower.float(), mask),
        "actor/ppo_kl": masked_mean(-log_ratio, mask),
        "actor/ratio_mean": masked_mean(ratio, mask),
    }
    return loss_mat, metrics


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_type: str = "low_var_kl") -> torch.Tensor:
    """Per-token estimate of ``KL(pi || ref)`` from sampled-token log-probs, ``(batch, resp_len)``.

    ``kl_type``: ``k1``/``kl``, ``k2``/``mse``, ``k3``/``low_var_kl``, ``abs`` (module doc).
    Raises ``ValueError`` for another name.
    """
    d = (log_probs - ref_log_probs).clamp(-20.0, 20.0)
    if kl_type in ("k1", "kl"):
        return d
    if kl_type in ("k2", "mse"):
        return 0.5 * d.square()
    if kl_type in ("k3", "low_var_kl"):
        return (torch.exp(-d) + d - 1.0).clamp(-10.0, 10.0)
    if kl_type == "abs":
        return d.abs()
    raise ValueError(f"unknown kl type {kl_type!r}; valid: {', '.join(KL_ESTIMATORS)}")


def value_loss_mat(values: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor, mask: torch.Tensor,
                   cliprange_value: float) -> tuple[torch.Tensor, dict]:
    """Per-token clipped value loss ``0.5 * max((V - R)^2, (V_clip - R)^2)`` (module doc).

    Args:
        values: ``(batch, resp_len)`` current value predictions (requires grad).
        returns: ``(batch, resp_len)`` targets.
        old_values: ``(batch, resp_len)`` predictions when the batch was made.
        mask: ``(batch, resp_len)`` (metrics only).
        cliprange_value: ``c``.

    Returns:
        ``(loss_mat, metrics)`` with ``critic/vf_clipfrac``, ``critic/vpred_mean``.
    """
    v_clip = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
    l1, l2 = (values - returns).square(), (v_clip - returns).square()
    return 0.5 * torch.maximum(l1, l2), {"critic/vf_clipfrac": masked_mean((l2 > l1).float(), mask),
                                         "critic/vpred_mean": masked_mean(values, mask)}

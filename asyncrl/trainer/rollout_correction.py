"""Rollout correction: weigh or reject stale / mismatched tokens (verl ``algorithm.rollout_correction``).

Three policies meet in an asynchronous step: ``pi_rollout`` (the engine that sampled, possibly
several versions ago, in another numeric precision), ``pi_old`` (the trainer's weights at the start
of the step) and ``pi_theta`` (being optimised).

- **Bypass mode** (``bypass_mode=true``, default): ``pi_old := pi_rollout``; PPO's ratio
  ``pi_theta / pi_rollout`` absorbs the staleness, and its clip bounds how far one step moves. Cheapest
  (no extra forward). Right when staleness is small (mode a/b, or ``staleness_threshold`` <~ 0.5).
- **Decoupled mode** (``bypass_mode=false``): the trainer recomputes ``pi_old`` (one forward pass per
  step); PPO clips ``pi_theta / pi_old`` (the trust region is about the trainer's own step), and the
  gap ``pi_old / pi_rollout`` is handled here (Hilton et al. 2021, "decoupled PPO"; AReaL):

  - ``rollout_is``: truncated importance sampling (TIS, Yao et al. 2025; Espeholt et al. 2018):
    the per-token loss is multiplied by ``w = min(rho, rollout_is_threshold)``; ``token``:
    ``rho_t = pi_old(y_t) / pi_rollout(y_t)``; ``sequence``: ``rho = prod_t rho_t`` for every token
    of the sequence (unbiased but high variance).
  - ``rollout_rs``: rejection (masked IS, MIS): tokens / sequences whose ratio leaves
    ``[lower, upper]`` get mask 0 (and leave the loss normaliser): ``token`` per token,
    ``sequence`` on ``prod_t rho_t``, ``geometric`` on ``exp(mean_t log rho_t)`` (length-free;
    use bounds close to 1, e.g. 1.001).

  Use it when staleness is large (``staleness_threshold >= 1``, long partial rollouts), or when
  ``rollout_corr/kl_k3`` stays high even at staleness 0 (a rollout/trainer precision mismatch, e.g.
  bf16 vLLM vs fp32 trainer).

Per-step mismatch metrics (decoupled mode), over mask-1 tokens, with ``log rho = log pi_old - log
pi_rollout`` clamped to [-20, 20]: ``rollout_corr/kl_k1`` (``mean(-log rho)``, estimates
KL(rollout || old)), ``rollout_corr/kl_k3`` (``mean(rho - 1 - log rho)``, low variance),
``rollout_corr/ratio_mean|max|min``, ``rollout_corr/abs_log_ratio_max``, ``rollout_corr/out_of_support``
(tokens the trainer's filtered distribution gives probability 0), ``rollout_corr/is_weight_mean``,
``rollout_corr/is_truncated_frac``, ``rollout_corr/is_ess`` (normalised effective sample size
``(sum w)^2 / (n sum w^2)``), ``rollout_corr/rs_rejected_frac``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from asyncrl.rollout.sampling import LOGP_FLOOR

SAFETY_BOUND = 20.0


def _seq_sum(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return (x * m).sum(-1)


def mismatch_metrics(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor) -> dict:
    """The ``rollout_corr/*`` diagnostics of the module doc (no weights applied)."""
    m = mask.float()
    n = m.sum().clamp(min=1.0)
    lr = (old_log_probs - rollout_log_probs).clamp(-SAFETY_BOUND, SAFETY_BOUND) * m
    ratio = torch.exp(lr)
    on = m > 0
    return {
        "rollout_corr/kl_k1": float(_seq_sum(-lr, m).sum() / n),
        "rollout_corr/kl_k3": float(((ratio - 1.0 - lr) * m).sum() / n),
        "rollout_corr/ratio_mean": float((ratio * m).sum() / n),
        "rollout_corr/ratio_max": float(ratio[on].max()) if on.any() else 1.0,
        "rollout_corr/ratio_min": float(ratio[on].min()) if on.any() else 1.0,
        "rollout_corr/abs_log_ratio_max": float(lr.abs().max()) if on.any() else 0.0,
        "rollout_corr/out_of_support": float(((old_log_probs <= LOGP_FLOOR) & on).sum()),
    }


def rollout_correction(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor,
                       cfg: Any) -> tuple[Optional[torch.Tensor], torch.Tensor, dict]:
    """IS weights and rejection mask for a step (decoupled mode).

    Args:
        old_log_probs: ``(batch, resp_len)`` trainer log-probs at the start of the step.
        rollout_log_probs: ``(batch, resp_len)`` the engine's log-probs of the same tokens.
        mask: ``(batch, resp_len)`` response mask.
        cfg: :class:`asyncrl.config_algorithm.RolloutCorrectionConfig`.

    Returns:
        ``(is_weights or None, keep_mask, metrics)``: ``is_weights`` ``(batch, resp_len)`` detached
        (``None`` when ``rollout_is`` is off), ``keep_mask`` ``(batch, resp_len)`` float with the
        rejected tokens at 0 (multiply it into the loss mask), and :func:`mismatch_metrics` plus the
        IS / RS statistics.
    """
    m = mask.float()
    metrics = mismatch_metrics(old_log_probs, rollout_log_probs, mask)
    lr = (old_log_probs - rollout_log_probs).clamp(-SAFETY_BOUND, SAFETY_BOUND) * m
    seq_lr = _seq_sum(lr, m).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    on = m > 0
    weights = None
    if cfg.rollout_is:
        rho = torch.exp(lr) if cfg.rollout_is == "token" else torch.exp(seq_lr).unsqueeze(-1).expand_as(lr)
        weights = (rho.clamp(max=cfg.rollout_is_threshold) * m).detach()
        w = weights[on]
        metrics["rollout_corr/is_weight_mean"] = float(w.mean()) if w.numel() else 1.0
        metrics["rollout_corr/is_truncated_frac"] = float((rho[on] > cfg.rollout_is_threshold).float().mean()) if w.numel() else 0.0
        metrics["rollout_corr/is_ess"] = float(w.sum() ** 2 / (w.numel() * w.square().sum())) if w.numel() else 1.0
    keep = m.clone()
    if cfg.rollout_rs:
        upper = cfg.rollout_rs_threshold if cfg.rollout_rs_threshold is not None else cfg.rollout_is_threshold
        lower = cfg.rollout_rs_threshold_lower if cfg.rollout_rs_threshold_lower is not None else 1.0 / upper
        lo, hi = torch.log(torch.tensor(lower)), torch.log(torch.tensor(upper))
        if cfg.rollout_rs == "token":
            stat = lr
        elif cfg.rollout_rs == "sequence":
            stat = seq_lr.unsqueeze(-1).expand_as(lr)
        else:  # geometric
            stat = (seq_lr / m.sum(-1).clamp(min=1.0)).unsqueeze(-1).expand_as(lr)
        keep = keep * ((stat >= lo) & (stat <= hi)).float()
        metrics["rollout_corr/rs_rejected_frac"] = float(((m - keep) * m).sum() / m.sum().clamp(min=1.0))
    return weights, keep, metrics

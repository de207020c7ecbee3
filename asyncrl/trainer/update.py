"""The update step of ``fit_step``: mini-batches of whole prompt groups -> actor (and critic) optimizer steps.

::

    batch (required_samples prompt groups, extras: old_log_probs, advantages, [ref_log_probs],
           [is_weights], [values, returns])
      -> split into require_batches mini-batches of whole groups
      -> for each of ppo_epochs passes, for each mini-batch: engine.update(mini_batch, loss_fn)
         (one optimizer step; the engine micro-batches and normalises with the mini-batch's LossScale)

The actor loss (verl ``dp_actor``): ``agg(w * ppo_clip) - entropy_coeff * agg(entropy)
+ kl_loss_coef * agg(kl(pi, ref))``, with ``w`` the rollout-correction IS weights (1 when off) and
every ``agg`` the configured ``loss_agg_mode`` (:func:`asyncrl.trainer.losses.agg_loss`).
"""

from __future__ import annotations

import collections
from typing import Any, Optional

import numpy as np
import torch

from asyncrl.trainer.engine import Batch, LossFn
from asyncrl.trainer.losses import LossScale, agg_loss, kl_penalty, masked_mean, ppo_clip_loss_mat, value_loss_mat


def mini_batches(batch: Batch, n: int) -> list[list[int]]:
    """Row indices of ``n`` mini-batches of whole prompt groups (in arrival order, sizes differ by <= 1 group)."""
    groups = list(dict.fromkeys(batch.group_ids))
    rows_of = collections.defaultdict(list)
    for i, g in enumerate(batch.group_ids):
        rows_of[g].append(i)
    per = max(1, -(-len(groups) // max(1, n)))
    return [[i for g in groups[s:s + per] for i in rows_of[g]] for s in range(0, len(groups), per)]


def actor_loss_fn(cfg: Any) -> LossFn:
    """The actor's ``loss_fn(log_probs, micro_batch, scale, entropy)`` for :meth:`TrainEngine.update`.

    Reads ``old_log_probs``, ``advantages`` and, when present, ``is_weights`` / ``ref_log_probs``
    from the micro-batch's ``extras``. Metrics are of the micro-batch (the engine averages them).
    """
    ac = cfg.actor_rollout_ref.actor
    factor = ac.loss_scale_factor or cfg.actor_rollout_ref.rollout.response_length

    def agg(mat: torch.Tensor, mask: torch.Tensor, scale: Optional[LossScale]) -> torch.Tensor:
        return agg_loss(mat, mask, ac.loss_agg_mode, scale, factor)

    def loss_fn(log_probs: torch.Tensor, mb: Batch, scale: LossScale, entropy: Optional[torch.Tensor]):
        mask, ex = mb.response_mask, mb.extras
        pg_mat, m = ppo_clip_loss_mat(log_probs, ex["old_log_probs"], ex["advantages"], mask,
                                      ac.clip_ratio_low, ac.clip_ratio_high, ac.clip_ratio_c)
        if "is_weights" in ex:
            pg_mat = pg_mat * ex["is_weights"]
        loss = agg(pg_mat, mask, scale)
        m["actor/pg_loss"] = float(agg(pg_mat.detach(), mask, None))
        if ac.entropy_coeff and entropy is not None:
            loss = loss - ac.entropy_coeff * agg(entropy, mask, scale)
        if entropy is not None:
            m["actor/entropy"] = masked_mean(entropy, mask)
        if "ref_log_probs" in ex and ac.use_kl_loss:
            kl_mat = kl_penalty(log_probs, ex["ref_log_probs"], ac.kl_loss_type)
            loss = loss + ac.kl_loss_coef * agg(kl_mat, mask, scale)
            m["actor/kl_loss"] = float(agg(kl_mat.detach(), mask, None))
        return loss, m

    return loss_fn


def critic_loss_fn(cfg: Any) -> LossFn:
    """The critic's ``loss_fn(values, micro_batch, scale, _)``: clipped value loss against ``returns``."""
    cr = cfg.critic
    factor = cfg.actor_rollout_ref.actor.loss_scale_factor or cfg.actor_rollout_ref.rollout.response_length

    def loss_fn(values: torch.Tensor, mb: Batch, scale: LossScale, _: Optional[torch.Tensor]):
        mask, ex = mb.response_mask, mb.extras
        mat, m = value_loss_mat(values, ex["returns"], ex["values"], mask, cr.cliprange_value)
        m["critic/vf_loss"] = float(agg_loss(mat.detach(), mask, cr.loss_agg_mode, None, factor))
        return agg_loss(mat, mask, cr.loss_agg_mode, scale, factor), m

    return loss_fn


def run_updates(engine: Any, batch: Batch, loss_fn: LossFn, n_mini_batches: int, epochs: int,
                with_entropy: bool = False) -> dict:
    """``epochs`` passes of one optimizer step per mini-batch; returns the metrics averaged over steps."""
    metrics = []
    for _ in range(epochs):
        for idx in mini_batches(batch, n_mini_batches):
            kw = {"with_entropy": True} if with_entropy else {}
            metrics.append(engine.update(batch.select(idx), loss_fn, **kw))
    keys = dict.fromkeys(k for m in metrics for k in m)
    return {k: float(np.mean([m[k] for m in metrics if k in m])) for k in keys}

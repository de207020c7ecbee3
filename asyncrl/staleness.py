"""Sample-budget formulas of the fully-async design (DESIGN.md section 4, seed ``003`` chapter 6).

All counts are *samples* = prompt groups (one prompt with ``rollout.n`` responses).

- ``required_samples = ppo_mini_batch_size * require_batches``: what one trainer fit step consumes.
- ``max_required_samples = int(required_samples * (staleness_threshold + 1) * trigger_parameter_sync_step)``:
  how many samples the rollouter may have outstanding (in flight + queued + started since the last
  sync) before it pauses; also the MessageQueue / pending-queue bound.
- ``max_concurrent_samples = min(num_replicas * concurrent_samples_per_replica, max_required_samples)``.
- ``staleness_bound``: the oldest parameter version a trained token may come from, as a lag in
  versions; it follows from the budget above (a sample is consumed within ``ceil(s)`` sync windows of
  its start, one more when a partial rollout spans a sync) and is enforced by the trainer, which drops
  (and counts) anything older.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from asyncrl.config import ExperimentConfig


@dataclass(frozen=True)
class SampleBudget:
    """Derived limits; see the module docstring for the formulas and their source."""

    required_samples: int
    max_required_samples: int
    max_concurrent_samples: int
    staleness_bound: int


def required_samples(ppo_mini_batch_size: int, require_batches: int) -> int:
    return ppo_mini_batch_size * require_batches


def max_required_samples(required: int, staleness_threshold: float, trigger_parameter_sync_step: int) -> int:
    return int(required * (staleness_threshold + 1) * trigger_parameter_sync_step)


def max_concurrent_samples(num_replicas: int, concurrent_samples_per_replica: int, max_required: int) -> int:
    return min(num_replicas * concurrent_samples_per_replica, max_required)


def staleness_bound(staleness_threshold: float, partial_rollout: bool) -> int:
    """Largest allowed ``trainer_version - token_version`` (0 = strictly on-policy)."""
    if staleness_threshold <= 0:
        return 0
    return math.ceil(staleness_threshold) + (1 if partial_rollout else 0)


def sample_budget(cfg: ExperimentConfig) -> SampleBudget:
    at, ro = cfg.async_training, cfg.actor_rollout_ref.rollout
    req = required_samples(cfg.actor_rollout_ref.actor.ppo_mini_batch_size, at.require_batches)
    max_req = max_required_samples(req, at.staleness_threshold, at.trigger_parameter_sync_step)
    return SampleBudget(
        required_samples=req,
        max_required_samples=max_req,
        max_concurrent_samples=max_concurrent_samples(ro.num_replicas, ro.concurrent_samples_per_replica, max_req),
        staleness_bound=staleness_bound(at.staleness_threshold, at.partial_rollout),
    )


def token_lags(trainer_version: int, response_versions, response_mask):
    """``trainer_version - version`` of every model token (mask > 0): the trained tokens' staleness.

    Args:
        trainer_version: the parameter version being trained (before this step's sync).
        response_versions: ``(batch, resp_len)`` int64 per-token versions (``Batch.response_versions``).
        response_mask: ``(batch, resp_len)``; only mask-1 tokens count.

    Returns:
        ``(n_model_tokens,)`` int64 lags; invariant 2 (mode a) wants all 0, invariant 3 all <= the bound.
    """
    return trainer_version - response_versions[response_mask > 0]

"""Sample-budget formulas of the fully-async design (DESIGN.md section 4, seed ``003`` chapter 6).

All counts are *samples* = prompt groups (one prompt with ``rollout.n`` responses).

- ``required_samples = ppo_mini_batch_size * require_batches``: what one trainer fit step consumes.
- ``max_required_samples = int(required_samples * (staleness_threshold + 1) * trigger_parameter_sync_step)``:
  how many samples the rollouter may have outstanding (in flight + queued + started since the last
  sync) before it pauses; also the MessageQueue bound. Capped by ``run_samples = ceil(total_training_steps /
  trigger_parameter_sync_step) * trigger_parameter_sync_step * required_samples``, what the whole run trains in
  whole sync windows (more outstanding could never be trained; a dropped or failed group gives its slot back; a
  colocated round generates a whole window at once, so the queue must hold one even past the run's last step: a
  cap of the steps alone deadlocked ``trigger_parameter_sync_step`` > ``total_training_steps``): without the cap ``staleness_threshold=1e9`` with ``concurrent_samples_per_replica=1e9``
  admitted every row, epoch after epoch, until memory ran out (``asyncrl sim``: 24 GB in 6 minutes, killed).
- ``max_concurrent_samples = min(num_replicas * concurrent_samples_per_replica, max_required_samples)``; also the
  rollouter's read-ahead (``pending_queue``) bound, :attr:`SampleBudget.read_ahead`: no more rows are drawn ahead than
  can start at once (a read-ahead of ``max_required_samples`` grew without limit with a staleness budget of 1e9).
  Where it puts far more sequences in flight than the engines decode at once, :func:`in_flight_warning` says so
  before a run (``Experiment.preflight``, ``asyncrl train --dry-run``) and in ``asyncrl sim``.
- ``staleness_bound``: the oldest parameter version a trained token may come from, as a lag in
  versions: ``ceil(s)`` sync windows of look-ahead, one more when a partial rollout spans a sync. The
  budget above caps how many samples are outstanding, not how long one of them generates: a long-tail
  response under partial rollout resumes after every sync and can outlive the bound. The trainer
  enforces it: a sample older than the bound is dropped, counted (``dropped/stale_at_trainer``) and its
  budget slot released (``FullyAsyncTrainer._fetch_batch``). With
  ``async_training.drop_stale_in_generation`` a resumed request that would start on a version already more
  than the bound past its group's oldest token ends the group at once instead (``dropped/stale_in_generation``:
  :func:`asyncrl.rollout.client.staleness_bounded`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from asyncrl.config import ExperimentConfig


@dataclass(frozen=True)
class SampleBudget:
    """Derived limits; see the module docstring for the formulas and their source."""

    required_samples: int
    max_required_samples: int
    max_concurrent_samples: int
    staleness_bound: int

    @property
    def read_ahead(self) -> int:
        """Prompt groups the rollouter draws from the dataloader ahead of starting them (its ``pending_queue``
        bound): ``max_concurrent_samples``, at least 1. The data order does not depend on it."""
        return max(1, self.max_concurrent_samples)


def required_samples(ppo_mini_batch_size: int, require_batches: int) -> int:
    return ppo_mini_batch_size * require_batches


def max_required_samples(required: int, staleness_threshold: float, trigger_parameter_sync_step: int) -> int:
    return int(required * (staleness_threshold + 1) * trigger_parameter_sync_step)


def run_samples(total_training_steps: int, required: int, trigger_parameter_sync_step: int = 1) -> int:
    """Samples (prompt groups) the whole run trains, in whole sync windows: the cap of ``max_required_samples``."""
    windows = -(-total_training_steps // trigger_parameter_sync_step)
    return windows * trigger_parameter_sync_step * required


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
    max_req = min(max_required_samples(req, at.staleness_threshold, at.trigger_parameter_sync_step),
                  run_samples(cfg.trainer.total_training_steps, req, at.trigger_parameter_sync_step))
    return SampleBudget(
        required_samples=req,
        max_required_samples=max_req,
        max_concurrent_samples=max_concurrent_samples(ro.num_replicas, ro.concurrent_samples_per_replica, max_req),
        staleness_bound=staleness_bound(at.staleness_threshold, at.partial_rollout),
    )


IN_FLIGHT_PER_SEAT = 64
"""Sequences in flight per engine seat (``num_replicas x max_num_seqs``) above which :func:`in_flight_warning` speaks:
the defaults put 8 there (256 groups of 8 per replica against 256 seats); past 64 a request waits dozens of engine
batches for a seat while its group holds memory, and no cap the user meant to set is binding."""


def in_flight_warning(cfg: ExperimentConfig) -> Optional[str]:
    """A WARNING's text when ``max_concurrent_samples x rollout.n`` sequences exceed :data:`IN_FLIGHT_PER_SEAT` times
    the engines' seats (``num_replicas x max_num_seqs``), else ``None``. Both caps of ``max_concurrent_samples``
    (``concurrent_samples_per_replica`` and the staleness budget ``max_required_samples``) are then far above what
    the engines decode at once: the rollouter admits that many groups, and each holds its prompt, requests and
    tokens until it trains (``concurrent_samples_per_replica=1e9`` with ``staleness_threshold=1e9``: the whole
    run's groups at once). verl fixes the cap at 16 groups per replica. Not an error: the extra groups only wait,
    and a run can mean it. ``None`` for a colocated run (``hybrid_engine``): it generates a whole sync window's groups
    at once by design (verl's colocate), whatever the concurrency keys say."""
    ro, at = cfg.actor_rollout_ref.rollout, cfg.async_training
    if cfg.actor_rollout_ref.hybrid_engine:
        return None
    budget = sample_budget(cfg)
    seqs, seats = budget.max_concurrent_samples * ro.n, ro.num_replicas * ro.max_num_seqs
    if seqs <= IN_FLIGHT_PER_SEAT * seats:
        return None
    return (f"up to {seqs} sequences may be in flight (max_concurrent_samples={budget.max_concurrent_samples} groups x "
            f"rollout.n={ro.n}), {seqs // seats}x the engines' {seats} seats (num_replicas x max_num_seqs): the rest "
            "wait in the engines' queues while their groups hold memory. max_concurrent_samples is the smaller of "
            f"num_replicas x actor_rollout_ref.rollout.concurrent_samples_per_replica = "
            f"{ro.num_replicas * ro.concurrent_samples_per_replica} and max_required_samples = "
            f"{budget.max_required_samples} (async_training.staleness_threshold={at.staleness_threshold:g}, at most "
            f"the run's {run_samples(cfg.trainer.total_training_steps, budget.required_samples, at.trigger_parameter_sync_step)}"
            " groups in whole sync windows); lower "
            "concurrent_samples_per_replica (verl admits 16 groups per replica) or staleness_threshold")


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


def update_lag_metrics(response_versions: torch.Tensor, response_mask: torch.Tensor, updates_at_version: dict[int, int],
                       updates_before: int, updates_after: int) -> dict[str, float]:
    """Lag of trained tokens in actor optimizer updates (``staleness/update_lag_*``).

    Updates the policy had when a token's mini-batch was trained minus updates baked into the token's
    version. It differs from the version lag when a sync carries several updates (mode b:
    ``trigger_parameter_sync_step > 1``) and counts PPO's own mini-batch lag (the k-th of a step's updates
    is k - 1 updates off-policy); the mean takes the step's mini-batches as equally sized.

    Args:
        response_versions: ``[B, T]`` int, the parameter version of each response token (-1: none).
        response_mask: ``[B, T]``, 1 on trained tokens.
        updates_at_version: parameter version -> actor updates baked into it.
        updates_before / updates_after: actor updates before and after this step's update.

    Returns:
        ``{}`` when nothing was updated or no token has a version.
    """
    versions = response_versions[(response_mask > 0) & (response_versions >= 0)]
    k = updates_after - updates_before
    if not versions.numel() or k <= 0:
        return {}
    top = int(versions.max())
    baked = torch.tensor([updates_at_version.get(v, updates_before) for v in range(top + 1)])[versions]
    lag = (updates_before - baked).float()
    return {"staleness/update_lag_mean": float(lag.mean()) + (k - 1) / 2,
            "staleness/update_lag_max": float(lag.max()) + k - 1}

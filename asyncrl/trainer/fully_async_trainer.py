"""FullyAsyncTrainer: pulls prompt groups from the MessageQueue, runs GRPO/PPO updates, syncs weights.

::

    fit():  loop fit_step() until trainer.total_training_steps (or total_time_s) is reached
    fit_step():
        fetch      MessageQueue.get_samples(required_samples)   (waits while empty; drops stale)
        reward     scores were computed by the rollouter's reward step; gather them
        old logp   bypass mode: the rollout engine's logprobs; ref logp only with use_kl_loss
        advantage  GRPO over each prompt group
        update     require_batches mini-batches x ppo_epochs optimizer steps
        sync       every trigger_parameter_sync_step steps: ParameterSynchronizer -> param_version += 1

Heavy tensor work runs in a worker thread so status snapshots stay responsive. Semantics from the
verl fully-async design (seed ``003`` chapter 6, ``FullyAsyncTrainer``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Optional

import numpy as np
import torch

from asyncrl.config import ExperimentConfig
from asyncrl.sample import RolloutSample
from asyncrl.staleness import sample_budget
from asyncrl.sync.base import get_engine_cls
from asyncrl.sync.synchronizer import ParameterSynchronizer
from asyncrl.trainer.algorithms import agg_loss, grpo_advantages, kl_k3, ppo_clip_loss
from asyncrl.trainer.engine import Batch, TrainEngine, collate

logger = logging.getLogger(__name__)


class FullyAsyncTrainer:
    """Ray actor body (made remote by the Experiment).

    Args:
        config: experiment config.
        message_queue: :class:`~asyncrl.message_queue.MessageQueue`.
        rollouter: FullyAsyncRollouter actor handle (pause/resume/reset_staleness).
        replicas: ``{server_id: RolloutReplica handle}`` receiving weights.
    """

    def __init__(self, config: ExperimentConfig, message_queue: Any, rollouter: Any, replicas: dict):
        torch.set_num_threads(config.trainer.torch_threads)
        self.cfg = config
        self.budget = sample_budget(config)
        self.mq, self.rollouter = message_queue, rollouter
        actor, at = config.actor_rollout_ref.actor, config.async_training
        updates_per_step = at.require_batches * actor.ppo_epochs
        self.engine = TrainEngine(
            config.actor_rollout_ref.model.path, lr=actor.optim.lr, warmup=actor.optim.lr_warmup_steps,
            total_updates=actor.optim.total_updates or config.trainer.total_training_steps * updates_per_step,
            weight_decay=actor.optim.weight_decay, betas=actor.optim.betas, clip_grad=actor.optim.clip_grad,
            dtype=config.actor_rollout_ref.model.dtype, micro_batch_size=actor.ppo_micro_batch_size,
            with_reference=actor.use_kl_loss, seed=config.trainer.seed,
            temperature=config.actor_rollout_ref.rollout.temperature)
        engine_cls = get_engine_cls("cpu")
        self.synchronizer = ParameterSynchronizer(
            rollouter, engine_cls(list(replicas.values()), bucket_bytes=int(at.sync_bucket_size_mb * 2**20)))
        self.param_version = 0
        self.global_steps = 0
        self.t_start = time.time()
        self.idle_s = 0.0
        self.history: list[dict] = []
        self.trained = 0
        self.dropped: collections.Counter = collections.Counter()
        self.lag_counts: collections.Counter = collections.Counter()  # token version lag -> count
        self.trained_token_versions: list[tuple[int, int, int]] = []  # (trainer version, min, max) per sample
        self.done = False
        self.error: Optional[str] = None
        self.stop_reason = ""

    # ------------------------------------------------------------------ main loop
    async def fit(self) -> dict:
        """Run until ``total_training_steps`` / ``total_time_s`` / shutdown; returns the final status."""
        try:
            self.stop_reason = f"trainer.total_training_steps={self.cfg.trainer.total_training_steps} reached"
            while self.global_steps < self.cfg.trainer.total_training_steps:
                if self.cfg.trainer.total_time_s and time.time() - self.t_start > self.cfg.trainer.total_time_s:
                    self.stop_reason = (f"time budget trainer.total_time_s={self.cfg.trainer.total_time_s:g} reached "
                                        f"at step {self.global_steps}/{self.cfg.trainer.total_training_steps}")
                    logger.info(self.stop_reason)
                    break
                if not await self.fit_step():
                    self.stop_reason = "the MessageQueue was shut down"
                    break
        except Exception as exc:
            logger.exception("trainer failed")
            self.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.done = True
        return self.status()

    async def fit_step(self) -> bool:
        """One trainer step, readable top to bottom. Returns False when the queue was shut down."""
        t0 = time.time()
        # 1. fetch `required_samples` prompt groups (stale ones dropped and replaced)
        samples = await self._fetch_batch(self.budget.required_samples)
        if samples is None:
            return False
        t_fetched = time.time()
        outputs = [o for s in samples for o in s.outputs]
        group_ids = [s.uid for s in samples for _ in s.outputs]
        batch = collate(outputs, group_ids)
        # 2. reward: computed by the rollouter's streaming reward step, carried in the batch
        rewards = batch.rewards
        # 3. old logprobs = rollout logprobs (bypass mode); reference logprobs for the KL penalty
        old_log_probs = batch.rollout_log_probs
        ref_log_probs = (await asyncio.to_thread(self.engine.compute_ref_log_probs, batch)
                         if self.cfg.actor_rollout_ref.actor.use_kl_loss else None)
        # 4. advantages
        advantages = grpo_advantages(rewards, group_ids, norm_by_std=self.cfg.algorithm.norm_adv_by_std_in_grpo
                                     and self.cfg.algorithm.adv_estimator == "grpo")
        # 5. update: require_batches mini-batches (whole prompt groups), ppo_epochs passes
        update_metrics = await asyncio.to_thread(self._update_policy, batch, old_log_probs, ref_log_probs, advantages)
        self.global_steps += 1
        lags = self._record_versions(samples, batch)  # versions at training time, before the sync
        t_updated = time.time()
        # 6. sync weights every trigger_parameter_sync_step steps
        sync_metrics: dict[str, float] = {}
        if self.global_steps % self.cfg.async_training.trigger_parameter_sync_step == 0:
            sync_metrics = await self._sync_weights()
        self._log_step(samples, batch, lags, update_metrics, sync_metrics,
                       {"timing/fetch_s": t_fetched - t0, "timing/update_s": t_updated - t_fetched,
                        "timing/step_s": time.time() - t0})
        return True

    # ------------------------------------------------------------------ steps
    async def _fetch_batch(self, n: int) -> Optional[list[RolloutSample]]:
        bound = self.budget.staleness_bound
        got: list[RolloutSample] = []
        while len(got) < n:
            t = time.time()
            new = await self.mq.get_samples_async(n - len(got))
            self.idle_s += time.time() - t
            if new is None:
                return None
            for s in new:
                s.timings["dequeued"] = time.time()
                lag = self.param_version - (s.min_global_steps if s.min_global_steps is not None else self.param_version)
                if lag > bound:
                    self.dropped["stale"] += 1
                    await self.mq.actor.record_drop.remote("stale_at_trainer")
                    await self.rollouter.release_budget.remote()
                else:
                    got.append(s)
        return got

    def _update_policy(self, batch: Batch, old_log_probs: torch.Tensor, ref_log_probs: Optional[torch.Tensor],
                       advantages: torch.Tensor) -> dict:
        """``require_batches`` mini-batches of whole prompt groups, ``ppo_epochs`` passes; averaged metrics."""
        actor = self.cfg.actor_rollout_ref.actor
        batch.extras["old_log_probs"], batch.extras["advantages"] = old_log_probs, advantages
        if ref_log_probs is not None:
            batch.extras["ref_log_probs"] = ref_log_probs

        def loss_fn(log_probs: torch.Tensor, mb: Batch) -> tuple[torch.Tensor, dict]:
            loss, m = ppo_clip_loss(log_probs, mb.extras["old_log_probs"], mb.extras["advantages"], mb.response_mask,
                                    actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode)
            if "ref_log_probs" in mb.extras:
                kl = agg_loss(kl_k3(log_probs, mb.extras["ref_log_probs"]), mb.response_mask, actor.loss_agg_mode)
                loss = loss + actor.kl_loss_coef * kl
                m["actor/kl_loss"] = float(kl.detach())
            m["actor/pg_loss"] = float(loss.detach())
            return loss, m

        groups = list(dict.fromkeys(batch.group_ids))
        per_mb = max(1, -(-len(groups) // self.cfg.async_training.require_batches))
        rows_of = collections.defaultdict(list)
        for i, g in enumerate(batch.group_ids):
            rows_of[g].append(i)
        metrics = []
        for _ in range(actor.ppo_epochs):
            for start in range(0, len(groups), per_mb):
                idx = [i for g in groups[start:start + per_mb] for i in rows_of[g]]
                metrics.append(self.engine.update(batch.select(idx), loss_fn))
        return {k: float(np.mean([m[k] for m in metrics if k in m])) for k in metrics[0]} if metrics else {}

    async def _sync_weights(self) -> dict:
        version = self.param_version + 1
        metrics = await self.synchronizer.sync(self.engine.named_tensors_for_sync(), version)
        self.param_version = version
        return metrics

    # ------------------------------------------------------------------ bookkeeping
    def _record_versions(self, samples: list[RolloutSample], batch: Batch) -> torch.Tensor:
        """Count trained tokens per version lag (staleness histogram, invariant tests); returns the lags."""
        self.trained += len(samples)
        lags = self.param_version - batch.token_versions[batch.response_mask > 0]
        self.lag_counts.update(int(x) for x in lags.tolist())
        for s in samples:
            self.trained_token_versions.append((self.param_version, s.min_global_steps, s.max_global_steps))
        return lags.float()

    def _log_step(self, samples: list[RolloutSample], batch: Batch, lags: torch.Tensor, upd: dict, sync: dict,
                  timing: dict) -> None:
        mask = batch.response_mask
        proc = [s.timings["finished"] - s.timings["started"] for s in samples]
        spans = [s.max_global_steps - s.min_global_steps for s in samples
                 if s.max_global_steps is not None and s.min_global_steps is not None]
        wall = max(1e-9, time.time() - self.t_start)
        row = {
            "step": self.global_steps, "param_version": self.param_version, "time_s": wall,
            "reward/mean": float(batch.rewards.mean()),
            "response_length/mean": float(mask.sum(-1).mean()),
            "staleness/lag_mean": float(lags.mean()) if lags.numel() else 0.0,
            "staleness/lag_max": float(lags.max()) if lags.numel() else 0.0,
            "trainer/idle_ratio": min(1.0, self.idle_s / wall),
            "rollouter/partial_count": sum(1 for s in samples if s.is_partial),
            "rollouter/partial_max_span": max(spans) if spans else 0,
            "rollouter/processing_p50_s": float(np.percentile(proc, 50)),
            "rollouter/processing_p90_s": float(np.percentile(proc, 90)),
            "rollouter/processing_p99_s": float(np.percentile(proc, 99)),
            "trainer/dropped_stale": self.dropped["stale"],
        }
        outs = [o for s in samples for o in s.outputs]
        for k in sorted({k for o in outs for k in o.metrics if k.startswith("reward/")}):  # e.g. reward/format
            vals = [float(o.metrics[k]) for o in outs if k in o.metrics]
            row[k] = float(np.mean(vals))
        row.update(upd)
        row.update(sync)
        row.update(timing)
        self.history.append(row)

    # ------------------------------------------------------------------ status
    def status(self) -> dict:
        """Live trainer state (cheap)."""
        wall = max(1e-9, time.time() - self.t_start)
        return {"global_steps": self.global_steps, "param_version": self.param_version, "trained": self.trained,
                "dropped": dict(self.dropped), "idle_ratio": min(1.0, self.idle_s / wall), "done": self.done,
                "error": self.error, "stop_reason": self.stop_reason, "lag_counts": dict(self.lag_counts),
                "staleness_bound": self.budget.staleness_bound, "history": list(self.history)}

    def history_since(self, n: int) -> list[dict]:
        return self.history[n:]

    def trained_versions(self) -> list[tuple[int, int, int]]:
        return list(self.trained_token_versions)

    async def initial_sync(self) -> dict:
        """Push the starting weights as version 0 (replicas reused from an earlier run, or a
        trainer that starts from a different checkpoint than the replicas loaded)."""
        return await self.synchronizer.engine.send_weights(self.engine.named_tensors_for_sync(), 0)

    async def final_sync(self) -> Optional[dict]:
        """Push the latest weights if the last steps were not synced yet (before the final evaluation)."""
        if self.global_steps % self.cfg.async_training.trigger_parameter_sync_step != 0:
            return await self._sync_weights()
        return None

"""FullyAsyncTrainer: pulls prompt groups from the MessageQueue, runs PPO-family updates, syncs weights.

::

    fit():  loop fit_step() until trainer.total_training_steps (or total_time_s) is reached, or request_stop
            (the driver's Ctrl-C); a fetch waits no longer than the time budget left
    fit_step():
        fetch      MessageQueue.get_samples(required_samples)   (waits while empty; drops stale groups
                   and, with DAPO's filter_groups, groups without reward variance, and fetches more)
        reward     rule scores from the rollouter's reward step (+ DAPO overlong shaping)
        old logp   bypass: the rollout engine's log-probs; decoupled: recomputed by the trainer,
                   then rollout correction (IS weights / rejection) against the rollout's
        ref logp   frozen start model (use_kl_loss / use_kl_in_reward); values from the critic (gae)
        advantage  token rewards (- beta * KL when use_kl_in_reward) -> algorithm.adv_estimator
        update     critic, then actor: require_batches mini-batches x ppo_epochs optimizer steps
        sync       every trigger_parameter_sync_step steps: ParameterSynchronizer -> param_version += 1
    metrics of the update: the engine's per mini-batch (averaged), and ``perf/update_s_per_token``, the
        update's seconds (a wait for the weights lock, while a replica rejoins, included) over the tokens
        through the model (``perf/tokens`` x updates; no critic): the train price of this run, to set beside
        ``asyncrl.sim.calibrate.measure_train``'s price alone
    after a step: the row streams to metrics.csv + trainer.logger (Tracking); every trainer.save_freq
        steps a checkpoint (asyncrl.checkpoint); every sample's outcome goes to the Ledger by seq

Heavy tensor work runs in a worker thread so status snapshots stay responsive. Semantics from the
verl fully-async design (seed ``003`` chapter 6, ``FullyAsyncTrainer``); the maths is in
``advantages.py``, ``losses.py``, ``rewards.py``, ``rollout_correction.py``, ``update.py``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from pathlib import Path
from typing import Any, Optional

import torch

from asyncrl.accounting import Ledger
from asyncrl.compute_thread import on_compute_thread, run_compute
from asyncrl.config import ExperimentConfig
from asyncrl.cpu_affinity import pin_threads
from asyncrl.failures import RolloutStopped, raise_if_rollout_stopped
from asyncrl.hybrid_engine import generate_round
from asyncrl.logs import configure_logging
from asyncrl.message_queue import UnreadableSample
from asyncrl.sample import RolloutSample
from asyncrl.staleness import sample_budget, update_lag_metrics
from asyncrl.sync.synchronizer import ParameterSynchronizer
from asyncrl.trainer.advantages import advantage_metrics, compute_advantages
from asyncrl.trainer.bookkeeping import TrainerBookkeeping
from asyncrl.checkpoint.trainer_state import CheckpointedRun
from asyncrl.trainer.engine import Batch, collate
from asyncrl.trainer.factory import build_train_engine, optim_kwargs
from asyncrl.trainer.fault_tolerance import FaultTolerantSync
from asyncrl.trainer.filter_warning import FilterWarning, filtered_note
from asyncrl.trainer.rewards import has_signal, make_kl_controller, shaped_scores, token_level_rewards
from asyncrl.trainer.rollout_correction import rollout_correction
from asyncrl.trainer.update import actor_loss_fn, critic_loss_fn, run_updates

logger = logging.getLogger(__name__)


# TrainerBookkeeping first: its _on_synced (updates per version, staleness/update_lag_*) must win over
# FaultTolerantSync's no-op hook (with it last, updates_at_version stayed {0: 0}: test_mode_b failed)
class FullyAsyncTrainer(TrainerBookkeeping, FaultTolerantSync, CheckpointedRun):
    """Ray actor body (made remote by the Experiment).

    Args:
        config: experiment config.
        message_queue: :class:`~asyncrl.message_queue.MessageQueue`; ``None`` with ``local_rollout``: one in this
            process (:func:`asyncrl.trainer.hybrid_rollout.in_process_queue`).
        rollouter: FullyAsyncRollouter actor handle (pause/resume/reset_staleness).
        replicas: ``{server_id: RolloutReplica handle}`` receiving weights.
        worker_options: ``ray.remote`` options of the fsdp2 ranks (placement, GPUs); see
            :func:`asyncrl.trainer.factory.build_train_engine`.
        run_dir: artifact directory: ``metrics.csv`` and the loggers stream there, checkpoints go to
            ``<run_dir>/checkpoints``; ``None`` keeps the rows in memory only.
        local_rollout: ``{"train_rows", "val_rows", "resume", "queue_maxsize"}``: build the rollouter and an hf engine over
            the actor module in this process (:mod:`asyncrl.trainer.hybrid_rollout`; ``rollouter`` is then None).
        resume_dir: a ``global_step_<N>`` checkpoint to continue from (step ``N + 1`` is next).
        log_level: level of the ``asyncrl`` loggers in this actor (the driver's, so ``console``
            lines show with ``--log-level INFO``); lines in :data:`asyncrl.logs.LOG_FORMAT`.
    """

    def __init__(self, config: ExperimentConfig, message_queue: Any, rollouter: Any, replicas: dict,
                 worker_options: Optional[list] = None, run_dir: Optional[str] = None,
                 resume_dir: Optional[str] = None, log_level: Optional[int] = None,
                 local_rollout: Optional[dict] = None):
        configure_logging(log_level)  # as every worker of init_ray's job already is; also under a Ray started elsewhere
        torch.set_num_threads(config.trainer.torch_threads)
        pin_threads(config.trainer.cpu_affinity)  # CPU runs: off the engine's cores, Ray's own threads too
        self.cfg = config
        self.budget = sample_budget(config)
        self.mq, self.rollouter, self.replicas = message_queue, rollouter, replicas
        actor, al = config.actor_rollout_ref.actor, config.algorithm
        self.with_reference = actor.use_kl_loss or al.use_kl_in_reward
        # strategy cpu: TrainEngine here; fsdp2: a TrainWorkerGroup (also the sender). Checkpoint engine from config.
        # the models are built on the compute thread, where their passes run: one OpenMP team (compute_thread.py)
        self.engine, self.weight_sender = on_compute_thread(build_train_engine, config, list(replicas.values()),
                                                            worker_options)
        if local_rollout is not None:  # hybrid_engine + hf on CPU: rollout in this process (trainer/hybrid_rollout.py)
            from asyncrl.trainer.hybrid_rollout import build_local_rollout, in_process_queue

            local_rollout = dict(local_rollout)
            maxsize = local_rollout.pop("queue_maxsize", None)
            if self.mq is None:  # the queue body here too: groups reach the trainer without a ray.put
                self.mq = in_process_queue(maxsize or self.budget.max_required_samples)
            self.rollouter, self.replicas, self.weight_sender = on_compute_thread(build_local_rollout, self, self.mq,
                                                                                  **local_rollout)
            replicas = self.replicas
        self.critic = None
        if al.adv_estimator == "gae":
            from asyncrl.trainer.critic import CriticEngine

            cr = config.critic
            self.critic = on_compute_thread(CriticEngine, cr.model.path or config.actor_rollout_ref.model.path,
                                       **optim_kwargs(self.cfg, cr.optim, cr.ppo_epochs),
                                       dtype=config.actor_rollout_ref.model.dtype,
                                       micro_batch_size=cr.ppo_micro_batch_size, seed=config.trainer.seed)
        self.kl_ctrl = make_kl_controller(al.kl_ctrl) if al.use_kl_in_reward else None
        # syncs reach the live replicas only; restarted ones rejoin (asyncrl.trainer.fault_tolerance)
        self.synchronizer = ParameterSynchronizer(self.rollouter, self._init_replicas(replicas, self.weight_sender))
        self.param_version = 0
        self.global_steps = 0
        self.updates = 0  # actor optimizer updates done
        self.updates_at_version: dict[int, int] = {0: 0}  # param version -> actor updates baked into it
        self.t_start = time.time()
        self._t_logged: Optional[float] = None  # when the last step was logged (a finished run's wall ends there)
        self.idle_s = 0.0
        self.history: list[dict] = []
        self.trained = 0
        self.dropped: collections.Counter = collections.Counter()  # stale, dapo_no_signal
        # score every response of a group got -> groups filter_groups dropped (the watchdog: 0 too hard, 1 too easy)
        self.filtered_scores: collections.Counter = collections.Counter()
        self._filter_warning = FilterWarning()
        self.lag_counts: collections.Counter = collections.Counter()  # token version lag -> count
        self.response_length_counts: collections.Counter = collections.Counter()  # response tokens -> trained rows
        self.gradient_length_counts: collections.Counter = collections.Counter()  # the same, rows with a gradient
        # response tokens -> rows of the groups dropped as stale here: generated, never trained (a long tail outliving
        # the staleness bound; Summary.stale_length_counts)
        self.stale_length_counts: collections.Counter = collections.Counter()
        self.trained_token_versions: list[tuple[int, int, int]] = []  # (trainer version, min, max) per sample
        self.trained_rows: list[tuple[int, int, int]] = []  # (step, seq, dataset row) per trained sample
        self.done = False
        self.error: Optional[str] = None
        self.stop_reason = ""
        self._time_stop = False  # trainer.total_time_s spent: at a batch's fetch (that step is the last) or waiting for one
        self._stop_requested = ""  # request_stop's reason (Ctrl-C in the driver): no step starts after the running one
        self.ledger = Ledger()  # trained / dropped / failed by seq, plus "fetched"
        self._in_step: list[int] = []  # seqs fetched by the running step, not trained yet
        self.synced_step = 0  # global_steps when the replicas last got the weights
        self.phase, self.phase_since, self.last_step_t = "fetch", time.time(), time.time()
        self.watchdog = None
        if config.trainer.watchdog_timeout_s > 0:
            from asyncrl.watchdog import HangWatchdog

            self.watchdog = HangWatchdog(config.trainer.watchdog_timeout_s, self.budget, lambda: self.last_step_t,
                                         self._watchdog_funnel)
        self.checkpoints = self.tracking = None
        self.last_checkpoint: Optional[str] = None
        if resume_dir:  # the engines were built from the base model (the KL reference); weights load over it
            from asyncrl.checkpoint.trainer_state import restore_trainer

            restore_trainer(self, Path(resume_dir))
            self.last_checkpoint = str(resume_dir)
        if run_dir is not None:
            self._open_run_dir(Path(run_dir), resume=resume_dir is not None)

    # ------------------------------------------------------------------ main loop
    async def fit(self) -> dict:
        """Run until ``total_training_steps`` / ``total_time_s`` / shutdown; returns the final status."""
        self.last_step_t = time.time()
        if self.watchdog is not None:
            self.watchdog.start()
        try:
            self.stop_reason = f"trainer.total_training_steps={self.cfg.trainer.total_training_steps} reached"
            while (self.global_steps < self.cfg.trainer.total_training_steps and not self._time_stop
                   and not self._stop_requested):
                gen = await generate_round(self) if self.cfg.actor_rollout_ref.hybrid_engine else {}
                if not await self.fit_step(gen):
                    self.stop_reason = "the MessageQueue was shut down"
                    await raise_if_rollout_stopped(self.mq)  # the rollouter stopped the run: an error
                    if self._time_stop:  # spent while waiting for a batch (_fetch_batch): a normal end
                        self.stop_reason = (f"time budget trainer.total_time_s={self.cfg.trainer.total_time_s:g} "
                                            f"spent while waiting for the batch of step {self.global_steps + 1} "
                                            f"(step {self.global_steps}/{self.cfg.trainer.total_training_steps} done)"
                                            + filtered_note(self.dropped["dapo_no_signal"], self.filtered_scores))
                        logger.warning(self.stop_reason)
                    break
                if self._time_stop:
                    self.stop_reason = (f"time budget trainer.total_time_s={self.cfg.trainer.total_time_s:g} reached "
                                        f"at step {self.global_steps}/{self.cfg.trainer.total_training_steps}")
                    logger.info(self.stop_reason)
                if self.cfg.trainer.save_freq > 0 and self.global_steps % self.cfg.trainer.save_freq == 0:
                    self._set_phase("checkpoint")
                    await self.save_checkpoint()
                self._set_phase("fetch")
                self.last_step_t = time.time()
            if self._stop_requested:
                self.stop_reason = f"{self._stop_requested} at step {self.global_steps}"
        except Exception as exc:
            if isinstance(exc, RolloutStopped):  # the rollouter logged its reason and first traceback: no stack here
                logger.error("trainer stopped at step %d: %s", self.global_steps + 1, exc)
            else:
                logger.exception("trainer failed at step %d", self.global_steps + 1)
            self.error = f"{type(exc).__name__}: {exc}"
            self.stop_reason = f"trainer error at step {self.global_steps + 1}: {self.error}"
            for seq in self._in_step:  # fetched for the failed step, never trained
                self.ledger.record(f"failed/trainer_error: {type(exc).__name__}", seq)
            self._in_step = []
            raise
        finally:
            self.done = True
            if self.watchdog is not None:
                self.watchdog.stop()
        return self.status()

    async def fit_step(self, gen: Optional[dict] = None) -> bool:
        """One trainer step, readable top to bottom. Returns False when the queue was shut down.
        ``gen``: colocated mode's ``timing/gen_s`` when the step also waited for its batch to be generated."""
        cfg, al = self.cfg, self.cfg.algorithm
        t0 = time.time()
        # 1. fetch `required_samples` prompt groups (stale and, with filter_groups, no-signal ones replaced)
        self._in_step = []
        samples = await self._fetch_batch(self.budget.required_samples)
        if samples is None:  # shut down (or out of time) while a batch was being gathered: what it held is dropped
            self.ledger.extend("dropped/fetched_at_time_budget" if self._time_stop else "dropped/fetched_at_shutdown",
                               self._in_step)
            self._in_step = []
            return False
        # the last step: the step count's, or the first batch fetched after the time budget (as the step count does,
        # the rollouter then starts nothing more, so a time-budget stop leaves the same at most 2 x max_required - required + 1)
        self._time_stop = bool(cfg.trainer.total_time_s) and time.time() - self.t_start > cfg.trainer.total_time_s
        if (self.global_steps + 1 >= cfg.trainer.total_training_steps or self._time_stop) and self.rollouter is not None:
            await self.rollouter.close_admission.remote()  # the last batch: nothing started now could train
        self._set_phase("update")
        t_fetched = time.time()
        # the rollouter's side of the row, asked now: its Ray calls (~40 ms a step on the busy 2-core box, on the
        # trainer's path when asked after the sync) are answered while the update runs
        rollout_metrics = asyncio.ensure_future(self._rollout_metrics())
        rollout_metrics.add_done_callback(lambda t: t.cancelled() or t.exception())  # a step that raises never awaits it
        batch = await run_compute(collate, [o for s in samples for o in s.outputs],
                                  [s.uid for s in samples for _ in s.outputs])
        t_collated = time.time()
        metrics: dict[str, float] = {}
        # 2. reward: the rollouter's rule scores, plus the overlong penalty (DAPO) when enabled
        scores = shaped_scores(batch.rewards, batch.response_lengths, cfg)
        # 3. old log-probs: the rollout's (bypass) or recomputed + rollout correction (decoupled)
        if al.rollout_correction.bypass_mode:
            old_log_probs = batch.rollout_log_probs
        else:
            old_log_probs = await run_compute(self.engine.compute_log_probs, batch)
            is_weights, keep, corr = rollout_correction(old_log_probs, batch.rollout_log_probs,
                                                        batch.response_mask, al.rollout_correction)
            batch.response_mask = batch.response_mask * keep  # rejected tokens leave the loss
            if is_weights is not None:
                batch.extras["is_weights"] = is_weights
            metrics.update(corr)
        # 4. reference log-probs (KL loss / KL in the reward) and values (critic, gae)
        ref_log_probs = (await run_compute(self.engine.compute_ref_log_probs, batch)
                         if self.with_reference else None)
        values = await run_compute(self.critic.compute_values, batch) if self.critic else None
        # 5. advantages from token-level rewards (minus beta * KL(old || ref) with use_kl_in_reward), on the compute
        # thread: a parallel torch op on this event loop's thread starts a second OpenMP team (compute_thread.py)
        def advantages_step() -> dict[str, float]:
            token_rewards, kl_metrics = token_level_rewards(scores, batch.response_mask, old_log_probs, ref_log_probs,
                                                            self.kl_ctrl, al.kl_penalty)
            advantages, returns = compute_advantages(al.adv_estimator, token_rewards, batch.response_mask,
                                                     batch.group_ids, al, values)
            batch.extras.update(old_log_probs=old_log_probs, advantages=advantages, returns=returns)
            return {**kl_metrics, **advantage_metrics(batch.response_mask, scores, advantages, returns)}

        metrics.update(await run_compute(advantages_step))
        if ref_log_probs is not None:
            batch.extras["ref_log_probs"] = ref_log_probs
        if values is not None:
            batch.extras["values"] = values
        # 6. update the critic, then the actor: require_batches mini-batches x ppo_epochs
        updates_before = self.updates
        t_adv = time.time()
        async with self._weights_lock:  # a replica rejoining now waits for the step's weights
            metrics.update(await run_compute(self._update, batch))
        t_actor = time.time()
        if self.global_steps >= cfg.trainer.critic_warmup:  # the actor was updated (see _update)
            n_updates = cfg.async_training.require_batches * cfg.actor_rollout_ref.actor.ppo_epochs
            self.updates += n_updates
            if metrics.get("perf/tokens") and self.critic is None:  # the engine's price in this run (module docstring)
                metrics["perf/update_s_per_token"] = (t_actor - t_adv) / (metrics["perf/tokens"] * n_updates)
        metrics.update(await run_compute(update_lag_metrics, batch.response_versions, batch.response_mask,
                                         self.updates_at_version, updates_before, self.updates))
        self.global_steps += 1
        lags = await run_compute(self._record_versions, samples, batch)  # versions at training time, before the sync
        self.ledger.extend("trained", self._in_step)
        self._in_step = []
        t_updated = time.time()
        # 7. sync weights every trigger_parameter_sync_step steps
        sync_metrics: dict[str, float] = {}
        if self.global_steps % cfg.async_training.trigger_parameter_sync_step == 0:
            self._set_phase("sync")
            sync_metrics = await self._sync_weights()
        await run_compute(self._log_step, samples, batch, lags, {**metrics, **await rollout_metrics}, sync_metrics,
                       {"timing/fetch_s": t_fetched - t0, "timing/update_s": t_updated - t_fetched,
                        "timing/collate_s": t_collated - t_fetched, "timing/adv_s": t_adv - t_collated,
                        "timing/update_actor_s": t_actor - t_adv, "timing/update_post_s": t_updated - t_actor,
                        "timing/step_s": time.time() - t0 + (gen or {}).get("timing/gen_s", 0.0), **(gen or {})})
        return True

    # ------------------------------------------------------------------ steps
    async def _fetch_batch(self, n: int) -> Optional[list[RolloutSample]]:
        """``n`` usable prompt groups; drops (counted, with a reason, budget released) what cannot train.

        Returns ``None`` when the queue was shut down, or when ``trainer.total_time_s`` and its grace
        (:meth:`time_budget_grace`) ran out while waiting (then ``_time_stop`` is set and the rollouter admits nothing
        more): a run whose groups are all filtered (DAPO with ``max_num_gen_batches=0`` and a constant reward) or
        whose rollout stalls still ends on its time budget, and a batch due at the budget's end still trains."""
        bound, fg = self.budget.staleness_bound, self.cfg.algorithm.filter_groups
        total_s = self.cfg.trainer.total_time_s
        got: list[RolloutSample] = []
        filtered = warned = 0  # dapo_no_signal drops this step; batches' worth of them
        late = False  # the budget is spent: one more fetch takes what is queued (a colocated round generated in time)
        while len(got) < n:
            t = time.time()
            left = self.t_start + total_s + self.time_budget_grace() - t if total_s else None
            if left is None:
                new = await self.mq.get_samples_async(n - len(got))
            else:  # None on timeout, as on shutdown: the time budget tells them apart
                new = None if late else await self.mq.get_samples_async(n - len(got), timeout=max(left, 0.1))
                late = left <= 0
            self.idle_s += time.time() - t
            if new is None:
                if total_s and time.time() - self.t_start >= total_s:  # timed out, not shut down
                    self._time_stop = True
                    if self.rollouter is not None:
                        await self.rollouter.close_admission.remote()
                return None
            for s in new:
                if isinstance(s, UnreadableSample):  # could not be unpickled here (logged by the queue's client)
                    if s.seq is not None:
                        self.ledger.record("fetched", s.seq)
                        self.ledger.record("failed/unpicklable", s.seq)
                    continue
                s.timings["dequeued"] = time.time()
                self.ledger.record("fetched", s.seq)
                lag = self.param_version - (s.min_global_steps if s.min_global_steps is not None else self.param_version)
                values = self._filter_values(s) if fg.enable and lag <= bound else None
                reason = ("stale" if lag > bound else
                          "dapo_no_signal" if values is not None and not has_signal(values) else None)
                if reason is None:
                    got.append(s)
                    self._in_step.append(s.seq)  # fetched, not trained yet (failed if the step raises)
                    continue
                self.dropped[reason] += 1
                if reason == "stale":
                    self.stale_length_counts.update(len(o.response_ids) for o in s.outputs)
                elif values:
                    self.filtered_scores[float(values[0])] += 1
                drop = "stale_at_trainer" if reason == "stale" else reason
                self.ledger.record(f"dropped/{drop}", s.seq)
                await self.mq.actor.record_drop.remote(drop)
                await self.rollouter.release_budget.remote()
                filtered += reason == "dapo_no_signal"
            if fg.enable and fg.max_num_gen_batches > 0 and filtered >= fg.max_num_gen_batches * n:
                raise RuntimeError(
                    f"algorithm.filter_groups dropped {filtered} prompt groups without reward variance in one step "
                    f"(limit max_num_gen_batches={fg.max_num_gen_batches} x {n}): the data is too easy or too hard "
                    "for the model; raise the limit (0 = unlimited) or change the data")
            if fg.enable and filtered // n > warned:  # verl keeps generating with 0 too, and says so per batch
                warned = filtered // n
                self._filter_warning.batch_dropped(filtered, warned, n, len(got), self.dropped["dapo_no_signal"], fg)
        if self.cfg.actor_rollout_ref.hybrid_engine:  # colocated: mini-batches in dataset order, as verl's
            got.sort(key=lambda s: (s.timings["taken"], s.index))  # (the queue holds them in completion order)
        return got

    async def _watchdog_funnel(self) -> dict:
        """The funnel state the watchdog reads, with the scores of the groups ``filter_groups`` dropped."""
        return {**await self._funnel_state(), "filtered_scores": dict(self.filtered_scores)}

    def request_stop(self, reason: str) -> None:
        """Stop after the running step (the driver's Ctrl-C); the driver then shuts the queue down, so a fetch
        waiting for a batch returns and :meth:`fit` ends with ``stop_reason`` = ``reason``."""
        self._stop_requested = reason

    def _filter_values(self, s: RolloutSample) -> list[float]:
        """DAPO's ``filter_groups.metric`` of each response of a group (``acc``: rule reward; else shaped)."""
        if self.cfg.algorithm.filter_groups.metric == "acc":
            return s.rewards
        lengths = torch.tensor([len(o.response_ids) for o in s.outputs])
        return shaped_scores(torch.tensor(s.rewards), lengths, self.cfg).tolist()

    def _update(self, batch: Batch) -> dict:
        """Critic first (values of this step's returns), then the actor (after ``trainer.critic_warmup``)."""
        cfg, actor, at = self.cfg, self.cfg.actor_rollout_ref.actor, self.cfg.async_training
        metrics: dict = {}
        if self.critic is not None:
            metrics.update(run_updates(self.critic, batch, critic_loss_fn(cfg), at.require_batches, cfg.critic.ppo_epochs))
        if self.global_steps >= cfg.trainer.critic_warmup:
            metrics.update(run_updates(self.engine, batch, actor_loss_fn(cfg), at.require_batches, actor.ppo_epochs,
                                       with_entropy=bool(actor.entropy_coeff)))
        return metrics

    async def _rollout_metrics(self) -> dict[str, float]:
        """The rollouter's side of the step's row, asked once the step's batch is fetched: ``rollouter/idle_ratio``,
        ``rollouter/queue_size`` and the engines' ``rollout/engine_*`` since the previous step's fetch
        (:meth:`FullyAsyncRollouter.step_metrics`)."""
        if self.rollouter is None:
            return {}
        ro, mq = await asyncio.gather(self.rollouter.step_metrics.remote(), self.mq.stats_async())
        return {**ro, "rollouter/queue_size": mq.size}

    async def call_rollouter(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``rollouter.<name>(...)`` for the driver when the rollouter lives in this process (``local_rollout``)."""
        return await getattr(self.rollouter, name).remote(*args, **kwargs)

    async def call_message_queue(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """``message_queue.<name>(...)`` for the driver when the queue lives in this process (``local_rollout``)."""
        return await getattr(self.mq.actor, name).remote(*args, **kwargs)

    async def initial_sync(self) -> dict:
        """Push the starting weights as the current version (0, or a resumed checkpoint's): for
        replicas reused from an earlier run, random (``load_format=dummy``) ones, or a trainer that
        starts from a checkpoint."""
        metrics = await self.weight_sender.send(self.param_version)
        self.synced_step = self.global_steps
        return metrics

    async def shutdown(self) -> None:
        """Release the weight-sync transport and, with fsdp2, the trainer workers."""
        await self.weight_sender.shutdown()
        if self.engine is not self.weight_sender and hasattr(self.engine, "shutdown"):
            await self.engine.shutdown()

    async def final_sync(self) -> Optional[dict]:
        """Push the latest weights if the last steps were not synced yet (before the final evaluation)."""
        if self.global_steps % self.cfg.async_training.trigger_parameter_sync_step != 0:
            return await self._sync_weights()
        return None

"""Hang watchdog and start-time checks: say which limit keeps the trainer from completing a step.

::

    HangWatchdog (a task in the trainer actor; wakes every few seconds)
        no step completed for trainer.watchdog_timeout_s?
          -> rollouter.funnel_state() + MessageQueue stats + the trainer's phase
          -> diagnose(state, previous check's, window start's)  -> Diagnosis(binding, message, funnel)
          -> logger.warning(message) once per timeout period; status()["watchdog"] (the dashboard)
    check_can_fill_batch(rows, cfg, tokenizer)   at Experiment.start, before any actor:
          a dataset smaller than one step, or prompts all longer than data.max_prompt_length
          -> ConfigError naming the numbers and the keys to change (instead of waiting forever)

Binding limits, in the order they are checked (the first that holds is named): the trainer itself
(stuck updating / syncing / checkpointing), no replica in the pool, the rollouter paused for a sync,
DAPO's ``filter_groups`` dropping (at the trainer) at least half the groups fetched in the stall window (before
the staleness budget: each dropped group releases budget that the rollouter refills at once, so the budget reads
full throughout such a stall), the staleness budget (``staleness_samples >= max_required_samples``), every recent
prompt dropped or failed, the concurrency limit (``active >= max_concurrent_samples``: generation is the bottleneck),
an empty feed, otherwise generation in progress.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Awaitable, Callable, Optional

from asyncrl.config import ConfigError, ExperimentConfig
from asyncrl.staleness import SampleBudget, sample_budget

logger = logging.getLogger(__name__)


@dataclass
class Diagnosis:
    """Why no trainer step completed.

    Attributes:
        binding: ``trainer_<phase>`` | ``no_replica`` | ``paused`` | ``staleness_budget`` | ``dropped`` |
            ``failed`` | ``filtered`` | ``concurrency`` | ``feed`` | ``generation``.
        message: one line naming the limit, its numbers and its config key.
        waited_s: seconds since the last completed step (or the start).
        funnel: the state it was derived from (pending, active, queue size, paused, staleness ...).
    """

    binding: str
    message: str
    waited_s: float
    funnel: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _top(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:3])


def _filtered(f: dict, start: Optional[dict]) -> tuple[int, int, float]:
    """``(groups dropped by filter_groups, groups the trainer fetched, seconds)`` between ``start`` and ``f``
    (the MessageQueue's ``dapo_no_signal`` drops and gets); zeros without a window start."""
    if start is None:
        return 0, 0, 0.0
    filtered = f.get("queue_drops", {}).get("dapo_no_signal", 0) - start.get("queue_drops", {}).get("dapo_no_signal", 0)
    fetched = f.get("queue_gets", 0) - start.get("queue_gets", 0)
    # a group is counted fetched when the trainer takes it and dropped a moment later, so groups taken just before the
    # window start and dropped in it made the real run say "dropped 808 of the 800": they were fetched in the window
    return filtered, max(fetched, filtered), f.get("time", 0.0) - start.get("time", 0.0)


def _filtered_scores(f: dict, start: Optional[dict]) -> str:
    """What the groups ``filter_groups`` dropped between ``start`` and ``f`` scored, from the trainer's
    ``filtered_scores`` (``{score every response of a dropped group got: groups}``): 0 = too hard (or a reward
    that never matches), 1 = too easy."""
    now, before = f.get("filtered_scores", {}), (start or {}).get("filtered_scores", {})
    window = {k: v - before.get(k, 0) for k, v in now.items() if v > before.get(k, 0)}
    if not window:
        return ("every response of a group got the same score: the reward gives every sample the same score, or "
                "the data is too easy / too hard for the model")
    total = sum(window.values())
    top, n = max(window.items(), key=lambda kv: kv[1])
    what = {0.0: "the data is too hard for the model, or the reward never matches its ground truth",
            1.0: "the data is too easy for the model"}.get(float(top), "the reward gives every sample the same score")
    if n == total:
        return f"every response of every dropped group scored {top:g}: {what}"
    return f"{n} of the {total} dropped groups scored {top:g} on every response: {what}"


def _window_words(window_s: float, waited_s: float) -> str:
    """Where in the stall a count was taken: the head says "no trainer step for {waited_s} s", and the window opens at
    half the timeout at the earliest, so a window shorter than the stall is named as a part of it (it read "no trainer
    step for 30 s ... in the last 15 s", as if the watchdog's window were shorter than its own timeout)."""
    if round(window_s) >= round(waited_s):
        return f"in those {waited_s:.0f} s"
    return f"in the last {window_s:.0f} s of those {waited_s:.0f} s"


def diagnose(f: dict, budget: SampleBudget, waited_s: float, previous: Optional[dict] = None,
             window_start: Optional[dict] = None) -> Diagnosis:
    """Name the binding limit from a funnel state.

    Args:
        f: ``rollouter.funnel_state()`` plus ``queue_size`` and ``trainer_phase`` / ``trainer_phase_s``, and the
            trainer's ``filtered_scores`` (what the groups ``filter_groups`` dropped scored; optional).
        budget: the run's :class:`~asyncrl.staleness.SampleBudget`.
        waited_s: seconds without a completed step.
        previous: the funnel state of the previous check (for "every prompt since was dropped").
        window_start: a funnel state taken during the stall, before the first overdue check (for the groups
            ``filter_groups`` dropped in the stall); ``previous`` when ``None``.
    """
    need, q = budget.required_samples, f.get("queue_size", 0)
    head = f"no trainer step for {waited_s:.0f} s (step {f.get('global_steps', 0) + 1} needs {need} samples, queue has {q})"

    def d(binding: str, why: str) -> Diagnosis:
        return Diagnosis(binding, f"{head}: {why}", waited_s, dict(f))

    phase = f.get("trainer_phase", "fetch")
    if phase != "fetch":
        return d(f"trainer_{phase}", f"the trainer has been in '{phase}' for {f.get('trainer_phase_s', 0):.0f} s")
    if f.get("replicas_in_pool", 1) == 0:
        return d("no_replica", f"no rollout replica is in the load balancer's pool (0 of {f.get('replicas_total')}; "
                               f"failed replicas rejoin after Ray restarts them, actor_rollout_ref.rollout.max_restarts)")
    if f.get("paused"):
        return d("paused", "the rollouter is paused for a weight sync")
    # DAPO dynamic sampling: groups are generated and reach the trainer, which drops those whose every response
    # scored the same (asyncrl.trainer.fully_async_trainer._fetch_batch): generation looks busy, no batch fills.
    # Checked before the staleness budget: each dropped group releases its budget and the rollouter refills it at
    # once, so the budget reads full at every check of such a stall although the trainer is the one dropping
    filtered, fetched, window_s = _filtered(f, window_start or previous)
    if filtered > 0 and 2 * filtered >= fetched:
        return d("filtered", f"algorithm.filter_groups dropped {filtered} of the {fetched} prompt groups generated and "
                             f"fetched by the trainer {_window_words(window_s, waited_s)} (no reward variance: "
                             f"{_filtered_scores(f, window_start or previous)}); check the reward function and the "
                             "data's ground truth, or set algorithm.filter_groups.enable=false (train on them: no "
                             "gradient under GRPO) or algorithm.filter_groups.max_num_gen_batches=K (fail the step "
                             "after K batches' worth)")
    if f.get("staleness_samples", 0) >= budget.max_required_samples:
        return d("staleness_budget", f"staleness budget exhausted: staleness_samples {f['staleness_samples']} >= "
                                     f"max_required_samples {budget.max_required_samples} (async_training."
                                     f"staleness_threshold / trigger_parameter_sync_step, at most the run's total_training_steps x "
                                     f"required_samples); no new sample starts until a sync")
    if previous is not None:
        taken = f.get("taken", 0) - previous.get("taken", 0)
        enq = f.get("enqueued", 0) - previous.get("enqueued", 0)
        dropped = {k: v - previous.get("dropped", {}).get(k, 0) for k, v in f.get("dropped", {}).items()}
        failed = {k: v - previous.get("failed", {}).get(k, 0) for k, v in f.get("failed", {}).items()}
        dropped, failed = {k: v for k, v in dropped.items() if v}, {k: v for k, v in failed.items() if v}
        if taken > 0 and enq == 0 and (dropped or failed) and f.get("active", 0) == 0:
            if sum(dropped.values()) >= sum(failed.values()):
                hint = " (data.max_prompt_length)" if "prompt_too_long" in dropped else ""
                return d("dropped", f"every prompt taken since the last check was dropped: {_top(dropped)}{hint}")
            return d("failed", f"every prompt taken since the last check failed: {_top(failed)}")
    if f.get("active", 0) >= budget.max_concurrent_samples:
        return d("concurrency", f"all max_concurrent_samples={budget.max_concurrent_samples} slots are generating "
                                f"(actor_rollout_ref.rollout.concurrent_samples_per_replica x num_replicas); "
                                f"the oldest for {f.get('oldest_active_s', 0):.0f} s: generation is the bottleneck")
    if f.get("pending", 0) == 0 and f.get("active", 0) == 0:
        return d("feed", "nothing pending or generating: the feed from the dataset is not producing prompts")
    return d("generation", f"{f.get('active', 0)} samples generating, {f.get('pending', 0)} pending; "
                           f"the oldest running for {f.get('oldest_active_s', 0):.0f} s")


async def rollouter_funnel_state(ro: Any) -> dict:
    """A :class:`~asyncrl.rollouter.FullyAsyncRollouter`'s funnel, as :func:`diagnose` reads it."""
    now = time.time()
    q = await ro.mq.stats_async()  # the trainer records its drops (stale_at_trainer, dapo_no_signal) there
    return {"pending": ro.pending_queue.qsize(), "active": len(ro.active_tasks), "paused": ro.paused,
            "staleness_samples": ro.staleness_samples, "taken": ro.counts["taken"], "enqueued": ro.counts["enqueued"],
            "dropped": dict(ro.dropped), "failed": dict(ro.failed), "replicas_in_pool": len(await ro.lb.servers_async()),
            "replicas_total": len(ro.replicas), "oldest_active_s": max((now - t for t in ro.started_at.values()), default=0.0),
            "param_version": ro.param_version, "time": now, "queue_gets": q.gets, "queue_drops": dict(q.drop_reasons)}


class HangWatchdog:
    """Checks progress every ``min(10, timeout / 4)`` s; logs and keeps the last :class:`Diagnosis`.

    The groups ``filter_groups`` dropped are counted over a window of at most the last ``timeout_s`` of the stall: a
    step that runs past half the timeout has its funnel state read once then (so the first warning, at ``timeout_s``
    without a step, counts over the last half of the stall and says so: "in the last 15 s of those 30 s"), and each
    overdue check's state is kept while it is younger than ``timeout_s``. Steps shorter than half the timeout cost no
    funnel call.

    Args:
        timeout_s: ``trainer.watchdog_timeout_s`` (> 0).
        budget: the run's sample budget.
        last_progress: ``() -> time of the last completed step`` (or of the start).
        funnel: ``async () -> funnel state dict`` (see :func:`diagnose`).
    """

    def __init__(self, timeout_s: float, budget: SampleBudget, last_progress: Callable[[], float],
                 funnel: Callable[[], Awaitable[dict]]):
        self.timeout_s, self.budget = timeout_s, budget
        self.last_progress, self.funnel = last_progress, funnel
        self.diagnosis: Optional[Diagnosis] = None
        self._previous: Optional[dict] = None
        self._window: collections.deque = collections.deque()  # (time, funnel state) of this stall, oldest first
        self._window_step: Optional[float] = None  # last_progress() of the stall the window belongs to
        self._last_warning = 0.0
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def check(self) -> Optional[Diagnosis]:
        """One check now; returns the diagnosis when the trainer is overdue (else ``None``)."""
        last = self.last_progress()
        waited = time.time() - last
        if waited < self.timeout_s:
            self.diagnosis, self._previous = None, None
            if waited >= self.timeout_s / 2 and self._window_step != last:
                self._window, self._window_step = collections.deque([(time.time(), await self.funnel())]), last
            return None
        state = await self.funnel()
        if self._window_step != last:  # a stall whose half-timeout check was missed
            self._window, self._window_step = collections.deque(), last
        while len(self._window) > 1 and time.time() - self._window[0][0] > self.timeout_s:
            self._window.popleft()
        start = self._window[0][1] if self._window else None
        self.diagnosis = diagnose(state, self.budget, waited, self._previous, start)
        self._previous = state
        self._window.append((time.time(), state))
        if time.time() - self._last_warning >= self.timeout_s:
            logger.warning("watchdog: %s", self.diagnosis.message)
            self._last_warning = time.time()
        return self.diagnosis

    async def _run(self) -> None:
        period = max(0.5, min(10.0, self.timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let the watchdog take the trainer down
                logger.debug("watchdog check failed: %s", exc)


def check_can_fill_batch(rows: list[dict], cfg: ExperimentConfig, tokenizer: Any) -> int:
    """Refuse, before anything starts, a run whose data can never fill one trainer step.

    Prompts are rendered in the first epoch's order until ``required_samples`` fit in
    ``data.max_prompt_length`` (usually the first ``required_samples`` rows), so the check is cheap
    when it passes.

    Returns:
        The number of prompts checked.

    Raises:
        ConfigError: fewer rows than ``required_samples``, or fewer usable prompts than that.
    """
    from asyncrl.agent_loop.single_turn import render_prompt_ids
    from asyncrl.data.sampler import epoch_order

    b = sample_budget(cfg)
    ac = cfg.actor_rollout_ref.actor
    need = (f"one trainer step needs required_samples = ppo_mini_batch_size {ac.ppo_mini_batch_size} x "
            f"async_training.require_batches {cfg.async_training.require_batches} = {b.required_samples} prompts")
    if len(rows) < b.required_samples:
        raise ConfigError(f"the training data has {len(rows)} prompts but {need}; lower "
                          "actor_rollout_ref.actor.ppo_mini_batch_size or async_training.require_batches, or add data")
    usable, longest, checked = 0, 0, 0
    for i in epoch_order(len(rows), cfg.trainer.seed, 0, cfg.data.shuffle):
        n = len(render_prompt_ids(tokenizer, list(rows[i]["prompt"]), rows[i].get("tools")))
        checked += 1
        longest = max(longest, n)
        usable += n <= cfg.data.max_prompt_length
        if usable >= b.required_samples:
            return checked
    raise ConfigError(f"only {usable} of {len(rows)} prompts fit data.max_prompt_length={cfg.data.max_prompt_length} "
                      f"tokens (the longest is {longest}) but {need}; raise data.max_prompt_length or shorten the prompts")

"""The rollouter's read side: evaluation, live status and per-step metrics (:class:`RolloutStatusMixin`).

A mixin of :class:`asyncrl.rollouter.FullyAsyncRollouter` (which owns the state it reads: ``counts``,
``dropped``, ``failed``, ``active_tasks``, ``pending_queue``, ``replicas``, ``recent*``, ``idle_s`` ...); nothing
here starts or stops generation. ``snapshot()`` feeds the widgets and ``Experiment.status()``,
``step_metrics()`` the trainer's row (``rollouter/*``, ``rollout/engine_*``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Optional

from asyncrl.rollout.engine_stats import merge_windows, window_metrics
from asyncrl.sample import trajectory_view

logger = logging.getLogger(__name__)


class RolloutStatusMixin:
    """Evaluation, status and metrics of a :class:`~asyncrl.rollouter.FullyAsyncRollouter` (see the module docstring)."""

    # ------------------------------------------------------------------ evaluation
    def start_evaluation(self) -> None:
        """Run held-out greedy evaluation of the current version in the background (none without held-out rows)."""
        if self.val_rows and (self._eval_task is None or self._eval_task.done()):
            self._eval_task = asyncio.create_task(self.evaluate())

    async def evaluate(self, limit: Optional[int] = None) -> dict:
        """Greedy accuracy on the held-out rows at the current version, through the same agent loops
        as training (so tool tasks are evaluated multi-turn); appended to ``eval_history``. A sample
        that fails is counted (``eval/failed`` by reason), never fatal: see :mod:`asyncrl.evaluation`. Without
        held-out rows (:func:`asyncrl.data.dataset.no_held_out`) nothing is evaluated nor recorded: ``{}``."""
        from asyncrl.evaluation import evaluate

        return await evaluate(self, limit) if self.val_rows else {}

    async def wait_evaluation(self) -> None:
        if self._eval_task is not None:
            await asyncio.gather(self._eval_task, return_exceptions=True)

    # ------------------------------------------------------------------ status
    def trajectories(self, n: int = 8) -> list[dict]:
        """The last ``n`` trajectories (first response of each recent sample) with decoded tokens
        (:func:`asyncrl.sample.trajectory_view`, computed here: one tokenizer call per token)."""
        return [trajectory_view(s, self.tokenizer) for s in list(self.recent_trajectories)[-n:]] if n > 0 else []

    def accounting(self) -> dict:
        return {"taken": self.counts["taken"], "enqueued": self.counts["enqueued"],
                "pending": self.pending_queue.qsize(), "active": len(self.active_tasks),
                "dropped": dict(self.dropped), "failed": dict(self.failed)}

    def idle_ratio(self) -> float:
        """Share of wall time since the start with no prompt group in generation (the replicas idle)."""
        now = time.time()
        idle = self.idle_s + (now - self._idle_since if self._idle_since else 0.0)
        return min(1.0, idle / max(1e-9, now - self.t_start))

    async def _engine_windows(self) -> list[dict]:
        """Every replica's engine iteration sums since the previous call (each restarts its window). A replica
        that cannot answer now (down, restarting), or a handle without statistics, is left out."""
        names = [n for n in self.replicas if hasattr(self.replicas[n], "iteration_stats")]
        windows = await asyncio.gather(*[self.replicas[n].iteration_stats.remote() for n in names],
                                       return_exceptions=True)
        for name, w in zip(names, windows):
            if isinstance(w, BaseException):
                logger.debug("replica %s gave no iteration stats: %s", name, w)
        return [w for w in windows if isinstance(w, dict)]

    async def step_metrics(self) -> dict[str, float]:
        """The rollouter's side of a trainer step's row: ``rollouter/idle_ratio`` (cumulative from the start),
        ``rollouter/dropped_stale_in_generation`` (so far) and ``rollout/engine_*`` (the replicas' engine iterations
        since the previous call, merged: :func:`asyncrl.rollout.engine_stats.window_metrics`)."""
        return {"rollouter/idle_ratio": self.idle_ratio(),
                "rollouter/dropped_stale_in_generation": self.dropped.get("stale_in_generation", 0),
                **window_metrics(merge_windows(await self._engine_windows()))}

    async def snapshot(self) -> dict:
        """Live state for widgets and ``Experiment.status()`` (cheap; no generation)."""
        return {
            "param_version": self.param_version,
            "staleness_samples": self.staleness_samples,
            "paused": self.paused,
            "admission_closed": self.admission_closed,
            "pending_queue": self.pending_queue.qsize(),
            "pending_queue_max": self.budget.read_ahead,
            "active_tasks": len(self.active_tasks),
            "max_concurrent_samples": self.budget.max_concurrent_samples,
            "max_required_samples": self.budget.max_required_samples,
            "required_samples": self.budget.required_samples,
            "idle_ratio": self.idle_ratio(),
            "accounting": self.accounting(),
            "recent_failures": self.failures.snapshot(),
            "data_position": {**self.sampler.position.state_dict(), "rows": len(self.train_rows)},
            "replica_health": self.replica_health(),
            "eval_history": list(self.eval_history),
            "partial_spans": list(self.partial_spans)[-64:],
            "recent": list(self.recent)[-64:],
            **await self.agent_loops.funnel_view(),
            "load_balancer": {**await self.lb.snapshot_async(),
                              "max_in_flight_per_server": self.cfg.actor_rollout_ref.rollout.max_num_seqs},
        }

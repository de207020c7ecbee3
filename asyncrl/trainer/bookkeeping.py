"""The trainer's bookkeeping: version lags of trained tokens, the per-step metrics row, the live status.

Mixed into :class:`~asyncrl.trainer.fully_async_trainer.FullyAsyncTrainer` (it reads the trainer's counters:
``trained``, ``lag_counts``, ``updates_at_version``, ``history``, ``idle_s``, ``t_start``; see its ``__init__``).
Metric names follow verl's (``staleness/*``, ``trainer/idle_ratio``, ``rollouter/*``, ``timing/*``).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from asyncrl.sample import RolloutSample
from asyncrl.staleness import token_lags
from asyncrl.trainer.engine import Batch, gradient_rows


def _counts(values: torch.Tensor) -> dict:
    """``{value: occurrences}`` of an integer tensor (no per-element loop)."""
    return dict(zip(*(t.tolist() for t in torch.unique(values, return_counts=True))))


class TrainerBookkeeping:
    """Counters and rows of :class:`FullyAsyncTrainer` (a mixin; no state of its own)."""

    # ------------------------------------------------------------------ bookkeeping
    def _on_synced(self, version: int) -> None:
        self.updates_at_version[version] = self.updates  # for staleness/update_lag_*

    def _record_versions(self, samples: list[RolloutSample], batch: Batch) -> torch.Tensor:
        """Count trained tokens per version lag (staleness histogram, invariant tests) and trained rows per
        response length, all of them and those with a gradient (the run's workload, which the simulator can
        price: ``asyncrl.sim.workload.empirical_lengths`` / ``gradient_fraction``); returns the lags."""
        self.trained += len(samples)
        lags = token_lags(self.param_version, batch.response_versions, batch.response_mask)
        self.lag_counts.update(_counts(lags))
        self.response_length_counts.update(_counts(batch.response_lengths))
        if "advantages" in batch.extras:
            self.gradient_length_counts.update(_counts(batch.response_lengths[gradient_rows(batch)]))
        for s in samples:
            self.trained_token_versions.append((self.param_version, s.min_global_steps, s.max_global_steps))
            self.trained_rows.append((self.global_steps, s.seq, s.index))
        return lags.float()

    def _log_step(self, samples: list[RolloutSample], batch: Batch, lags: torch.Tensor, upd: dict, sync: dict, timing: dict) -> None:
        mask = batch.response_mask
        proc = [s.timings["finished"] - s.timings["started"] for s in samples]
        spans = [s.max_global_steps - s.min_global_steps for s in samples if None not in (s.max_global_steps, s.min_global_steps)]
        self._t_logged = time.time()
        wall = max(1e-9, self._t_logged - self.t_start)
        row = {  # asyncrl.tracking.STEP_COLUMNS, in order (metrics.csv's header before the first row)
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
            "trainer/dropped_dapo_no_signal": self.dropped["dapo_no_signal"],
        }
        outs = [o for s in samples for o in s.outputs]
        counted = ("agent/tool_errors/", "agent/sandbox/errors/")  # error counts: summed; reward/*: mean
        for k in sorted({k for o in outs for k in o.metrics if k.startswith(("reward/", *counted))}):
            vals = [float(o.metrics[k]) for o in outs if k in o.metrics]
            row[k] = float(np.sum(vals) if k.startswith(counted) else np.mean(vals))
        row.update(upd)
        row.update(sync)
        row.update(timing)
        if self.tracking is not None:
            self.tracking.log(row)  # metrics.csv + loggers, flushed now; appends to self.history
        else:
            self.history.append(row)

    # ------------------------------------------------------------------ status
    def status(self) -> dict:
        """Live trainer state (cheap)."""
        wall = max(1e-9, ((self.done and self._t_logged) or time.time()) - self.t_start)  # done: = last row's
        return {"global_steps": self.global_steps, "param_version": self.param_version, "trained": self.trained,
                "dropped": dict(self.dropped), "idle_ratio": min(1.0, self.idle_s / wall), "done": self.done,
                "error": self.error, "stop_reason": self.stop_reason, "lag_counts": dict(self.lag_counts),
                "response_length_counts": dict(self.response_length_counts),
                "gradient_length_counts": dict(self.gradient_length_counts),
                "stale_length_counts": dict(self.stale_length_counts),
                "updates": self.updates, "updates_at_version": dict(self.updates_at_version),
                "staleness_bound": self.budget.staleness_bound, "history": list(self.history),
                "last_checkpoint": self.last_checkpoint, "phase": self.phase, "replica_events": list(self.replica_events),
                "watchdog": self.watchdog.diagnosis.to_dict() if self.watchdog and self.watchdog.diagnosis else None}

    def history_since(self, n: int) -> list[dict]:
        return self.history[n:]

    def trained_versions(self) -> list[tuple[int, int, int]]:
        return list(self.trained_token_versions)

    def trained_samples(self) -> list[tuple[int, int, int]]:
        """``(step, seq, dataset row index)`` of every sample trained by this process."""
        return list(self.trained_rows)

    def time_budget_grace(self) -> float:
        """Seconds a fetch may wait past ``trainer.total_time_s``: twice the longest step so far, at least 30. A batch
        due when the budget ends still trains as the last step (as the step count's last step; without it a
        time-budget stop left up to twice the samples a step-count stop leaves at shutdown), and a run whose batches
        never come (every group filtered) still ends."""
        return max(30.0, 2.0 * max((h.get("timing/step_s", 0.0) for h in self.history), default=0.0))

    def _set_phase(self, phase: str) -> None:
        self.phase, self.phase_since = phase, time.time()

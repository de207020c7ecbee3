"""The host a simulated trainer and its replicas share: the trainer's busy spans, over which the replicas'
decode pays the contention term (:attr:`asyncrl.sim.cost_models.RolloutCostModel.contention`).

::

    CostModelTrainEngine._spend ──trainer_busy(start, end)──► HostLoad ──_load_changed()──► CostModelInferenceEngine
                                                                (each replica reprices its running decode)
"""

from __future__ import annotations

import bisect
from typing import Any


class HostLoad:
    """The trainer's busy spans on the host the replicas share, so that a replica's decode iterations are
    stretched by ``1 + contention`` (:attr:`RolloutCostModel.contention`) only while the trainer computes, as the
    contention probe measured them (the engine with the trainer busy throughout; module docstring of
    :mod:`asyncrl.sim.cost_models`). Until session 25 every decode iteration of an async run paid it, while the
    trainer of a rollout-bound run computes half the time or less (``trainer/idle_ratio`` 0.5-0.64): a run with a
    large contention term (0.88, session 24) was simulated up to 23% slow.

    The :class:`~asyncrl.sim.train_engines.CostModelTrainEngine` reports each priced call
    (:meth:`trainer_busy`, virtual seconds); the :class:`CostModelInferenceEngine` objects given ``host=`` price
    their decode over these spans. Spans arrive in time order and do not overlap (the trainer runs one call at a
    time)."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.engines: list[Any] = []

    def trainer_busy(self, start: float, end: float) -> None:
        """The trainer computes from ``start`` to ``end`` (virtual s); every engine reprices its running decode."""
        if not end > start:
            return
        if self.ends and start < self.ends[-1]:  # a call charged right after the last one: they touch
            start = self.ends[-1]
            if not end > start:
                return
        self.starts.append(start)
        self.ends.append(end)
        for engine in self.engines:
            engine._load_changed()

    def _from(self, t: float) -> int:
        return bisect.bisect_right(self.ends, t)  # the first span that ends after t

    def busy_seconds(self, t0: float, t1: float) -> float:
        """Seconds of ``[t0, t1]`` the trainer is busy."""
        total = 0.0
        for i in range(self._from(t0), len(self.starts)):
            if self.starts[i] >= t1:
                break
            total += min(t1, self.ends[i]) - max(t0, self.starts[i])
        return total

    def free_seconds(self, t0: float, t1: float, contention: float) -> float:
        """``[t0, t1]`` in seconds of an engine alone: the busy part counts ``1 / (1 + contention)``."""
        return (t1 - t0) - self.busy_seconds(t0, t1) * contention / (1.0 + contention)

    def after(self, t0: float, free_s: float, contention: float) -> float:
        """The time at which an engine starting at ``t0`` has done ``free_s`` seconds of its alone-time work
        (the inverse of :meth:`free_seconds`)."""
        t, left, stretch = t0, free_s, 1.0 + contention
        for i in range(self._from(t0), len(self.starts)):
            gap = max(0.0, self.starts[i] - t)
            if left <= gap:
                return t + left
            left -= gap
            t = max(t, self.starts[i])
            span = (self.ends[i] - t) / stretch
            if left <= span:
                return t + left * stretch
            left -= span
            t = self.ends[i]
        return t + left

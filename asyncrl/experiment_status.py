"""What an :class:`~asyncrl.experiment.Experiment` shows while it runs: a snapshot of every actor (``status`` /
``status_async``, which widgets poll without blocking a notebook's event loop) and its notebook / ``repr`` display.
A mixin of ``Experiment``: it reads the run's actor handles (``rollouter``, ``trainer``, ``mq``), ``summary`` and
``budget``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Optional

import ray


class LiveState:
    """``Experiment``'s live state (see the module docstring)."""

    def _idle_status(self) -> Optional[dict]:
        """The status before start (``not started``) or after stop (``stopped``, with the summary's run dir)."""
        if self._phase == "new" or (self.rollouter is None and self._phase == "started"):
            return {"state": "not started"}
        if self._phase == "stopped":
            return {"state": "stopped", "name": self.name, "run_dir": str(self.run_dir), "finished": self.summary is not None}
        return None

    async def status_async(self) -> dict:
        """Snapshot of every actor (never blocks the event loop); ``{"state": "not started"}`` before :meth:`start`,
        ``{"state": "stopped", ...}`` after :meth:`stop`."""
        idle = self._idle_status()
        if idle is not None:
            return idle
        ro, tr, mq = await asyncio.gather(self.rollouter.snapshot.remote(), self.trainer.status.remote(),
                                          self.mq.stats_async())
        return self._status(ro, tr, mq)

    def status(self) -> dict:
        """Blocking variant of :meth:`status_async` for scripts."""
        idle = self._idle_status()
        if idle is not None:
            return idle
        ro, tr = ray.get([self.rollouter.snapshot.remote(), self.trainer.status.remote()])
        return self._status(ro, tr, self.mq.stats())

    def _status(self, ro: dict, tr: dict, mq: Any) -> dict:
        # elapsed_s stops at the run's wall time once finish() has summarised it: a dashboard's last poll
        # (after the final evaluation) then shows the status line's and the summary's seconds, not later ones
        # likewise its held-out accuracy becomes the summary's "after" figure (the mean of the last evaluations)
        elapsed = self.summary.wall_s if self.summary is not None else time.time() - self.t_start
        after = ({} if self.summary is None or self.summary.accuracy_after is None else
                 {"accuracy_after": self.summary.accuracy_after, "accuracy_after_evals": self.summary.accuracy_after_evals})
        return {"state": "done" if tr["done"] else "running", "name": self.name, "elapsed_s": elapsed, **after,
                "watchdog": tr.get("watchdog"),
                "rollouter": ro, "trainer": tr, "message_queue": dataclasses.asdict(mq),
                "load_balancer": ro.pop("load_balancer", {}), "budget": dataclasses.asdict(self.budget)}

    # rich display in notebooks
    def _repr_html_(self) -> str:
        st = "not started" if self.rollouter is None else ("finished" if self.summary else "running")
        return (f"<b>asyncrl Experiment</b> <code>{self.name}</code> &mdash; {st}<br>"
                f"required_samples={self.budget.required_samples}, max_required_samples={self.budget.max_required_samples}, "
                f"max_concurrent_samples={self.budget.max_concurrent_samples}, staleness_bound={self.budget.staleness_bound}")

    def __repr__(self) -> str:
        return f"Experiment({self.name!r}, budget={self.budget})"


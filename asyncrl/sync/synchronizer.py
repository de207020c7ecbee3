"""ParameterSynchronizer: the sync sequence around a :class:`~asyncrl.sync.base.CheckpointEngine`.

::

    trainer (every trigger_parameter_sync_step fit steps)
      -> rollouter.pause_for_sync()      partial_rollout: replicas pause(mode="abort"); else drain
      -> sender.send(v)                  trainer rank 0 -> CheckpointEngine -> every replica, in memory
      -> rollouter.resume_after_sync(v)  replicas resume, reset_staleness(), maybe evaluate

Each step is timed under ``sync/...`` (seconds). Semantics from the verl fully-async design.
"""

from __future__ import annotations

import time
from typing import Any

from asyncrl.api import WeightSender


class ParameterSynchronizer:
    """Args: ``rollouter``: FullyAsyncRollouter actor handle; ``sender``: pushes the trainer's weights."""

    def __init__(self, rollouter: Any, sender: WeightSender):
        self.rollouter = rollouter
        self.sender = sender

    async def sync(self, version: int) -> dict[str, float]:
        """Pause generation, move weights, resume. Returns ``sync/*`` timings in seconds."""
        t0 = time.perf_counter()
        metrics = dict(await self.rollouter.pause_for_sync.remote())
        t1 = time.perf_counter()
        metrics.update(await self.sender.send(version))
        metrics["sync/transfer_total_s"] = time.perf_counter() - t1
        metrics.update(await self.rollouter.resume_after_sync.remote(version))
        metrics["sync/total_s"] = time.perf_counter() - t0
        return metrics

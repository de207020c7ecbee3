"""ParameterSynchronizer: the sync sequence around a :class:`~asyncrl.sync.base.CheckpointEngine`.

::

    trainer (every trigger_parameter_sync_step fit steps)
      -> rollouter.pause_for_sync()      partial_rollout: replicas pause(mode="abort"); else drain
      -> sender.send(v)                  trainer rank 0 -> CheckpointEngine -> every replica, in memory
      -> rollouter.resume_after_sync(v)  replicas resume, reset_staleness(), maybe evaluate

Each step is timed under ``sync/...`` (seconds). Semantics from the verl fully-async design.
"""

from __future__ import annotations

from typing import Any

from asyncrl.api import WeightSender
from asyncrl.sync.sync_sequence import SyncSteps, run_sync_sequence


class ParameterSynchronizer:
    """Args: ``rollouter``: FullyAsyncRollouter actor handle; ``sender``: pushes the trainer's weights."""

    def __init__(self, rollouter: Any, sender: WeightSender):
        self.rollouter = rollouter
        self.sender = sender

    async def sync(self, version: int) -> dict[str, float]:
        """Pause generation, move weights, resume (resume also when the transfer fails, so rollout is not
        left paused). Returns ``sync/*`` timings in seconds: the sequence's own wall times per step
        (``sync/pause_s``, ``sync/transfer_s`` = ``sync/transfer_total_s``, ``sync/resume_s``: what the
        rollout sees, RPCs included), the rollouter's (``sync/wait_eval_s``) and the transport's."""
        rollouter_metrics: dict[str, float] = {}

        async def pause() -> None:
            rollouter_metrics.update(await self.rollouter.pause_for_sync.remote())

        async def resume() -> None:
            rollouter_metrics.update(await self.rollouter.resume_after_sync.remote(version))

        metrics = await run_sync_sequence(SyncSteps(transfer=lambda: self.sender.send(version), pause=pause,
                                                    resume=resume))
        metrics = {**rollouter_metrics, **metrics}
        metrics["sync/transfer_total_s"] = metrics["sync/transfer_s"]
        return metrics

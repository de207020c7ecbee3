"""The trainer's side of replica faults: weight syncs go to live replicas only, and a restarted
replica gets the current weights before it rejoins (see :mod:`asyncrl.rollout.health`).

::

    replica_down(sid)     (from the rollouter's ReplicaMonitor)  live -= sid; the weight sender's
                          checkpoint engine is rebuilt for the live set before the next send
    rejoin_replica(sid)   under the weights lock (never during an update, sync or checkpoint):
        trainer weights == current version (and in this process)?  -> send them to sid alone (RPC)
        otherwise (trigger_parameter_sync_step > 1, mid-window) -> a full sync: version + 1 everywhere
    _sync_weights()       first a health probe of the live set (one small call per replica): dead,
                          unanswering or restarted-without-weights replicas leave it (reported to the
                          rollouter, so they rejoin later); a send that still fails because one died
                          mid-sync: probe again, drop it, resend, resume

Mixed into :class:`~asyncrl.trainer.fully_async_trainer.FullyAsyncTrainer`, which provides ``cfg``,
``engine``, ``weight_sender`` (:class:`asyncrl.api.WeightSender`), ``synchronizer``, ``rollouter``,
``param_version``, ``global_steps`` and ``synced_step``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

logger = logging.getLogger(__name__)


class FaultTolerantSync:
    cfg: Any
    engine: Any
    weight_sender: Any
    synchronizer: Any
    rollouter: Any
    param_version: int
    global_steps: int
    synced_step: int
    replicas: dict
    live: dict
    _sender_stale: bool = False

    def _init_replicas(self, replicas: dict, sender: Any) -> Any:
        """Remember every replica; returns ``sender`` (the weight sender into all of them)."""
        self.replicas, self.live = dict(replicas), dict(replicas)
        self._weights_lock = asyncio.Lock()  # held while the weights change or are read for a sync
        self.replica_events: list[tuple[str, str, int]] = []  # (event, server_id, version)
        return sender

    async def _rebuild_sender(self) -> None:
        """Point the weight sender's checkpoint engine at the live replicas only."""
        from asyncrl.sync.sender import make_checkpoint_engine

        handles = list(self.live.values())
        self._sender_stale = False
        if hasattr(self.weight_sender, "set_receivers"):  # fsdp2: rank 0 rebuilds its checkpoint engine
            await self.weight_sender.set_receivers(handles)
            return
        old = self.weight_sender.checkpoint_engine  # strategy=cpu: LocalWeightSender
        self.weight_sender.checkpoint_engine = make_checkpoint_engine(self.cfg, handles)
        try:
            await old.shutdown()
        except Exception as exc:  # a transport whose peer died may fail to close
            logger.debug("closing the old weight transport: %s", exc)

    async def replica_down(self, server_id: str) -> None:
        """Stop syncing to ``server_id`` until :meth:`rejoin_replica`."""
        if self.live.pop(server_id, None) is not None:
            self._sender_stale = True
            self.replica_events.append(("down", server_id, self.param_version))

    async def rejoin_replica(self, server_id: str) -> int:
        """Load the current weights into a restarted replica; returns the version it now serves."""
        from asyncrl.sync.cpu_engine import RayRPCCheckpointEngine

        async with self._weights_lock:
            self.live[server_id] = self.replicas[server_id]
            self._sender_stale = True
            if self.synced_step == self.global_steps and hasattr(self.engine, "named_tensors_for_sync"):
                # the trainer's weights are the current version (and in this process): to sid alone
                await RayRPCCheckpointEngine([self.replicas[server_id]]).send_weights(
                    self.engine.named_tensors_for_sync(), self.param_version)
            else:  # updated since the last sync (or fsdp2 workers hold them): a new version, for every replica
                await self._sync_locked(joining=server_id)
            self.replica_events.append(("rejoined", server_id, self.param_version))
            return self.param_version

    async def _sync_weights(self) -> dict:
        async with self._weights_lock:
            return await self._sync_locked()

    async def _sync_locked(self, joining: Optional[str] = None) -> dict:
        """``joining``: a restarted replica this sync brings up to date (it has no current weights yet,
        which the probe must not count against it)."""
        from asyncrl.sync.sender import verify_sync

        version = self.param_version + 1
        await self._drop_dead_replicas(joining)  # a replica that died since the last sync leaves before the send
        if self._sender_stale:
            await self._rebuild_sender()
        try:
            metrics = await self.synchronizer.sync(version)
        except Exception as exc:
            if not await self._drop_dead_replicas(joining):
                raise
            logger.warning("weight sync to v%d failed (%s: %s); resending to the live replicas", version,
                           type(exc).__name__, str(exc)[:200])
            await self._rebuild_sender()
            metrics = dict(await self.weight_sender.send(version))
            metrics.update(await self.rollouter.resume_after_sync.remote(version))
            metrics["sync/replica_faults"] = 1.0
        if self.cfg.actor_rollout_ref.rollout.checkpoint_engine.verify_each_sync:
            metrics.update(await verify_sync(self.weight_sender, list(self.live.values())))
        self.param_version = version
        self.synced_step = self.global_steps
        self._on_synced(version)
        return metrics

    def _on_synced(self, version: int) -> None:
        """Hook: the replicas now serve ``version`` (the trainer records the optimizer updates in it)."""

    async def _drop_dead_replicas(self, joining: Optional[str] = None, timeout_s: float = 5.0) -> list[str]:
        """Probe the live replicas; the ones that died, do not answer, or were restarted without the
        current weights leave the live set (and the pool, so the monitor brings them back)."""
        from asyncrl.rollout.health import is_replica_fault

        names = list(self.live)
        results = await asyncio.gather(*[asyncio.wait_for(self.live[n].health.remote(), timeout_s)
                                         for n in names], return_exceptions=True)
        dead = [n for n, r in zip(names, results)
                if (isinstance(r, BaseException) and (is_replica_fault(r) or isinstance(r, asyncio.TimeoutError)))
                or (isinstance(r, dict) and not r.get("weights_current", True) and n != joining)]
        for n in dead:
            await self.replica_down(n)
            await self.rollouter.report_replica_failure.remote(n, "failed during a weight sync")
        return dead

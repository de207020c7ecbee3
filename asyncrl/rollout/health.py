"""Replica faults: what counts as one, and bringing a restarted replica back with the current weights.

::

    client call fails with a replica fault ──report_failure──► load balancer removes the server
        (ActorDiedError / ActorUnavailableError /            (no new request is routed to it; the
         ReplicaUnavailable)  └─ the request retries on another replica with the tokens it has)
    ReplicaMonitor (task in the rollouter, polls lb.snapshot()["failed"] every second)
        failed server ──► trainer.replica_down(sid)          (weight syncs skip it)
                      ──► await replica.ready()               (Ray restarts the actor, max_restarts;
                                                               the new incarnation starts its engine)
                      ──► trainer.rejoin_replica(sid)         (the current weights, at a step boundary)
                      ──► lb.add_servers({sid: handle})       (routed to again)
        ActorDiedError from ready(): restarts exhausted -> the replica stays out (logged)

A restarted replica refuses ``generate`` with :class:`ReplicaUnavailable` until it has received
weights, so it never serves tokens from its initial checkpoint under the current version's name.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Optional

logger = logging.getLogger(__name__)


class ReplicaUnavailable(RuntimeError):
    """A replica cannot serve right now (restarted, waiting for the current weights)."""


class ReplicaFault(RuntimeError):
    """A request's replica failed (died, restarting, or unavailable); the request may move elsewhere.

    Attributes:
        server_id: the replica that failed.
        cause: the original exception.
    """

    def __init__(self, server_id: Any, cause: BaseException):
        super().__init__(f"replica {server_id} failed: {type(cause).__name__}: {str(cause)[:200]}")
        self.server_id, self.cause = server_id, cause


def is_replica_fault(exc: BaseException) -> bool:
    """True for errors of the replica process rather than of the request: the actor died or is
    restarting (Ray's ``RayActorError`` family), or it refused with :class:`ReplicaUnavailable`."""
    try:
        from ray.exceptions import RayActorError, RayTaskError
    except ImportError:  # pragma: no cover - ray is a dependency
        return isinstance(exc, ReplicaUnavailable)
    if isinstance(exc, (RayActorError, ReplicaUnavailable)):
        return True
    return isinstance(exc, RayTaskError) and isinstance(exc.as_instanceof_cause(), ReplicaUnavailable)


async def report_failure(pool: Any, server_id: Any, exc: BaseException) -> None:
    """Tell the load balancer (when it supports it) to stop routing to ``server_id``."""
    fn = getattr(pool, "report_failure_async", None)
    if fn is not None:
        try:
            await fn(server_id, f"{type(exc).__name__}: {str(exc)[:200]}")
        except Exception as e:  # the pool itself failing must not hide the original error
            logger.warning("could not report the failure of %s: %s", server_id, e)


async def call_live(replicas: dict[str, Any], method: str, *args: Any, pool: Any = None) -> dict[str, Any]:
    """Call ``method`` on every replica concurrently; replica faults are reported to ``pool`` and
    returned instead of raised (other errors raise). Returns ``{server_id: result or fault}``."""
    names = list(replicas)
    results = await asyncio.gather(*[getattr(replicas[n], method).remote(*args) for n in names], return_exceptions=True)
    out = {}
    for name, res in zip(names, results):
        if isinstance(res, BaseException):
            if not is_replica_fault(res):
                raise res
            logger.warning("replica %s failed during %s: %s", name, method, res)
            if pool is not None:
                await report_failure(pool, name, res)
        out[name] = res
    return out


class ReplicaMonitor:
    """Brings failed replicas back (see the module docstring).

    Args:
        replicas: ``{server_id: actor handle}``.
        pool: the load balancer (``snapshot_async`` with a ``failed`` list, ``add_servers_async``).
        on_down: ``async (server_id) -> None``: the trainer stops syncing to it.
        rejoin: ``async (server_id) -> version``: the trainer pushes the current weights to it.
        poll_s: seconds between checks of the pool.
    """

    def __init__(self, replicas: dict[str, Any], pool: Any, on_down: Callable[[str], Awaitable[Any]],
                 rejoin: Callable[[str], Awaitable[int]], poll_s: float = 1.0):
        self.replicas, self.pool = replicas, pool
        self.on_down, self.rejoin = on_down, rejoin
        self.poll_s = poll_s
        self.recovering: dict[str, asyncio.Task] = {}
        self.dead: set[str] = set()
        self.rejoined: list[tuple[str, int]] = []  # (server_id, version) in order
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        tasks = [t for t in [self._task, *self.recovering.values()] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None

    def state(self) -> dict:
        return {"recovering": sorted(self.recovering), "dead": sorted(self.dead), "rejoined": list(self.rejoined)}

    async def _run(self) -> None:
        while True:
            try:
                failed = (await self.pool.snapshot_async()).get("failed", [])
                for sid in failed:
                    if sid in self.replicas and sid not in self.recovering and sid not in self.dead:
                        self.recovering[sid] = asyncio.create_task(self._recover(sid))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep watching
                logger.warning("replica monitor: %s", exc)
            await asyncio.sleep(self.poll_s)

    async def _recover(self, sid: str) -> None:
        from ray.exceptions import ActorDiedError

        try:
            await self.on_down(sid)
            while True:
                try:
                    await self.replicas[sid].ready.remote()  # waits for Ray's restart + engine start
                    break
                except ActorDiedError as exc:
                    self.dead.add(sid)
                    logger.error("replica %s is dead and will not restart (actor_rollout_ref.rollout.max_restarts "
                                 "exhausted): %s", sid, str(exc)[:200])
                    return
                except Exception as exc:  # restarting: try again shortly
                    logger.info("replica %s not ready yet: %s", sid, type(exc).__name__)
                    await asyncio.sleep(self.poll_s)
            version = await self.rejoin(sid)
            await self.pool.add_servers_async({sid: self.replicas[sid]})
            self.rejoined.append((sid, version))
            logger.warning("replica %s restarted and rejoined the pool at version %d", sid, version)
        finally:
            self.recovering.pop(sid, None)


class ReplicaHealthMixin:
    """The rollouter's side of replica faults (mixed into
    :class:`~asyncrl.rollouter.FullyAsyncRollouter`, which provides ``replicas`` and ``lb``)."""

    replicas: dict
    lb: Any
    monitor: Optional[ReplicaMonitor] = None

    def attach_trainer(self, trainer: Any) -> None:
        """Give the monitor the trainer that pushes weights to a restarted replica (call before ``start``)."""
        self.monitor = ReplicaMonitor(self.replicas, self.lb, lambda sid: trainer.replica_down.remote(sid),
                                      lambda sid: trainer.rejoin_replica.remote(sid))

    async def report_replica_failure(self, server_id: str, reason: str) -> bool:
        """A failure seen outside a request (e.g. by a weight sync): stop routing to the replica."""
        return await self.lb.report_failure_async(server_id, reason)

    async def live_replicas(self) -> dict:
        """Replicas not out of the pool after a failure (recovering ones included until they rejoin)."""
        snapshot = getattr(self.lb, "snapshot_async", None)  # a pool without failure tracking: all live
        failed = set((await snapshot()).get("failed", [])) if snapshot is not None else set()
        if self.monitor is not None:
            failed |= set(self.monitor.recovering) | self.monitor.dead
        return {sid: h for sid, h in self.replicas.items() if sid not in failed}

    def replica_health(self) -> dict:
        return self.monitor.state() if self.monitor is not None else {}

"""GlobalRequestLoadBalancer: sticky sessions + least in-flight routing across rollout replicas.

Semantics from verl's ``GlobalRequestLoadBalancer`` (seed ``003`` section 3, seed ``000`` section 2.5):

```
acquire_server(request_id)
  |- request_id in the LRU and its server still in the pool -> that server (sticky hit:
  |                                                             the replica's prefix cache is warm)
  |- request_id in the LRU but its server was removed       -> drop the entry (lazy invalidation)
  '- otherwise: servers with the fewest in-flight requests
        |- one candidate                 -> it
        |- several + full_determinism    -> stable_hash(request_id) % len(candidates)
        '- several                       -> the first (pool insertion order)
  and in the same call: a lease (request_id -> server, incarnation) is recorded
release_server(server_id, request_id)     -> that lease ends   (callers do this in `finally`)
in_flight[server] = leases on the server's current incarnation
```

Bookkeeping is keyed by request, not by replica name: removing a server ends its incarnation, so
leases taken before a remove + re-add under the same id (a restarted replica, a hybrid-engine
handover) no longer count against the new one, and their late releases cannot decrement a count
that belongs to other requests.

Partial-rollout retries reuse the request id, so a resumed generation lands on the replica that
holds its KV cache. One shared Ray actor serialises every call, which is what makes "choose and
count" atomic. :class:`RequestLoadBalancer` is the plain-Python logic (unit-testable without Ray);
:class:`GlobalRequestLoadBalancer` is the public wrapper around a private ``num_cpus=0`` actor.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
from collections import OrderedDict, defaultdict
from typing import Any, AsyncIterator, Mapping, Optional, Sequence

logger = logging.getLogger(__name__)


class NoServerAvailableError(RuntimeError):
    """Raised by ``acquire_server`` when the pool is empty."""


def stable_hash(request_id: str) -> int:
    """A process-independent hash (Python's ``hash`` is salted per process, so it is not used)."""
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big")


class RequestLoadBalancer:
    """The routing state and decisions (no Ray).

    Args:
        servers: initial pool ``{server_id: handle}``; handles are opaque (Ray actor handles).
        max_cache_size: bound of the request-id -> server LRU (least recently used evicted).
        full_determinism: break least-loaded ties by a stable hash of the request id, so a request
            lands on the same replica across runs (needed for reproducible experiments).
    """

    def __init__(
        self,
        servers: Optional[Mapping[str, Any]] = None,
        max_cache_size: int = 10000,
        full_determinism: bool = False,
    ):
        if max_cache_size < 1:
            raise ValueError(f"max_cache_size must be >= 1, got {max_cache_size}")
        self._handles: dict[str, Any] = {}
        self._in_flight: dict[str, int] = {}
        self._incarnation: dict[str, int] = {}  # server id -> incarnation, bumped by each (re-)add
        self._next_incarnation = 0
        self._leases: defaultdict[str, list[tuple[str, int]]] = defaultdict(list)  # request id -> leases
        self._sticky: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self.stale_releases = 0
        self.max_cache_size = max_cache_size
        self.full_determinism = full_determinism
        self.sticky_hits = 0
        self.invalidations = 0
        self.failed: dict[str, str] = {}  # server id -> reason, while out of the pool after a failure
        self.failures = 0
        self.add_servers(dict(servers or {}))

    def acquire_server(self, request_id: str) -> tuple[str, Any]:
        """Choose a server for ``request_id`` and count the request as in flight, in one step.

        Returns:
            ``(server_id, handle)``.

        Raises:
            NoServerAvailableError: the pool is empty.
        """
        if not self._handles:
            raise NoServerAvailableError(
                f"no rollout server in the pool for request {request_id!r}; add_servers() first "
                "(were all replicas removed, e.g. during a hybrid-engine handover?)"
            )
        sticky = self._sticky.get(request_id)
        server_id = None
        if sticky is not None:
            if self._incarnation.get(sticky[0]) != sticky[1]:
                del self._sticky[request_id]  # lazy invalidation: the server was removed (maybe re-added)
                self.invalidations += 1
            else:
                server_id = sticky[0]
        if server_id is not None:
            self._sticky.move_to_end(request_id)
            self.sticky_hits += 1
        else:
            server_id = self._least_loaded(request_id)
            self._sticky[request_id] = (server_id, self._incarnation[server_id])
            if len(self._sticky) > self.max_cache_size:
                self._sticky.popitem(last=False)
        self._in_flight[server_id] += 1
        self._leases[request_id].append((server_id, self._incarnation[server_id]))
        return server_id, self._handles[server_id]

    def _least_loaded(self, request_id: str) -> str:
        low = min(self._in_flight.values())
        candidates = [s for s, n in self._in_flight.items() if n == low]
        if len(candidates) == 1 or not self.full_determinism:
            return candidates[0]
        return candidates[stable_hash(request_id) % len(candidates)]

    def release_server(self, server_id: str, request_id: str) -> None:
        """Request ``request_id`` on ``server_id`` ended (success or error); call it once per acquire.

        A lease taken on an incarnation of ``server_id`` that was since removed ends without touching
        the current counts. A release that matches no lease is logged and ignored (counts never go
        negative).
        """
        leases = self._leases.get(request_id)
        match = next((i for i, (sid, _) in enumerate(leases or []) if sid == server_id), None)
        if match is None:
            logger.warning("release_server(%r, %r) without a matching acquire; counts unchanged", server_id, request_id)
            return
        _, incarnation = leases.pop(match)
        if not leases:
            del self._leases[request_id]
        if self._incarnation.get(server_id) != incarnation:
            self.stale_releases += 1  # the server was removed since: its counts restarted at 0
            logger.debug("release of %r on a removed incarnation of %r", request_id, server_id)
            return
        self._in_flight[server_id] -= 1

    def add_servers(self, servers: Mapping[str, Any]) -> None:
        """Add servers, all at once. A server still in the pool only gets its new handle (same
        incarnation, counts kept); a removed id added again is a new incarnation starting at 0."""
        for sid, handle in servers.items():
            self._handles[sid] = handle
            self.failed.pop(sid, None)
            if sid not in self._in_flight:
                self._in_flight[sid] = 0
                self._next_incarnation += 1
                self._incarnation[sid] = self._next_incarnation

    def remove_servers(self, server_ids: Sequence[str]) -> None:
        """Remove servers, all at once. Sticky entries pointing at them are invalidated lazily and
        their open leases end with this incarnation (see :meth:`release_server`)."""
        for sid in server_ids:
            self._handles.pop(sid, None)
            self._in_flight.pop(sid, None)
            self._incarnation.pop(sid, None)

    def servers(self) -> list[str]:
        """Server ids in the pool (insertion order)."""
        return list(self._handles)

    def report_failure(self, server_id: str, reason: str) -> bool:
        """A call to ``server_id`` failed with a replica fault: take it out of the pool (its leases
        end with this incarnation) and list it under ``failed`` until it is added again. Returns
        True when this report removed it (later reports of the same failure are no-ops)."""
        if server_id not in self._handles:
            return False
        self.remove_servers([server_id])
        self.failed[server_id] = reason
        self.failures += 1
        logger.warning("rollout server %s removed from the pool after a failure: %s", server_id, reason)
        return True

    def snapshot(self) -> dict[str, Any]:
        """State for widgets / metrics: per-server in-flight counts and cache statistics."""
        return {
            "in_flight": dict(self._in_flight),
            "total_in_flight": sum(self._in_flight.values()),
            "sticky_entries": len(self._sticky),
            "sticky_hits": self.sticky_hits,
            "invalidations": self.invalidations,
            "open_leases": sum(len(v) for v in self._leases.values()),
            "stale_releases": self.stale_releases,
            "failed": sorted(self.failed),
            "failures": self.failures,
        }


class LocalRequestLoadBalancer(RequestLoadBalancer):
    """:class:`RequestLoadBalancer` with the awaitable names of the shared actor, for use inside one
    process (agent loops running in the rollouter, ``agent.num_workers=0``): no actor hop per request.
    """

    async def acquire_server_async(self, request_id: str) -> tuple[str, Any]:
        return self.acquire_server(request_id)

    async def release_server_async(self, server_id: str, request_id: str) -> None:
        self.release_server(server_id, request_id)

    async def add_servers_async(self, servers: Mapping[str, Any]) -> None:
        self.add_servers(servers)

    async def remove_servers_async(self, server_ids: Sequence[str]) -> None:
        self.remove_servers(server_ids)

    async def servers_async(self) -> list[str]:
        return self.servers()

    async def report_failure_async(self, server_id: str, reason: str) -> bool:
        return self.report_failure(server_id, reason)

    async def snapshot_async(self) -> dict[str, Any]:
        return self.snapshot()

    def shutdown(self) -> None:
        """Nothing to release (kept for interface parity with :class:`GlobalRequestLoadBalancer`)."""


@functools.lru_cache(maxsize=None)
def _make_actor_cls():
    import ray

    @ray.remote(num_cpus=0)
    class _LoadBalancerActor(RequestLoadBalancer):
        """The shared actor: Ray runs its methods one at a time, so acquire is atomic."""

    return _LoadBalancerActor


class GlobalRequestLoadBalancer:
    """Public handle on the shared load-balancer actor (Ray ``util/queue.py`` pattern).

    Every method exists as ``method`` (blocking, for scripts) and ``method_async`` (awaitable, for
    agent loops and notebook widgets). The wrapper is picklable, so it can be passed to workers.

    Args:
        servers: initial pool ``{server_id: handle}``.
        max_cache_size: sticky LRU bound.
        full_determinism: hash tie-break (see :class:`RequestLoadBalancer`).
        actor_options: extra ``.options(...)`` for the actor (e.g. ``name``, ``lifetime``).

    Example::

        lb = GlobalRequestLoadBalancer({"replica_0": h0, "replica_1": h1})
        async with lb.server("sample-17") as (server_id, handle):
            out = await handle.generate.remote(...)
    """

    def __init__(
        self,
        servers: Optional[Mapping[str, Any]] = None,
        max_cache_size: int = 10000,
        full_determinism: bool = False,
        actor_options: Optional[dict] = None,
    ):
        self.actor = _make_actor_cls().options(**(actor_options or {})).remote(
            servers, max_cache_size, full_determinism
        )

    def acquire_server(self, request_id: str) -> tuple[str, Any]:
        """Blocking :meth:`RequestLoadBalancer.acquire_server` (raises ``NoServerAvailableError``)."""
        return _get(self.actor.acquire_server.remote(request_id))

    async def acquire_server_async(self, request_id: str) -> tuple[str, Any]:
        """Awaitable :meth:`acquire_server`."""
        return await _unwrap(self.actor.acquire_server.remote(request_id))

    def release_server(self, server_id: str, request_id: str) -> None:
        """Blocking :meth:`RequestLoadBalancer.release_server`; call it in ``finally``."""
        _get(self.actor.release_server.remote(server_id, request_id))

    async def release_server_async(self, server_id: str, request_id: str) -> None:
        """Awaitable :meth:`release_server`."""
        await _unwrap(self.actor.release_server.remote(server_id, request_id))

    def add_servers(self, servers: Mapping[str, Any]) -> None:
        """Batch-atomic add (e.g. lend the hybrid engine to the rollout pool)."""
        _get(self.actor.add_servers.remote(dict(servers)))

    async def add_servers_async(self, servers: Mapping[str, Any]) -> None:
        """Awaitable :meth:`add_servers`."""
        await _unwrap(self.actor.add_servers.remote(dict(servers)))

    def remove_servers(self, server_ids: Sequence[str]) -> None:
        """Batch-atomic removal; sticky entries to removed servers are dropped lazily."""
        _get(self.actor.remove_servers.remote(list(server_ids)))

    async def remove_servers_async(self, server_ids: Sequence[str]) -> None:
        """Awaitable :meth:`remove_servers`."""
        await _unwrap(self.actor.remove_servers.remote(list(server_ids)))

    def servers(self) -> list[str]:
        """Server ids in the pool."""
        return _get(self.actor.servers.remote())

    async def servers_async(self) -> list[str]:
        """Awaitable :meth:`servers`."""
        return await _unwrap(self.actor.servers.remote())

    async def report_failure_async(self, server_id: str, reason: str) -> bool:
        """Awaitable :meth:`RequestLoadBalancer.report_failure`."""
        return await _unwrap(self.actor.report_failure.remote(server_id, reason))

    def snapshot(self) -> dict[str, Any]:
        """Per-server in-flight counts and cache statistics (see :meth:`RequestLoadBalancer.snapshot`)."""
        return _get(self.actor.snapshot.remote())

    async def snapshot_async(self) -> dict[str, Any]:
        """Awaitable :meth:`snapshot` (what notebook widgets poll)."""
        return await _unwrap(self.actor.snapshot.remote())

    @contextlib.asynccontextmanager
    async def server(self, request_id: str) -> AsyncIterator[tuple[str, Any]]:
        """``async with lb.server(rid) as (sid, handle)``: acquire, and always release on exit."""
        sid, handle = await self.acquire_server_async(request_id)
        try:
            yield sid, handle
        finally:
            await self.release_server_async(sid, request_id)

    def shutdown(self) -> None:
        """Kill the actor (in-flight calls fail). Idempotent."""
        import ray

        if self.actor is not None:
            ray.kill(self.actor)
            self.actor = None


def _get(ref: Any) -> Any:
    """``ray.get``; a remote ``NoServerAvailableError`` arrives as an instance of that class."""
    import ray

    return ray.get(ref)


async def _unwrap(ref: Any) -> Any:
    return await ref

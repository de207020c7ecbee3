"""MessageQueue: the bounded, sample-by-sample buffer between the Rollouter and the Trainer.

::

    FullyAsyncRollouter --put_sample([bytes|ref])--> MessageQueue --get_samples(n)--> FullyAsyncTrainer
          (waits while full)                   deque + Condition      (waits while empty; woken by
                                                                        put or by shutdown())

A sample is pickled once by the producer (``ray.cloudpickle``, as verl's rollouter does) and travels
inline in the ``put_sample`` call when it is small (:data:`INLINE_MAX_BYTES`: a prompt group of short
responses, a few KB), so the actor holds the bytes and no object-store put, ownership or fetch is paid per
group; a larger one is put in Ray's object store once and the actor stores only its ref (the payload is
never copied through this actor). The consumer unpickles. Semantics from the verl fully-async design
(``MessageQueue`` actor with a condition variable).
"""

from __future__ import annotations

import asyncio
import collections
import io
import logging
import time
from dataclasses import dataclass
from typing import Any, Optional

import ray

logger = logging.getLogger(__name__)

INLINE_MAX_BYTES = 64 * 1024
"""A pickled sample up to this size travels inside the ``put_sample`` call (below Ray's 100 KiB
``max_direct_call_object_size``, past which Ray would put the argument in the object store itself and the actor
would fetch a copy); a larger one is ``ray.put`` once and travels as its ref."""


class _HoldsRayHandle(Exception):
    """Raised inside :func:`_pickle_without_refs` at the first Ray object ref or actor handle in a sample."""


class _RefFreePickler(ray.cloudpickle.CloudPickler):
    """``ray.cloudpickle`` that refuses Ray object refs and actor handles: pickled outside Ray's serializer, a ref
    would keep its object alive forever (its owner never learns when the consumer drops it)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (ray.ObjectRef, ray.actor.ActorHandle)):
            raise _HoldsRayHandle
        return super().reducer_override(obj)


def _pickle_without_refs(sample: Any) -> Optional[bytes]:
    """``sample`` pickled (``ray.cloudpickle``), or ``None`` when it holds a Ray object ref or actor handle (then
    it travels through ``ray.put``, whose serializer tracks them)."""
    buf = io.BytesIO()
    try:
        _RefFreePickler(buf, protocol=5).dump(sample)
    except _HoldsRayHandle:
        return None
    return buf.getvalue()


@dataclass
class PickledSample:
    """A sample pickled by the producer (``ray.cloudpickle``), unpickled by the consumer
    (:meth:`MessageQueue.get_samples_async`); the queue actor only holds it. ``seq``: the sample's ``seq`` (a
    :class:`~asyncrl.sample.RolloutSample`'s), so one that cannot be unpickled is still accounted for."""

    data: bytes
    seq: Optional[int] = None

    def load(self) -> Any:
        return ray.cloudpickle.loads(self.data)


@dataclass
class UnreadableSample:
    """What :meth:`MessageQueue.get_samples_async` returns in place of a sample that could not be unpickled in the
    consumer (a class the consumer's process cannot import, a ``__reduce__`` that raises): its ``seq`` (``None``
    when the producer's sample had none) and the error. The trainer records it as ``failed/unpicklable``; the
    other samples of the same get come back as usual."""

    seq: Optional[int]
    error: str


def _unwrap(value: Any) -> Any:
    if not isinstance(value, PickledSample):
        return value
    try:
        return value.load()
    except Exception as exc:  # noqa: BLE001 - any unpickling error: reported, accounted for, the rest kept
        logger.error("a queued sample (seq %s) could not be unpickled in the consumer: %r", value.seq, exc)
        return UnreadableSample(value.seq, f"{type(exc).__name__}: {exc}")


class QueueShutdown(RuntimeError):
    """Raised to producers when the queue was shut down (the sample is counted as dropped)."""


@dataclass
class QueueStats:
    """Counters of a :class:`MessageQueue` (all counts are samples = prompt groups)."""

    size: int
    maxsize: int
    puts: int
    gets: int
    drops: int
    drop_reasons: dict
    waiting_getters: int
    waiting_putters: int
    shutdown: bool
    shutdown_reason: str = ""
    """Why the queue was shut down early (a fatal rollout condition); ``""`` for a normal stop."""


class _MessageQueueActor:
    def __init__(self, maxsize: int):
        if maxsize < 1:
            raise ValueError(f"MessageQueue maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self.items: collections.deque = collections.deque()
        self.cond = asyncio.Condition()
        self.puts = self.gets = 0
        self.drops: collections.Counter = collections.Counter()
        self.waiting_getters = self.waiting_putters = 0
        self.closed = False
        self.shutdown_reason = ""

    async def put_sample(self, wrapped_ref: list, timeout: Optional[float] = None) -> bool:
        """Append one sample (its pickled bytes, or a ref); waits while full. Returns False on timeout; raises
        on shutdown."""
        async with self.cond:
            self.waiting_putters += 1
            try:
                ok = await asyncio.wait_for(
                    self.cond.wait_for(lambda: self.closed or len(self.items) < self.maxsize), timeout
                ) if timeout is not None else await self.cond.wait_for(
                    lambda: self.closed or len(self.items) < self.maxsize)
            except asyncio.TimeoutError:
                return False
            finally:
                self.waiting_putters -= 1
            del ok
            if self.closed:
                self.drops["queue_shutdown"] += 1
                raise QueueShutdown("MessageQueue is shut down; sample dropped")
            self.items.append((wrapped_ref[0], time.time()))
            self.puts += 1
            self.cond.notify_all()
            return True

    async def get_samples(self, n: int = 1, timeout: Optional[float] = None) -> Optional[list]:
        """Pop ``n`` samples (as put: bytes or refs) in FIFO order, waiting until ``n`` are there.

        Returns ``None`` after :meth:`shutdown` (also when a getter was already waiting) or on
        timeout; never a partial batch.
        """
        async with self.cond:
            self.waiting_getters += 1
            try:
                pred = lambda: self.closed or len(self.items) >= n  # noqa: E731
                if timeout is None:
                    await self.cond.wait_for(pred)
                else:
                    await asyncio.wait_for(self.cond.wait_for(pred), timeout)
            except asyncio.TimeoutError:
                return None
            finally:
                self.waiting_getters -= 1
            if self.closed:
                return None
            out = [[self.items.popleft()[0]] for _ in range(n)]
            self.gets += n
            self.cond.notify_all()
            return out

    def size(self) -> int:
        return len(self.items)

    def record_drop(self, reason: str, n: int = 1) -> None:
        """Count samples dropped elsewhere in the pipeline (kept here so stats add up in one place)."""
        self.drops[reason] += n

    def stats(self) -> QueueStats:
        return QueueStats(len(self.items), self.maxsize, self.puts, self.gets, sum(self.drops.values()),
                          dict(self.drops), self.waiting_getters, self.waiting_putters, self.closed,
                          self.shutdown_reason)

    async def shutdown(self, reason: str = "") -> int:
        """Close the queue, wake every waiter; items still queued are counted as dropped. ``reason``:
        why the run must stop (the trainer raises it; ``""``: a normal stop)."""
        async with self.cond:
            self.closed = True
            self.shutdown_reason = self.shutdown_reason or reason
            left = len(self.items)
            if left:
                self.drops["unconsumed_at_shutdown"] += left
            self.items.clear()
            self.cond.notify_all()
            return left


class MessageQueue:
    """Bounded FIFO of rollout samples shared by the Rollouter and Trainer (a Ray actor).

    Args:
        maxsize: capacity in samples (prompt groups); the rollouter's ``max_required_samples``.
        actor_options: extra ``ray.remote`` options (``name``, ``namespace``, ...).

    Producers call :meth:`put_payload_async` with the sample (pickled once; inline up to :data:`INLINE_MAX_BYTES`,
    else through the object store), or :meth:`put_sample_async` with an object ref (``ray.put(sample)``);
    consumers call :meth:`get_samples_async`, which returns the samples.
    """

    in_process = False
    """True for a queue whose producer and consumer share its process (:meth:`from_handle`): samples are handed
    over as the objects themselves, nothing serialized."""

    def __init__(self, maxsize: int, actor_options: Optional[dict] = None):
        opts = {"num_cpus": 0, "max_concurrency": 1000}
        opts.update(actor_options or {})
        self.maxsize = maxsize
        self.actor = ray.remote(_MessageQueueActor).options(**opts).remote(maxsize)

    @classmethod
    def from_handle(cls, handle: Any, maxsize: int, in_process: bool = False) -> "MessageQueue":
        """A client on an existing queue: a Ray actor handle, or any object with the same ``.method.remote()``
        calls (an in-process body: ``asyncrl.sim.handles.LocalActorHandle``; a driver's forwarder). ``in_process``:
        the rollouter and trainer using this client run in the queue's process and event loop (see
        :attr:`in_process`)."""
        self = cls.__new__(cls)
        self.actor, self.maxsize, self.in_process = handle, maxsize, in_process
        return self

    # producer side
    async def put_payload_async(self, sample: Any, timeout: Optional[float] = None) -> bool:
        """Enqueue one sample: pickled here, inside the call when it is at most :data:`INLINE_MAX_BYTES` (the queue
        actor holds the bytes), else put in Ray's object store once and fetched once by the consumer; on an
        :attr:`in_process` queue, handed over as the object (an already-resolved future: no pickling, no copy).
        Waits while full; returns False on timeout; raises :class:`QueueShutdown` after shutdown.

        Raises:
            QueueShutdown: the queue was shut down (the sample is counted as dropped there).
            pickle.PicklingError / TypeError: the sample cannot be pickled (nothing was enqueued)."""
        if self.in_process:
            ref: Any = asyncio.get_running_loop().create_future()
            ref.set_result(sample)
            return await self.put_sample_async(ref, timeout)
        data = _pickle_without_refs(sample)
        if data is None:  # it holds Ray refs / actor handles: Ray's own serializer, which tracks them
            return await self.put_sample_async(ray.put(sample), timeout)
        payload = PickledSample(data, getattr(sample, "seq", None))
        return await self.actor.put_sample.remote([payload if len(data) <= INLINE_MAX_BYTES else ray.put(payload)],
                                                  timeout)

    async def put_sample_async(self, sample_ref: ray.ObjectRef, timeout: Optional[float] = None) -> bool:
        """Enqueue a sample ref; waits while full. Raises :class:`QueueShutdown` after shutdown."""
        return await self.actor.put_sample.remote([sample_ref], timeout)

    def put_sample(self, sample_ref: ray.ObjectRef, timeout: Optional[float] = None) -> bool:
        return ray.get(self.actor.put_sample.remote([sample_ref], timeout))

    # consumer side
    async def get_samples_async(self, n: int = 1, timeout: Optional[float] = None) -> Optional[list]:
        """Dequeue ``n`` samples (unpickled; those put as refs fetched from the object store), or ``None`` on
        shutdown/timeout. A sample that cannot be unpickled here comes back as an :class:`UnreadableSample` (logged
        as an error), the others as usual."""
        wrapped = await self.actor.get_samples.remote(n, timeout)
        if wrapped is None:
            return None
        items = [w[0] for w in wrapped]
        refs = [i for i, x in enumerate(items) if isinstance(x, (ray.ObjectRef, asyncio.Future))]
        for i, value in zip(refs, await asyncio.gather(*[items[i] for i in refs])):
            items[i] = value
        return [_unwrap(x) for x in items]

    def get_samples(self, n: int = 1, timeout: Optional[float] = None) -> Optional[list]:
        wrapped = ray.get(self.actor.get_samples.remote(n, timeout))
        if wrapped is None:
            return None
        items = [w[0] for w in wrapped]
        return [_unwrap(ray.get(x) if isinstance(x, ray.ObjectRef) else x) for x in items]

    async def size_async(self) -> int:
        return await self.actor.size.remote()

    def stats(self) -> QueueStats:
        return ray.get(self.actor.stats.remote())

    async def stats_async(self) -> QueueStats:
        return await self.actor.stats.remote()

    def shutdown(self, reason: str = "") -> int:
        """Close the queue and wake blocked getters; returns the number of unconsumed samples.
        ``reason`` (a fatal rollout condition) makes the trainer stop with that error."""
        return ray.get(self.actor.shutdown.remote(reason))

    async def shutdown_async(self, reason: str = "") -> int:
        """:meth:`shutdown` from async code."""
        return await self.actor.shutdown.remote(reason)

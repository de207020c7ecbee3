"""LLMServerClient and FullyAsyncLLMServerClient: route a request to a replica and survive aborts.

::

    agent loop --generate(request_id, prompt_ids, sp)--> FullyAsyncLLMServerClient
        loop:  acquire_server(request_id)  (sticky: retries land on the same replica)
               replica.generate(prompt + generated so far, max_tokens = remaining budget)
               release_server(server_id, request_id) in finally
               stop_reason == "aborted"?  -> partial_rollout: resubmit after the replica resumes
                                             otherwise: raise GenerationAborted (sample is dropped)
               replica fault (died / restarting)?  -> report it (the balancer stops routing there),
                                             resubmit prompt + tokens so far on another replica
                                             (waits while the pool is empty; at most max_replica_faults)
        returns one TokenOutput whose tokens may span several parameter versions
        (response_versions: the engine's version of each token, carried across resumes)

    coalesced(key): requests under one key that reach one replica actor in the same event-loop turn
        (a prompt group's trajectories) travel in one ``generate_many`` Ray call, a streaming generator:
        each request's result arrives (and its lease ends) when the engine ends that request

Semantics from the verl fully-async design: a weight sync aborts in-flight requests; the client
resumes from prompt + generated tokens with the remaining budget, never past ``response_length``,
and keeps the per-token versions the engine reported (``TokenOutput.response_versions``). The abort
is invisible to the agent loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator, Optional, Protocol, Sequence

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from asyncrl.rollout.base import SamplingParams, TokenOutput
from asyncrl.rollout.health import ReplicaFault, is_replica_fault, report_failure

logger = logging.getLogger(__name__)


class GenerationAborted(RuntimeError):
    """A request was aborted and ``partial_rollout`` is off: the sample must be dropped and counted.

    Attributes:
        partial: the tokens generated before the abort (a ``ResumableOutput``), when known.
    """

    partial: Optional["ResumableOutput"] = None


class StaleGeneration(GenerationAborted):
    """A partial rollout's resubmission would start on a version newer than its oldest token's version + the
    staleness bound: the trainer would drop its sample (``stale_at_trainer``), so it is dropped now
    (``stale_in_generation``) instead of generating on. ``partial``: the tokens generated before."""


class ServerPool(Protocol):
    """What the client needs from a load balancer (see GlobalRequestLoadBalancer)."""

    async def acquire_server_async(self, request_id: str) -> tuple[Any, Any]: ...
    async def release_server_async(self, server_id: Any, request_id: str) -> None: ...


@dataclass
class ResumableOutput(TokenOutput):
    """A TokenOutput assembled from one or more engine calls (``response_versions`` spans them all).

    Attributes:
        num_aborts: how many times the request was aborted and resumed.
        server_ids: replica that served each engine call (sticky routing keeps them equal).
        replica_faults: calls lost to a failed replica and resubmitted elsewhere.
    """

    num_aborts: int = 0
    server_ids: list[Any] = field(default_factory=list)
    replica_faults: int = 0


_COALESCE_KEY: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("asyncrl_coalesce_key", default=None)
@dataclass
class StalenessLimit:
    """The staleness bound of one sample (a prompt group, trained whole) and the oldest token version any of its
    requests has returned so far: no request of it should start on a version past ``oldest + bound``
    (``bound=None``: no limit, the oldest version is still tracked for the engine's ``priority``)."""

    bound: Optional[int]
    oldest: Optional[int] = None

    def note(self, versions: Sequence[int]) -> None:
        if versions:
            self.oldest = min(versions) if self.oldest is None else min(self.oldest, min(versions))

    @property
    def max_start_version(self) -> Optional[int]:
        return None if self.oldest is None or self.bound is None else self.oldest + self.bound


_STALENESS: contextvars.ContextVar[Optional[StalenessLimit]] = contextvars.ContextVar("asyncrl_staleness", default=None)


@contextlib.contextmanager
def staleness_bounded(bound: Optional[int], track: bool = False) -> Iterator[Optional[StalenessLimit]]:
    """Requests made inside this block (and the tasks it starts) are for one sample, which the trainer drops once
    its oldest token is more than ``bound`` versions behind it (:func:`asyncrl.staleness.staleness_bound`): a
    request (a partial rollout's resubmission, a tool loop's next turn) that would start beyond the oldest token
    any of them has returned + ``bound`` ends with :class:`StaleGeneration` instead of generating tokens nobody
    trains. A request made inside carries the sample's oldest token version as its ``priority`` once any request of
    the sample has returned tokens (older samples first under ``rollout.scheduling_policy=priority``; before that
    ``None``: the engine's current version). Yields the sample's :class:`StalenessLimit`; ``None``
    (``bound=None`` and not ``track``: evaluation, samples never trained): no limit, no priority."""
    limit = StalenessLimit(bound) if bound is not None or track else None
    token = _STALENESS.set(limit)
    try:
        yield limit
    finally:
        _STALENESS.reset(token)


@contextlib.contextmanager
def coalesced(key: Optional[str]) -> Iterator[None]:
    """Requests made inside this block (and the tasks it starts) that reach one replica actor in the same
    event-loop turn under the same ``key`` travel in one Ray call (``generate_many``) instead of one each.

    The call streams: each request's result comes back when the engine ends it, so its caller goes on and
    its load-balancer lease ends then, not when the group's last request ends (the funnel and least-loaded
    routing never count a finished request). Used for the ``n`` trajectories of one prompt group
    (``actor_rollout_ref.rollout.agent.coalesce_group_requests``): on 2 CPU cores a Ray actor call per
    request was a large part of the rollout's glue (benchmarks/RESULTS.md, sessions 10 and 11).
    """
    token = _COALESCE_KEY.set(key)
    try:
        yield
    finally:
        _COALESCE_KEY.reset(token)


class _Coalescer:
    """Per (replica actor, key): requests of one event-loop turn, sent by one ``generate_many`` call."""

    def __init__(self) -> None:
        self.pending: dict[tuple[int, str], tuple[Any, list]] = {}

    def submit(self, handle: Any, key: str, request: tuple) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        slot = (id(handle), key)
        if slot not in self.pending:
            self.pending[slot] = (handle, [])
            loop.call_soon(self._flush, slot)
        self.pending[slot][1].append((request, fut))
        return fut

    def _flush(self, slot: tuple[int, str]) -> None:
        handle, items = self.pending.pop(slot)
        live = [(req, fut) for req, fut in items if not fut.done()]  # cancelled before the call left
        if live:
            asyncio.ensure_future(self._send(handle, live))

    @staticmethod
    async def _send(handle: Any, items: list) -> None:
        try:
            if len(items) == 1:
                _resolve(items[0][1], await handle.generate.remote(*items[0][0]))
                return
            # each request's result as the engine ends it (the caller then ends its lease), not at the call's end
            async for batch in _stream(handle.generate_many, [req for req, _ in items]):
                for index, res in batch:
                    _resolve(items[index][1], res)
        except BaseException as exc:  # the call itself failed (a dead actor): every request still waiting sees it
            for _, fut in items:
                if not fut.done():
                    fut.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for request, fut in items:
            if not fut.done():
                fut.set_exception(RuntimeError(f"generate_many ended without a result for request {request[0]}"))


def _resolve(fut: asyncio.Future, res: Any) -> None:
    if not fut.done():  # a caller cancelled meanwhile
        fut.set_exception(res) if isinstance(res, BaseException) else fut.set_result(res)


async def _stream(method: Any, requests: list) -> AsyncIterator[Any]:
    """The items ``method`` (a replica's ``generate_many``) yields for ``requests``, one Ray call: a Ray actor
    method as a streaming generator (an ObjectRef per item, awaited here); an in-process stand-in's
    ``remote`` (the simulator's handles, test fakes) returns the async generator itself."""
    options = getattr(method, "options", None)
    stream = options(num_returns="streaming").remote(requests) if options is not None else method.remote(requests)
    async for item in stream:
        yield (await item) if inspect.isawaitable(item) else item


_COALESCER = _Coalescer()


async def _call_replica(handle: Any, request_id: str, prompt_ids: list[int], sp: SamplingParams) -> TokenOutput:
    key = _COALESCE_KEY.get()
    if key is not None and hasattr(handle, "generate_many") and hasattr(handle.generate_many, "remote"):
        return await _COALESCER.submit(handle, key, (request_id, prompt_ids, sp))
    if hasattr(handle, "generate_async"):
        return await handle.generate_async(request_id, prompt_ids, sp)
    if hasattr(handle, "generate") and hasattr(handle.generate, "remote"):
        return await handle.generate.remote(request_id, prompt_ids, sp)
    return await handle.generate(request_id, prompt_ids, sp)


async def _replica_version(handle: Any) -> int:
    handle = getattr(handle, "actor", handle)  # a RolloutReplica wrapper: talk to its actor
    if hasattr(handle, "param_version") and hasattr(handle.param_version, "remote"):
        return int(await handle.param_version.remote())
    version = getattr(handle, "param_version", 0)
    return int(version() if callable(version) else version)


class LLMServerClient:
    """One request -> one replica call, routed by a load balancer.

    Args:
        pool: a :class:`ServerPool` (``acquire_server_async`` / ``release_server_async``).
    """

    def __init__(self, pool: ServerPool):
        self.pool = pool

    async def _once(self, request_id: str, prompt_ids: list[int], sp: SamplingParams) -> tuple[TokenOutput, Any]:
        server_id, handle = await self.pool.acquire_server_async(request_id)
        try:
            return await _call_replica(handle, request_id, prompt_ids, sp), server_id
        except Exception as exc:
            if is_replica_fault(exc):
                await report_failure(self.pool, server_id, exc)
                raise ReplicaFault(server_id, exc) from exc
            raise
        finally:
            await self.pool.release_server_async(server_id, request_id)

    async def generate(self, request_id: str, prompt_ids: Sequence[int], sampling_params: SamplingParams) -> TokenOutput:
        out, _ = await self._once(request_id, list(prompt_ids), sampling_params)
        return out

    async def engine_version(self, request_id: str) -> int:
        """The parameter version the replica serving ``request_id`` holds now (sticky routing: the
        replica its generations went to). For trajectories without any generated token."""
        server_id, handle = await self.pool.acquire_server_async(request_id)
        try:
            return await _replica_version(handle)
        finally:
            await self.pool.release_server_async(server_id, request_id)


def as_server_manager(server: Any, server_id: str = "local") -> Any:
    """The agent loops' ``server_manager`` for ``server``: a client as it is, an engine behind a client.

    An in-process :class:`~asyncrl.api.InferenceEngine` (e.g. ``HFEngine`` in a notebook) has ``generate``
    but not the client's ``engine_version``; it is put behind an :class:`LLMServerClient` over a
    one-server in-process load balancer, the same path a replica takes, so every agent loop sees one
    interface.

    Args:
        server: an :class:`LLMServerClient` (or anything with ``engine_version``), or an engine/replica
            handle with ``generate`` (and ``param_version``), or ``None`` (returned as it is).
        server_id: the load balancer's id for a wrapped engine.

    Raises:
        TypeError: ``server`` has neither ``engine_version`` nor ``generate``.
    """
    if server is None or hasattr(server, "engine_version"):  # None: a loop built only to read its config
        return server
    if not hasattr(server, "generate"):
        raise TypeError(f"server_manager needs generate(request_id, prompt_ids, sampling_params); got {type(server).__name__}")
    from asyncrl.rollout.load_balancer import LocalRequestLoadBalancer

    return LLMServerClient(LocalRequestLoadBalancer({server_id: server}))


class FullyAsyncLLMServerClient(LLMServerClient):
    """Client with the partial-rollout resume loop.

    Args:
        pool: load balancer.
        partial_rollout: resume aborted requests (True) or raise :class:`GenerationAborted` (False).
        max_resumes: safety bound on resubmissions of one request.
        max_replica_faults: replica failures one request survives before it fails (with the fault).
        replica_wait_s: how long a request waits for a replica while the pool is empty (all failed,
            restarting).
    """

    def __init__(self, pool: ServerPool, partial_rollout: bool = True, max_resumes: int = 1000,
                 max_replica_faults: int = 3, replica_wait_s: float = 300.0):
        super().__init__(pool)
        self.partial_rollout = partial_rollout
        self.max_resumes = max_resumes
        self.max_replica_faults = max_replica_faults
        self.replica_wait_s = replica_wait_s
        self.replica_faults_total = 0  # engine calls lost to a failed replica, all requests

    async def _call(self, request_id: str, prompt_ids: list[int], sp: SamplingParams,
                    result: "ResumableOutput") -> tuple[TokenOutput, Any]:
        """One engine call that survives replica faults (resubmitted elsewhere) and an empty pool
        (waits, with backoff, up to ``replica_wait_s``).

        Raises:
            ReplicaFault: after ``max_replica_faults`` faults of this request.
            NoServerAvailableError: the pool stayed empty for ``replica_wait_s``.
        """
        from asyncrl.rollout.load_balancer import NoServerAvailableError

        while True:
            try:
                # the common case first, without a retry object: building tenacity's per request was
                # 40% of the colocated rollout's event-loop thread (benchmarks/RESULTS.md, session 9)
                try:
                    return await self._once(request_id, prompt_ids, sp)
                except NoServerAvailableError:
                    pass  # the pool is empty: wait for a replica, with backoff
                async for attempt in AsyncRetrying(retry=retry_if_exception_type(NoServerAvailableError),
                                                   wait=wait_exponential(multiplier=0.2, max=5.0),
                                                   stop=stop_after_delay(self.replica_wait_s), reraise=True):
                    with attempt:
                        return await self._once(request_id, prompt_ids, sp)
            except ReplicaFault as fault:
                result.replica_faults += 1
                self.replica_faults_total += 1
                if result.replica_faults > self.max_replica_faults:
                    raise
                logger.warning("request %s: %s; resubmitting %d tokens elsewhere", request_id, fault,
                               len(result.token_ids))

    async def generate(self, request_id: str, prompt_ids: Sequence[int], sampling_params: SamplingParams) -> ResumableOutput:
        """Generate up to ``sampling_params.max_tokens`` tokens in total, across aborts.

        The caller's ``sampling_params`` is never mutated; each resubmission gets a copy with
        ``max_tokens`` reduced by what was already generated, so the total never exceeds it.

        Raises:
            GenerationAborted: when aborted and ``partial_rollout`` is False (tokens so far attached
                as ``.partial``), or when ``max_resumes`` is exceeded.
            StaleGeneration: inside :func:`staleness_bounded`, the request would start on a version more than the
                bound past its sample's oldest token (a ``GenerationAborted``).
        """
        budget = int(sampling_params.max_tokens)
        prompt = list(prompt_ids)
        result = ResumableOutput(token_ids=[], log_probs=[] if sampling_params.logprobs else None)
        while True:
            remaining = budget - len(result.token_ids)
            if remaining <= 0:
                result.stop_reason = "length"
                return result
            limit = _STALENESS.get()
            sp = dataclasses.replace(sampling_params, max_tokens=remaining,
                                     stop_token_ids=list(sampling_params.stop_token_ids),
                                     max_start_version=limit.max_start_version if limit is not None else None,
                                     priority=limit.oldest if limit is not None else None)
            out, server_id = await self._call(request_id, prompt + result.token_ids, sp, result)
            if out.stop_reason == "stale":
                err = StaleGeneration(f"request {request_id}: its sample's oldest token (version {limit.oldest}) would "
                                      f"be more than {limit.bound} versions behind the trainer")
                err.partial = result
                raise err
            if limit is not None:
                limit.note(out.response_versions)
            new = list(out.token_ids)[:remaining]
            result.token_ids.extend(new)
            if result.log_probs is not None:
                result.log_probs.extend(list(out.log_probs or [0.0] * len(new))[:len(new)])
            result.response_versions.extend(list(out.response_versions)[:len(new)])
            result.num_preempted += out.num_preempted
            result.server_ids.append(server_id)
            if out.top_logprobs is not None:
                result.top_logprobs = (result.top_logprobs or []) + list(out.top_logprobs)[:len(new)]
            if out.routed_experts is not None:  # appended, never overwritten
                result.routed_experts = (result.routed_experts or []) + list(out.routed_experts)
            if out.stop_reason != "aborted":
                result.stop_reason = out.stop_reason
                return result
            result.num_aborts += 1
            if not self.partial_rollout:
                err = GenerationAborted(f"request {request_id} aborted after {len(result.token_ids)} tokens "
                                        "and partial_rollout is off")
                err.partial = result
                raise err
            if result.num_aborts > self.max_resumes:
                raise GenerationAborted(f"request {request_id} aborted {result.num_aborts} times")
            logger.debug("request %s aborted at %d tokens; resuming", request_id, len(result.token_ids))

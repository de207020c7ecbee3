"""RolloutReplica: one inference engine in its own Ray actor (the backend registry: :mod:`asyncrl.rollout.backends`).

::

    Rollouter / AgentLoopWorker ──generate_async──► RolloutReplica ──► _ReplicaActor (Ray, async)
    ParameterSynchronizer ─update_weights(refs)──┘                       │ owns one InferenceEngine
                          ─init_weight_group / receive_weights_broadcast ┤ (vllm | hf)
                          ─init_nccl_receiver / receive_weights_nccl ────┘

Semantics follow verl's fully-async design: the rollouter pauses the replicas (``pause("abort")``
for partial rollout, ``pause("wait")`` otherwise), the synchronizer pushes weights, the rollouter
resumes them. ``update_weights`` does not pause by itself, so the caller decides the mode.

The backend registry (:mod:`asyncrl.rollout.backends`, re-exported here) is lazy: ``import asyncrl`` never imports
vLLM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any, AsyncIterator, Literal, Optional, Sequence

from asyncrl.api import InferenceEngine
from asyncrl.rollout.backends import (BACKENDS, engine_kwargs_from_config, get_backend_cls, known_backends,  # noqa: F401
                                      register_backend)
from asyncrl.rollout.base import SamplingParams, TokenOutput

logger = logging.getLogger(__name__)


def was_actor_restarted() -> bool:
    """Whether the calling process is a Ray actor that Ray restarted after a crash. ``False`` outside an
    actor: an actor body built in-process (the simulator, ``agent.num_workers=0`` paths), with or without a
    Ray driver in the process (a notebook's), is never a restart; Ray asserts if asked there."""
    import ray

    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return False
    return bool(ray.get_runtime_context().was_current_actor_reconstructed)


def _outcome(task: asyncio.Future) -> Any:
    """A finished task's result, or its exception (a cancelled one: ``CancelledError``) as a value."""
    if task.cancelled():
        return asyncio.CancelledError("the engine request was cancelled")
    return task.exception() or task.result()


class _ReplicaActor:
    """The Ray actor body (async: Ray runs many calls concurrently on one event loop)."""

    def __init__(self, backend: str, engine_kwargs: dict[str, Any], replica_rank: int, cpu_affinity: str = "",
                 frontend_cpu_affinity: str = ""):
        from asyncrl.cpu_affinity import pin_rollout_engine

        pin_rollout_engine(cpu_affinity)  # before the engine (and its processes) start
        self.frontend_cpu_affinity = frontend_cpu_affinity  # where this process goes once they have (frontend_cores)
        self.backend = backend
        self.replica_rank = replica_rank
        self.engine: InferenceEngine = get_backend_cls(backend)(**engine_kwargs)
        self._start_task: Optional[asyncio.Future] = None
        self._stats = self.fresh_stats()
        self.init_pause_state()
        # Ray restarted this actor after a crash (rollout.max_restarts): its engine holds the initial
        # checkpoint, not the current weights, so it serves nothing until it has been given them.
        self.restarted = was_actor_restarted()
        self.weights_current = not self.restarted

    @staticmethod
    def fresh_stats() -> dict[str, Any]:
        """The replica's counters at zero; every body of this actor (the in-process ``LocalReplica`` too)
        starts from here, so a counter added for one is there for all."""
        return {"requests": 0, "generated_tokens": 0, "aborted": 0, "weight_updates": 0, "last_sync_s": 0.0,
                "group_calls": 0, "stale": 0}

    def init_pause_state(self) -> None:
        """Not paused; no request waiting for a resume (see :meth:`start_version`)."""
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._aborted = asyncio.Event()  # set (and replaced) by abort_all_requests: releases the waiters

    async def start_version(self) -> Optional[int]:
        """The parameter version a request starting now runs on: the current one, or, while paused for a
        sync, the one the replica resumes with (waits for it). ``None``: :meth:`abort_all_requests` came first."""
        if not self._resumed.is_set():
            aborted = self._aborted
            waits = [asyncio.ensure_future(self._resumed.wait()), asyncio.ensure_future(aborted.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            if aborted.is_set():
                return None
        return self.param_version()

    async def start(self) -> None:
        """Start the engine once; concurrent / repeated calls await the same start."""
        if self._start_task is None:
            self._start_task = asyncio.ensure_future(self._start_engine())
        await asyncio.shield(self._start_task)

    async def _start_engine(self) -> None:
        await self.engine.start()
        spec = getattr(self, "frontend_cpu_affinity", "")  # LocalReplica (hybrid_rollout) builds no __init__ of ours
        if spec:  # the engine's processes keep the affinity they started with
            from asyncrl.cpu_affinity import pin_threads

            pin_threads(spec)
            logger.info("replica %d: the engine's front end moved to cores %s (rollout.frontend_with_glue)",
                        self.replica_rank, spec)

    async def ready(self) -> bool:
        await self.start()
        return True

    async def generate(self, request_id: str, prompt_ids: Sequence[int], sampling_params: SamplingParams) -> TokenOutput:
        if not self.weights_current:
            from asyncrl.rollout.health import ReplicaUnavailable

            raise ReplicaUnavailable(f"replica {self.replica_rank} was restarted and has not received the current "
                                     "weights yet")
        if sampling_params.max_start_version is not None:  # a partial rollout's resubmission (SamplingParams)
            version = await self.start_version()
            if version is None or version > sampling_params.max_start_version:
                self._stats["stale"] += version is not None
                return TokenOutput(token_ids=[], log_probs=[] if sampling_params.logprobs else None,
                                   stop_reason="aborted" if version is None else "stale")
        out = await self.engine.generate(request_id, prompt_ids, sampling_params)
        self._stats["requests"] += 1
        self._stats["generated_tokens"] += len(out.token_ids)
        self._stats["aborted"] += out.stop_reason == "aborted"
        return out

    async def generate_many(self, requests: list) -> AsyncIterator[list]:
        """:meth:`generate` for each ``(request_id, prompt_ids, sampling_params)`` concurrently, in one Ray
        call (``asyncrl.rollout.client.coalesced``), streamed: an async generator (a Ray streaming generator,
        ``num_returns="streaming"``) that yields ``[(index, TokenOutput | exception), ...]`` for the requests
        the engine has ended since the last yield, so each result reaches its caller (who then ends its load
        balancer lease) when its request ends, not when the call's last one does. A request's error is
        yielded in its place, not raised. Closing the generator early cancels the requests still running."""
        self._stats["group_calls"] += 1
        tasks = [asyncio.ensure_future(self.generate(*r)) for r in requests]
        index = {t: i for i, t in enumerate(tasks)}
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                yield [(index[t], _outcome(t)) for t in sorted(done, key=index.__getitem__)]
        finally:
            for t in pending:
                t.cancel()

    async def abort_all_requests(self) -> int:
        self._aborted.set()  # requests waiting for a resume end as aborted too
        self._aborted = asyncio.Event()
        return await self.engine.abort_all_requests()

    async def pause(self, mode: Literal["abort", "wait", "keep"] = "abort") -> None:
        self._resumed.clear()
        await self.engine.pause(mode)

    async def resume(self) -> None:
        await self.engine.resume()
        self._resumed.set()

    async def update_weights(self, buckets: list, version: int) -> int:
        """Load ``[(bucket, metas) | ObjectRef of it, ...]`` one bucket at a time."""
        import ray

        t0 = time.perf_counter()
        engine = self.engine
        await engine.begin_weight_update()
        for item in buckets:
            # numpy buckets from the object store are zero-copy, read-only views
            bucket, metas = (await item) if isinstance(item, ray.ObjectRef) else item
            await engine.load_bucket(bucket, metas)
        return self._loaded(await engine.finish_weight_update(version), t0)

    def _loaded(self, n: int, t0: float) -> int:
        self.weights_current = True
        self._stats["weight_updates"] += 1
        self._stats["last_sync_s"] = time.perf_counter() - t0
        return n

    async def init_weight_group(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float) -> list[int]:
        """Join the trainer's gloo weight group (``cpu`` / ``gloo`` checkpoint engine)."""
        return await self.engine.gloo_init(host, port, base_rank, world_size, timeout_s)

    async def receive_weights_broadcast(self, plan: list, version: int) -> int:
        t0 = time.perf_counter()
        return self._loaded(await self.engine.gloo_receive(plan, version), t0)

    async def init_nccl_receiver(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float) -> list[int]:
        """Create the engine's NCCL receivers (``nccl`` checkpoint engine)."""
        return await self.engine.nccl_init(host, port, base_rank, world_size, timeout_s)

    async def receive_weights_nccl(self, version: int) -> int:
        t0 = time.perf_counter()
        return self._loaded(await self.engine.nccl_receive(version), t0)

    async def close_nccl_receiver(self) -> None:
        """Leave the ``nccl`` checkpoint engine's group (called by its shutdown, on every replica at once)."""
        await self.engine.nccl_close()

    async def receive_weights_ipc(self, items: list, version: int) -> int:
        """``cuda_ipc`` checkpoint engine: buckets shared from the trainer rank on this GPU (hf backend)."""
        t0 = time.perf_counter()
        if not hasattr(self.engine, "ipc_receive"):
            raise NotImplementedError(f"checkpoint_engine.backend=cuda_ipc: the {type(self.engine).__name__} cannot "
                                      "receive CUDA-IPC buckets; use actor_rollout_ref.rollout.name=hf")
        return self._loaded(await self.engine.ipc_receive(items, version), t0)

    def device_uuid(self) -> str:
        from asyncrl.sync.cuda_ipc import device_uuid

        return device_uuid()

    def health(self) -> dict:
        """``{"restarted", "weights_current"}``: a restarted replica is out of the sync group until
        it has been given the current weights (asyncrl.trainer.fault_tolerance)."""
        return {"restarted": self.restarted, "weights_current": self.weights_current}

    def num_weight_workers(self) -> int:
        return int(self.engine.num_weight_workers)

    def param_version(self) -> int:
        return int(self.engine.param_version)

    def num_inflight(self) -> int:
        return int(self.engine.num_inflight)

    def stats(self) -> dict[str, Any]:
        return {"backend": self.backend, "replica_rank": self.replica_rank, "param_version": self.param_version(),
                "num_inflight": self.num_inflight(), "restarted": self.restarted, **self._stats}

    def iteration_stats(self) -> dict[str, float]:
        """The engine's iteration sums since the last call (:meth:`asyncrl.rollout.engine_stats.IterationWindow.take`),
        restarting its window; ``{}`` for an engine that keeps none (``rollout.disable_log_stats``)."""
        window = getattr(self.engine, "iteration_window", None)
        return window.take() if window is not None else {}

    async def param_checksums(self) -> dict[str, float]:
        return await self.engine.param_checksums()

    async def param_digests(self) -> dict[str, str]:
        return await self.engine.param_digests()

    async def shutdown(self) -> None:
        await self.engine.shutdown()


class RolloutReplica:
    """Public handle of one rollout replica (Ray ``util/queue.py`` style wrapper).

    Every method has a blocking form and an ``*_async`` form returning an awaitable
    ``ObjectRef`` (use the latter from notebooks / event loops). ``actor`` is the raw handle,
    which is what the rollouter, load balancer and :class:`asyncrl.sync.base.CheckpointEngine`
    implementations talk to (``actor.generate.remote(...)``, ``actor.pause.remote("abort")``).

    Construction returns at once; the engine starts in the actor (~35 s for vLLM on CPU).
    ``actor.ready.remote()`` / :meth:`wait_ready` wait for it, so several replicas start in parallel.

    Args:
        config_or_backend: an :class:`asyncrl.config.ExperimentConfig` (backend and engine
            settings from ``actor_rollout_ref``), or a backend name (``vllm`` | ``hf``).
        engine_kwargs: engine constructor kwargs (``model_path`` first); with a config they
            override the derived ones.
        server_id: name used by the load balancer; default ``replica_{replica_rank}``.
        replica_rank: index among replicas (offsets the engine seed).
        actor_options: extra ``ray.remote`` options. Default ``num_cpus=0``: the vLLM processes
            are not Ray tasks, and reserving CPUs would deadlock scheduling on a 2-core local Ray.
        start: launch the engine start now (non-blocking).

    Raises:
        ValueError / ImportError: see :func:`get_backend_cls` (checked before any actor starts).
    """

    def __init__(self, config_or_backend: Any, engine_kwargs: Optional[dict[str, Any]] = None, *,
                 server_id: Optional[str] = None, replica_rank: int = 0,
                 actor_options: Optional[dict[str, Any]] = None, start: bool = True):
        import ray

        cpu_affinity = frontend = ""
        if isinstance(config_or_backend, str):
            backend, kwargs = config_or_backend, dict(engine_kwargs or {})
        else:
            backend = config_or_backend.actor_rollout_ref.rollout.name
            on_gpu = bool((actor_options or {}).get("num_gpus"))
            kwargs = {**engine_kwargs_from_config(config_or_backend, replica_rank, on_gpu=on_gpu), **(engine_kwargs or {})}
            cpu_affinity = config_or_backend.actor_rollout_ref.rollout.cpu_affinity
        backend_cls = get_backend_cls(backend)  # fail fast in the caller's process
        if not isinstance(config_or_backend, str):
            from asyncrl.cpu_affinity import frontend_cores

            frontend = frontend_cores(config_or_backend, backend_cls)
        if "model_path" in kwargs and os.path.exists(kwargs["model_path"]):
            kwargs["model_path"] = os.path.abspath(kwargs["model_path"])  # the actor's cwd differs
        # A replica that dies is restarted by Ray (rollout.max_restarts); calls in flight fail (no task
        # retries): the client moves them to another replica (asyncrl.rollout.health).
        restarts = 0 if isinstance(config_or_backend, str) else config_or_backend.actor_rollout_ref.rollout.max_restarts
        opts = {"num_cpus": 0, "max_concurrency": 10_000, "max_restarts": restarts, "max_task_retries": 0,
                **(actor_options or {})}
        self.backend = backend
        self.replica_rank = replica_rank
        self.server_id = server_id or f"replica_{replica_rank}"
        self.actor = ray.remote(_ReplicaActor).options(**opts).remote(backend, kwargs, replica_rank, cpu_affinity,
                                                                      frontend)
        self._start_ref = self.actor.start.remote() if start else None

    @classmethod
    def from_config(cls, cfg: Any, replica_rank: int = 0, **kw: Any) -> "RolloutReplica":
        """Same as ``RolloutReplica(cfg, replica_rank=replica_rank, **kw)``."""
        return cls(cfg, replica_rank=replica_rank, **kw)

    def wait_ready(self, timeout: Optional[float] = None) -> "RolloutReplica":
        """Block until the engine is started (re-raises a start failure)."""
        import ray

        ray.get(self.actor.ready.remote(), timeout=timeout)
        return self

    # -- lifecycle
    def ready_async(self) -> Any:
        return self.actor.ready.remote()

    def shutdown(self, kill: bool = True) -> None:
        """Stop the engine processes, then the actor."""
        import ray

        try:
            ray.get(self.actor.shutdown.remote(), timeout=60)
        finally:
            if kill:
                ray.kill(self.actor)

    # -- generation
    def generate_async(self, request_id: str, prompt_ids: Sequence[int], sampling_params: SamplingParams) -> Any:
        return self.actor.generate.remote(request_id, list(prompt_ids), sampling_params)

    def generate(self, request_id: str, prompt_ids: Sequence[int], sampling_params: SamplingParams) -> TokenOutput:
        import ray

        return ray.get(self.generate_async(request_id, prompt_ids, sampling_params))

    def abort_all_requests_async(self) -> Any:
        return self.actor.abort_all_requests.remote()

    def abort_all_requests(self) -> int:
        import ray

        return ray.get(self.abort_all_requests_async())

    def pause_async(self, mode: Literal["abort", "wait", "keep"] = "abort") -> Any:
        return self.actor.pause.remote(mode)

    def pause(self, mode: Literal["abort", "wait", "keep"] = "abort") -> None:
        import ray

        ray.get(self.pause_async(mode))

    def resume_async(self) -> Any:
        return self.actor.resume.remote()

    def resume(self) -> None:
        import ray

        ray.get(self.resume_async())

    # -- weights
    def update_weights_async(self, buckets: list, version: int) -> Any:
        """``buckets``: ``(bucket, metas)`` pairs or ObjectRefs of them (resolved one at a time)."""
        return self.actor.update_weights.remote(buckets, version)

    def update_weights(self, buckets: list, version: int) -> int:
        import ray

        return ray.get(self.update_weights_async(buckets, version))

    # -- introspection
    def param_version(self) -> int:
        import ray

        return ray.get(self.actor.param_version.remote())

    def num_inflight(self) -> int:
        import ray

        return ray.get(self.actor.num_inflight.remote())

    def stats(self) -> dict[str, Any]:
        import ray

        return ray.get(self.actor.stats.remote())

    def stats_async(self) -> Any:
        return self.actor.stats.remote()

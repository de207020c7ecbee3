"""AgentLoopWorker (Ray actor) and AgentLoopManager (the worker pool the Rollouter uses).

::

    FullyAsyncRollouter._process_sample
        -> AgentLoopManager.generate_sequences_single(row, uid, sp, n)   pick the least-busy worker
            -> AgentLoopWorker.generate_sequences_single                 one prompt group per call
                 n x AgentLoop.run() concurrently  (LLMServerClient -> GlobalRequestLoadBalancer -> replica)
                 streaming reward: each finished trajectory is scored right away
            <- list[AgentLoopOutput] (reward_score filled)

Semantics from the verl agent-loop design (seed ``003`` chapter 4, ``generate_sequences_single``):
one sample per worker acquisition, so a slow prompt group never holds a batch hostage. Each worker
loads its own tokenizer (tokenizers never travel) and starts its trajectory proxy lazily.
``num_workers=0`` runs the worker in the calling process (no extra Python process on a laptop).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

import ray

from asyncrl.agent_loop.base import AgentLoopOutput, get_agent_loop_cls
from asyncrl.config import ExperimentConfig
from asyncrl.cpu_affinity import glue_cores, pin_actors
from asyncrl.failures import own_cancellation
from asyncrl.reward.result import score_sample
from asyncrl.rollout.base import SamplingParams
from asyncrl.rollout.client import (FullyAsyncLLMServerClient, GenerationAborted, StaleGeneration, coalesced,
                                    staleness_bounded)
from asyncrl.staleness import sample_budget

logger = logging.getLogger(__name__)


class TrajectoryCancelled(RuntimeError):
    """A callee (not the sample's own task) cancelled a trajectory: the sample fails with this reason."""


class AgentLoopWorker:
    """Runs agent loops for whole prompt groups.

    Args:
        config: experiment config.
        load_balancer: GlobalRequestLoadBalancer (``acquire_server_async`` / ``release_server_async``).
        worker_id: name used in metrics.
    """

    def __init__(self, config: ExperimentConfig, load_balancer: Any, worker_id: str = "worker_0"):
        from asyncrl.models import load_tokenizer
        from asyncrl.reward.custom import scorer

        self.cfg = config
        self.worker_id = worker_id
        self.tokenizer = load_tokenizer(config.actor_rollout_ref.model.tokenizer_path or config.actor_rollout_ref.model.path)
        self.compute_score = scorer(config)  # custom_reward_function (loaded in this process), else by data_source
        self.client = FullyAsyncLLMServerClient(load_balancer, partial_rollout=config.async_training.partial_rollout)
        # trained groups only (generate_sequences_single); None: no early drop
        self.staleness_bound = (sample_budget(config).staleness_bound if config.async_training.drop_stale_in_generation
                                else None)
        self._coalesce = config.actor_rollout_ref.rollout.agent.coalesce_group_requests
        self.active_samples = 0
        self.active_trajectories = 0
        self.done_samples = 0
        self.cancelled_trajectories = 0  # siblings of a failed trajectory, cancelled with its group
        self._proxy = None
        self._proxy_lock = asyncio.Lock()

    async def get_proxy(self) -> Any:
        """The worker's trajectory proxy, started on first use (127.0.0.1, random port)."""
        async with self._proxy_lock:
            if self._proxy is None:
                from asyncrl.agent_loop.proxy import TrajectoryProxy
                from asyncrl.config import resolved_max_model_len  # null: the context the engines were given

                self._proxy = TrajectoryProxy(self.client, self.tokenizer, max_model_len=resolved_max_model_len(self.cfg))
                await self._proxy.start()
            return self._proxy

    async def generate_sequences_single(self, row: dict, uid: str, sampling_params: SamplingParams | list[SamplingParams],
                                        n: int, prompt_ids: Optional[list[int]] = None,
                                        trained: bool = True) -> list[AgentLoopOutput]:
        """Run ``n`` trajectories of one dataset row concurrently and score each as it finishes.

        ``sampling_params`` is shared, or one per trajectory (e.g. the synthetic length workload).
        ``trained``: the group is for the trainer, which drops it once it is older than the staleness bound, so
        a resumed partial rollout already that old ends it (:func:`asyncrl.rollout.client.staleness_bounded`);
        ``False`` (evaluation): no bound.

        Raises:
            GenerationAborted: a request was aborted with ``partial_rollout`` off (sample dropped); its
                subclass ``StaleGeneration``: a request outlived the staleness bound (sample dropped).
            Exception: whatever an agent loop raised (the rollouter records it as failed).
        """
        name = row.get("agent_name") or self.cfg.actor_rollout_ref.rollout.agent.default_agent_loop
        loop = get_agent_loop_cls(name)(self.client, self.tokenizer, self.cfg, worker=self)
        self.active_samples += 1
        try:
            extra = {"prompt_ids": prompt_ids} if prompt_ids is not None else {}
            sps = list(sampling_params) if isinstance(sampling_params, (list, tuple)) else [sampling_params] * n
            # the tasks copy the bound; a trained group's requests carry its oldest version as their priority
            with staleness_bounded(self.staleness_bound if trained else None, track=trained):
                return await self._group([self._one(loop, sps[k], f"{uid}-{k}", row, extra, uid) for k in range(n)])
        finally:
            self.active_samples -= 1
            self.done_samples += 1

    async def _group(self, coros: list) -> list[AgentLoopOutput]:
        """Run one prompt group's trajectories; the first failure cancels the siblings still running.

        A group is trained whole (GRPO normalises within it), so once one trajectory fails the others
        are wasted work. The exception raised is the first failure, with ``trajectories``:
        ``{"failed", "cancelled", "completed"}`` counts, so the rollouter records what became of each.
        """
        tasks = [asyncio.ensure_future(c) for c in coros]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:  # this group is being cancelled: take the trajectories along
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
        if not failed:
            return [t.result() for t in tasks]
        running = [t for t in tasks if not t.done()]
        for t in running:
            t.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        self.cancelled_trajectories += len(running)
        exc = failed[0].exception()
        try:
            exc.trajectories = {"failed": len(failed), "cancelled": len(running),  # type: ignore[union-attr]
                                "completed": len(tasks) - len(failed) - len(running)}
        except AttributeError:  # an exception type that takes no attributes
            pass
        raise exc

    async def _one(self, loop: Any, sp: SamplingParams, request_id: str, row: dict, extra: dict,
                   group: Optional[str] = None) -> AgentLoopOutput:
        self.active_trajectories += 1
        try:
            t0 = time.perf_counter()
            try:  # a group's requests share one Ray call per event-loop turn (agent.coalesce_group_requests)
                with coalesced(group if self._coalesce and getattr(loop, "coalesce_requests", False) else None):
                    out = await loop.run(sp, request_id=request_id, **extra, **row)
            except asyncio.CancelledError:
                if own_cancellation():
                    raise
                raise TrajectoryCancelled(f"trajectory {request_id}: a callee raised CancelledError "
                                          "(e.g. its engine request was cancelled)") from None
            if not out.has_version:  # no token the engine produced: the version its replica serves now
                out.set_version_span(fallback=await self.client.engine_version(request_id))
            if out.reward_score is None:
                text = self.tokenizer.decode(out.response_ids, skip_special_tokens=True)
                result = score_sample(self.compute_score, row.get("data_source", ""), text,
                                      row["reward_model"]["ground_truth"], row.get("extra_info"),
                                      where=f"sample {request_id}")  # RewardError: no finite score
                if result.extras:  # verl's dict reward: "score" trains, numeric extras are metrics, all are kept
                    out.metrics.update(result.metrics)
                    out.extra_fields["reward_extra_info"] = result.extras
                out.reward_score = result.score
            out.metrics["agent/total_s"] = time.perf_counter() - t0
            return out
        finally:
            self.active_trajectories -= 1

    def stats(self) -> dict:
        """``{"worker_id", "active_samples", "active_trajectories", "done_samples", "cancelled_trajectories",
        "replica_faults", "sandboxes"?}`` for the funnel.

        ``sandboxes`` (``{"active", "limit", "waiting", "started"}``) appears once a sandboxed loop ran here.
        """
        out = {"worker_id": self.worker_id, "active_samples": self.active_samples,
               "active_trajectories": self.active_trajectories, "done_samples": self.done_samples,
               "cancelled_trajectories": self.cancelled_trajectories,
               "replica_faults": self.client.replica_faults_total}
        import sys

        if "asyncrl.agent_loop.sandbox.loop" in sys.modules:  # never import the sandbox just to report
            out["sandboxes"] = sys.modules["asyncrl.agent_loop.sandbox.loop"].sandbox_stats()
        return out

    async def shutdown(self) -> None:
        if self._proxy is not None:
            await self._proxy.stop()
            self._proxy = None


class AgentLoopManager:
    """Pool of :class:`AgentLoopWorker` (``actor_rollout_ref.rollout.agent.num_workers``).

    Each call takes one worker (fewest active samples, ties to the lowest index) for one prompt
    group. With ``num_workers=0`` a single in-process worker is used.
    """

    def __init__(self, config: ExperimentConfig, load_balancer: Any):
        n = config.actor_rollout_ref.rollout.agent.num_workers
        self.local = n == 0
        if self.local:
            self.workers = [AgentLoopWorker(config, load_balancer, "worker_local")]
        else:
            cls = ray.remote(AgentLoopWorker).options(num_cpus=0, max_concurrency=100000)
            self.workers = [cls.remote(config, load_balancer, f"worker_{i}") for i in range(n)]
            pin_actors(self.workers, glue_cores(config))  # with the rollouter (the glue)
        self.active = [0] * len(self.workers)

    async def generate_sequences_single(self, row: dict, uid: str, sampling_params: SamplingParams | list[SamplingParams],
                                        n: int, prompt_ids: Optional[list[int]] = None,
                                        trained: bool = True) -> list[AgentLoopOutput]:
        i = min(range(len(self.workers)), key=lambda k: self.active[k])
        self.active[i] += 1
        try:
            if self.local:
                return await self.workers[i].generate_sequences_single(row, uid, sampling_params, n, prompt_ids, trained)
            ref = self.workers[i].generate_sequences_single.remote(row, uid, sampling_params, n, prompt_ids, trained)
            try:
                return await ref
            except asyncio.CancelledError:
                ray.cancel(ref)  # stop the worker's loops too, not just our wait
                raise
            except ray.exceptions.RayTaskError as exc:
                cause = exc.as_instanceof_cause()
                if isinstance(cause, GenerationAborted):  # the subclass kept: the rollouter's reason depends on it
                    raise (StaleGeneration if isinstance(cause, StaleGeneration) else GenerationAborted)(str(cause)) from None
                raise
        finally:
            self.active[i] -= 1

    async def stats(self) -> list[dict]:
        if not self.workers:
            return []
        if self.local:
            return [self.workers[0].stats()]
        return list(await asyncio.gather(*[w.stats.remote() for w in self.workers]))

    async def funnel_view(self) -> dict:
        """The pool as funnel layers: ``agent_workers`` (each worker's :meth:`AgentLoopWorker.stats`),
        ``agent_loop_workers`` (busy / total; only for a pool of actors: an in-process worker has no
        limit to bind on) and, when used, ``sandboxes`` (active / limit / waiting, summed)."""
        workers = await self.stats()
        out: dict = {"agent_workers": workers}
        if not self.local:
            out["agent_loop_workers"] = {"busy": sum(1 for w in workers if w["active_samples"]), "total": len(workers),
                                         "active_samples": sum(w["active_samples"] for w in workers)}
        boxes = [w["sandboxes"] for w in workers if "sandboxes" in w]
        if boxes:
            out["sandboxes"] = {"active": sum(b["active"] for b in boxes), "limit": sum(b["limit"] for b in boxes),
                                "waiting": sum(b.get("waiting", 0) for b in boxes)}
        return out

    async def shutdown(self) -> None:
        """Stop every worker's proxy and kill the worker actors. Idempotent."""
        workers, self.workers, self.active = self.workers, [], []
        if self.local:
            for w in workers:
                await w.shutdown()
            return
        for w in workers:
            try:
                await w.shutdown.remote()
            except Exception:  # pragma: no cover - already dead
                pass
            ray.kill(w)

"""FullyAsyncRollouter: streams prompt groups from the dataloader to the MessageQueue.

::

    feed_loop      dataset rows --put--> pending_queue (bound = max_concurrent_samples: the most that can start)
                                            | waits while full
    processor_loop pending_queue --get--> [wait: not paused, active < max_concurrent_samples,
                                            staleness_samples < max_required_samples,
                                            admission not closed (the trainer's last batch fetched)]
                                       --spawn--> active_tasks
    process_sample n x agent loop (generate via FullyAsyncLLMServerClient) -> reward
                   --put_payload--> MessageQueue.put_sample  (waits while the queue is full)

    trainer sync:  pause_for_sync()   partial_rollout: replicas pause(partial_rollout_mode: abort -> clients
                                      wait + resubmit; keep -> requests frozen with their KV cache)
                                      else: stop admitting, wait for active_tasks to drain
                   [weights are sent to the replicas]
                   resume_after_sync(v)  version = v, replicas resume, reset_staleness(), wake loops

Semantics and names from the verl fully-async design (seed ``003`` chapter 6): ``staleness_samples``
counts samples started since the last sync plus those still outstanding; ``reset_staleness()`` sets
it to ``len(active_tasks) + len(MessageQueue)`` after each sync. Every prompt taken from the
dataloader is accounted for: enqueued (later trained or dropped by the trainer), dropped with a
reason, or failed with a reason (invariant 1), per sample by its ``seq`` in a ledger; the data order
is a function of ``(trainer.seed, epoch)``, its position is checkpointed (``CheckpointedRollouter``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from typing import Any, Callable, Optional

import ray

from asyncrl.agent_loop.worker import AgentLoopManager
from asyncrl.checkpoint.trainer_state import CheckpointedRollouter
from asyncrl.config import ExperimentConfig
from asyncrl.data.length_workload import LengthWorkload
from asyncrl.failures import FailureLog, own_cancellation, short_message
from asyncrl.message_queue import QueueShutdown
from asyncrl.rollout.base import SamplingParams
from asyncrl.rollout.client import GenerationAborted, StaleGeneration
from asyncrl.rollout.health import ReplicaHealthMixin, call_live
from asyncrl.rollouter_status import RolloutStatusMixin
from asyncrl.sample import RolloutSample
from asyncrl.staleness import sample_budget

logger = logging.getLogger(__name__)


def _group(exc: BaseException) -> dict:
    """What became of a failed prompt group's trajectories (see ``AgentLoopWorker``), if known."""
    group = getattr(getattr(exc, "cause", None) or exc, "trajectories", None)
    return {"trajectories": dict(group)} if isinstance(group, dict) else {}


class FullyAsyncRollouter(RolloutStatusMixin, ReplicaHealthMixin, CheckpointedRollouter):
    """Ray actor body (made remote by :class:`~asyncrl.experiment.Experiment` with ``num_cpus=0``).

    Args:
        config: the experiment config.
        train_rows: dataset rows in the verl schema.
        val_rows: held-out rows for greedy evaluation.
        replicas: ``{server_id: RolloutReplica actor handle}``.
        load_balancer: GlobalRequestLoadBalancer wrapper (acquire/release).
        message_queue: :class:`~asyncrl.message_queue.MessageQueue`.
        resume: a checkpoint's state (``rollouter_resume``); its samples in flight are counted as
            dropped (``in_flight_at_checkpoint``).
    """

    def __init__(self, config: ExperimentConfig, train_rows: list[dict], val_rows: list[dict],
                 replicas: dict, load_balancer: Any, message_queue: Any, resume: Optional[dict] = None):
        from asyncrl.models import load_tokenizer  # tokenizers are loaded per actor, never shipped

        self.cfg = config
        self.budget = sample_budget(config)
        self.train_rows, self.val_rows = train_rows, val_rows
        self.replicas = replicas
        self.mq = message_queue
        self.tokenizer = load_tokenizer(config.actor_rollout_ref.model.tokenizer_path or config.actor_rollout_ref.model.path)
        self.lb = load_balancer
        self.agent_loops = AgentLoopManager(config, load_balancer)
        self.param_version = 0
        # read ahead no more than can start at once: a staleness budget of 1e9 (no bound) sized this queue at 32e9 rows,
        # and the feed loop, cycling epochs to fill it, grew without limit (s35 newcomer #1)
        self.pending_queue: asyncio.Queue = asyncio.Queue(maxsize=self.budget.read_ahead)
        self.active_tasks: set[asyncio.Task] = set()
        self.staleness_samples = 0
        self.paused = False
        self.stopping = False
        self.halted = ""  # why rollout stopped early (a failure storm, no prompt that fits), else ""
        # rows dropped as prompt_too_long (a row renders the same every epoch); checkpointed keyed by their prompts
        self.too_long: set[int] = set()
        self.admission_closed = False  # the trainer holds its last step's batch: start no new prompt group
        self.cond = asyncio.Condition()
        self.counts = collections.Counter()  # taken, enqueued
        self.dropped: collections.Counter = collections.Counter()
        self.failed: collections.Counter = collections.Counter()  # by exception type
        self.failures = FailureLog()  # the last failures' messages with their sample uid
        self.eval_history: list[dict] = []
        self._eval_task: Optional[asyncio.Task] = None
        self._loops: list[asyncio.Task] = []
        # a prompt group's uid (its requests' ids start with it); the simulator sets a seeded one so that a simulation,
        # whose response lengths are drawn per request id, repeats exactly
        self.new_uid: Callable[[], str] = lambda: uuid.uuid4().hex[:12]
        self.t_start = time.time()
        self.idle_s = 0.0  # time with no prompt group in generation (the replicas had nothing to do)
        self._idle_since: Optional[float] = time.time()
        self.recent: collections.deque = collections.deque(maxlen=512)  # per-sample summaries for widgets
        self.partial_spans: collections.deque = collections.deque(maxlen=512)
        self.recent_trajectories: collections.deque = collections.deque(maxlen=32)  # for the mask inspector
        self._init_ledger(len(train_rows), resume)  # ledger, data sampler; a checkpoint's state restored
        eos = self.tokenizer.eos_token_id
        ro = config.actor_rollout_ref.rollout
        self.sp = SamplingParams(max_tokens=ro.response_length, temperature=ro.temperature, top_p=ro.top_p,
                                 top_k=ro.top_k, min_p=ro.min_p, logprobs=True, stop_token_ids=[eos] if eos is not None else [])
        self.greedy_sp = SamplingParams(max_tokens=ro.response_length, temperature=0.0, logprobs=False,
                                        stop_token_ids=self.sp.stop_token_ids)
        self.length_workload = LengthWorkload(config.data.length_workload, ro.response_length, config.trainer.seed)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the feed and processor loops (returns at once). With ``hybrid_engine`` only the feed
        loop runs: the trainer asks for each batch with :meth:`generate_batch`."""
        await self._engine_windows()  # the first step's engine window opens now, not at the engine's start-up
        self._loops = [asyncio.create_task(self._feed_loop())]
        if not self.cfg.actor_rollout_ref.hybrid_engine:
            self._loops.append(asyncio.create_task(self._processor_loop()))
        if self.monitor is not None:  # restarted replicas rejoin (asyncrl.rollout.health)
            self.monitor.start()

    async def generate_batch(self, k: int) -> dict:
        """Colocated mode: generate ``k`` prompt groups now and return once they are enqueued
        (:func:`asyncrl.hybrid_engine.generate_batch`)."""
        from asyncrl.hybrid_engine import generate_batch

        return await generate_batch(self, k)

    async def stop(self) -> dict:
        """Stop admitting work, abort generation, and account every unfinished prompt as dropped."""
        self.stopping = True
        if self.monitor is not None:
            await self.monitor.stop()
        async with self.cond:
            self.cond.notify_all()
        for t in self._loops:
            t.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        active = list(self.active_tasks)
        for t in active:
            t.cancel()
        await asyncio.gather(*active, return_exceptions=True)
        while not self.pending_queue.empty():
            self._drop("unstarted_at_shutdown", self.pending_queue.get_nowait()[0])
        return self.accounting()

    async def shutdown(self) -> None:
        """Release the agent-loop workers (and their proxies). Call after :meth:`stop` and the final eval."""
        await self.agent_loops.shutdown()

    # ------------------------------------------------------------------ loops
    async def _feed_loop(self) -> None:
        while not self.stopping:  # taken / position change together, after the put (no await between)
            await self.pending_queue.put((self.counts["taken"], self.sampler.peek(), time.time()))
            self.sampler.advance()
            self.counts["taken"] += 1

    async def _halt_on_failure_storm(self) -> None:
        """``rollout.max_consecutive_failures`` groups failed in a row: start no more, and shut the queue down
        with the reason (the trainer stops the run with it) instead of failing new prompts forever."""
        reason = self.failures.storm_message(self.cfg.actor_rollout_ref.rollout.max_consecutive_failures)
        if reason is not None:
            await self._halt(reason)

    async def _halt(self, reason: str) -> None:
        """Start no more prompt groups and shut the queue down with ``reason``: the trainer stops the run with it
        (:class:`asyncrl.failures.RolloutStopped`) instead of waiting for samples that will never come."""
        if not self.halted:
            self.halted = reason
            logger.error("rollout stopped: %s", reason)
            await self.mq.shutdown_async(f"rollout stopped: {reason}")

    async def _drop_too_long(self, seq: int, index: int) -> None:
        """Drop a prompt longer than ``data.max_prompt_length``; once every row of the dataset has been, none can
        ever start (the pre-flight :func:`asyncrl.watchdog.check_can_fill_batch` refuses such data, but a rollouter
        started without it took and dropped the same rows epoch after epoch, forever): halt with the reason."""
        self._drop("prompt_too_long", seq)
        await self.release_budget()
        self.too_long.add(index)
        if len(self.too_long) == len(self.train_rows):
            await self._halt(f"all {len(self.train_rows)} training prompts are longer than data.max_prompt_length="
                             f"{self.cfg.data.max_prompt_length} tokens, so no prompt group can start; raise "
                             "data.max_prompt_length or shorten the prompts")

    def _can_start(self) -> bool:
        return (not self.paused and not self.halted and not self.admission_closed and len(self.active_tasks) < self.budget.max_concurrent_samples
                and self.staleness_samples < self.budget.max_required_samples)

    async def _processor_loop(self) -> None:
        held = None  # a row taken off pending_queue but not yet started
        try:
            while not self.stopping:
                held = await self.pending_queue.get()
                async with self.cond:
                    await self.cond.wait_for(lambda: self.stopping or self._can_start())
                    if self.stopping:
                        break
                    self.staleness_samples += 1
                self._launch(*held)
                held = None
        finally:
            if held is not None:
                self._drop("unstarted_at_shutdown", held[0])

    def _launch(self, seq: int, index: int, taken_at: float) -> asyncio.Task:
        """Start one prompt group (a ``pending_queue`` item; its staleness slot already taken) at the
        current version."""
        if self._idle_since is not None:
            self.idle_s += time.time() - self._idle_since
            self._idle_since = None
        task = asyncio.create_task(self._process_sample(seq, index, taken_at, self.param_version))
        self.active_tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self.active_tasks.discard(task)
        if not self.active_tasks and self._idle_since is None:
            self._idle_since = time.time()
        asyncio.ensure_future(self._notify())

    async def _notify(self) -> None:
        async with self.cond:
            self.cond.notify_all()

    async def close_admission(self) -> None:
        """The trainer has fetched the batch of its last step (``trainer.total_training_steps``): no sample
        started from now on could be trained, so start no new prompt group, also after the syncs that
        follow (which reset ``staleness_samples``). Groups already started finish or are aborted at
        :meth:`stop`; prompts waiting in ``pending_queue`` are dropped ``unstarted_at_shutdown``."""
        async with self.cond:
            self.admission_closed = True

    async def release_budget(self) -> None:
        """A started sample will never reach the trainer: give its staleness slot back."""
        async with self.cond:
            self.staleness_samples = max(0, self.staleness_samples - 1)
            self.cond.notify_all()

    # ------------------------------------------------------------------ one prompt group
    async def _process_sample(self, seq: int, index: int, taken_at: float, version: int) -> None:
        row = self.train_rows[index]
        uid = self.new_uid()
        started = self.started_at[seq] = time.time()
        putting = False
        try:
            from asyncrl.agent_loop.single_turn import render_prompt_ids
            prompt_ids = render_prompt_ids(self.tokenizer, list(row["prompt"]), row.get("tools"))
            if len(prompt_ids) > self.cfg.data.max_prompt_length:
                await self._drop_too_long(seq, index)
                return
            n = self.cfg.actor_rollout_ref.rollout.n
            sp = self.length_workload.sampling_params(self.sp, index, n) if self.length_workload.enabled else self.sp
            outs = await self.agent_loops.generate_sequences_single(row, uid, sp, n, prompt_ids)
            gt = row["reward_model"]["ground_truth"]
            finished = time.time()
            sample = RolloutSample(uid=uid, seq=seq, index=index, data_source=row.get("data_source", ""), ground_truth=gt,
                                   outputs=list(outs), start_version=version,
                                   timings={"taken": taken_at, "started": started, "finished": finished})
            sample.metrics = {"rollouter/processing_s": finished - started,
                              "rollouter/num_aborts": sum(o.metrics.get("agent/num_aborts", 0) for o in outs)}
            if sample.is_partial:
                self.partial_spans.append((sample.min_global_steps, sample.max_global_steps))
            sample.timings["enqueued"] = time.time()
            putting = True  # from here the queue accounts for it: queued (trained / unconsumed) or queue_shutdown
            self.failures.success()
            await self.mq.put_payload_async(sample)
            self.counts["enqueued"] += 1
            self.ledger.record("enqueued", seq)
            self.recent_trajectories.append(sample)  # decoded for the inspector when asked, not per sample
            self.recent.append({"uid": uid, "reward_mean": sum(sample.rewards) / len(outs),
                                "min_v": sample.min_global_steps, "max_v": sample.max_global_steps,
                                "processing_s": finished - started})
        except asyncio.CancelledError as exc:
            if self.stopping or own_cancellation():  # stop() cancelled this task: a shutdown
                if putting:  # cancelled while waiting on a full queue: the queue's own put completes and counts it
                    self.counts["enqueued"] += 1
                    self.ledger.record("enqueued", seq)
                else:
                    self._drop("aborted_at_shutdown", seq)
                raise
            # a callee's cancellation (an engine request, a Ray task): this sample failed, the run goes on
            key = self.failures.record(exc, uid, index=index, reason="cancelled by a callee")
            self._log_failure(key, uid, index, "a callee raised CancelledError", stack=False)
            self._fail(key, seq)
            await self.release_budget()
        except StaleGeneration:  # it outlived the staleness bound in generation: the trainer would drop it
            self._drop("stale_in_generation", seq)
            await self.release_budget()
        except GenerationAborted:
            self._drop("aborted_no_partial_rollout", seq)
            await self.release_budget()
        except Exception as exc:  # reported and accounted, never silently lost
            cause = exc.as_instanceof_cause() if isinstance(exc, ray.exceptions.RayTaskError) else exc
            if isinstance(cause, QueueShutdown):  # from the queue actor, or raised in process (an in-process queue)
                self._drop("queue_shutdown", seq, count=False)  # the MessageQueue counted it
                return
            key = self.failures.record(exc, uid, index=index, **_group(exc))
            self._log_failure(key, uid, index, f"{key}: {short_message(exc)}")
            self._fail(key, seq)
            await self.release_budget()
            await self._halt_on_failure_storm()
        finally:
            self.started_at.pop(seq, None)

    def _log_failure(self, key: str, uid: str, index: int, message: str, stack: bool = True) -> None:
        """Log a failed sample without one line per sample (a broken reward fails every one): the first of its kind
        in full (its traceback, from the ``except`` block that calls this), then a count at the 10th, 100th ... of
        that kind; the others at DEBUG. Every one is counted all the same (``failed`` by kind, the ledger)."""
        n = self.failures.counts[key]
        if n == 1:
            (logger.exception if stack else logger.error)(
                "sample %s (row %d) failed: %s (the first %s; later ones are counted, not logged one by one)",
                uid, index, message, key)
        elif self.failures.first_of_kind(key):
            logger.error("%d samples failed with %s so far (the latest: sample %s, row %d: %s); the first one's "
                         "traceback is logged above", n, key, uid, index, message)
        else:
            logger.debug("sample %s (row %d) failed: %s", uid, index, message)

    # ------------------------------------------------------------------ sync protocol
    async def pause_for_sync(self) -> dict:
        """Called by the ParameterSynchronizer before weights move. Returns timings (s)."""
        t0 = time.time()
        async with self.cond:
            self.paused = True
        if self._eval_task is not None:
            await asyncio.gather(self._eval_task, return_exceptions=True)
        t_eval = time.time()
        if self.cfg.async_training.partial_rollout:  # abort (resubmitted later) or keep (frozen in place)
            await call_live(await self.live_replicas(), "pause", self.cfg.async_training.partial_rollout_mode,
                            pool=self.lb)
        else:
            while self.active_tasks:
                await asyncio.wait(set(self.active_tasks))
        return {"sync/wait_eval_s": t_eval - t0, "sync/pause_s": time.time() - t_eval}

    async def resume_after_sync(self, version: int) -> dict:
        """Adopt ``version``, resume replicas, :meth:`reset_staleness`, maybe start an evaluation."""
        t0 = time.time()
        self.param_version = version
        if self.cfg.async_training.partial_rollout:
            await call_live(await self.live_replicas(), "resume", pool=self.lb)
        await self.reset_staleness()
        if self.cfg.trainer.test_freq > 0 and version % self.cfg.trainer.test_freq == 0:
            self.start_evaluation()
        return {"sync/resume_s": time.time() - t0}

    async def reset_staleness(self) -> int:
        """``staleness_samples = len(active_tasks) + len(MessageQueue)``; unpauses the processor."""
        qsize = await self.mq.size_async()
        async with self.cond:
            self.staleness_samples = len(self.active_tasks) + qsize
            self.paused = False
            self.cond.notify_all()
        return self.staleness_samples

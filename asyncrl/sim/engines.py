"""Cost-model engines: the inference engine of a simulation (the trainer's side: :mod:`asyncrl.sim.train_engines`).

::

    RolloutReplica actor body ──generate / pause / resume / update_weights──► CostModelInferenceEngine
        requests -> waiting (beyond max_num_seqs) -> running; all running sequences advance one token
        per decode iteration; the clock jumps from event to event (arrival, finish, pause, abort,
        resume, weight load), each interval priced in closed form by the RolloutCostModel
    FullyAsyncTrainer ──to_thread(update)──► CostModelTrainEngine (train_engines.py): charge(update_time)
    ParameterSynchronizer ──send_weights──► CostModelCheckpointEngine (train_engines.py): sleep -> replicas load

They implement the same protocols as the real engines (:mod:`asyncrl.api`: ``InferenceEngine``,
``TrainEngine``, ``CheckpointEngine``), so the
real replica actor body, trainer and synchronizer drive them unchanged. They are the simulator's
product (cost models), not test fakes.

Token units: a simulated token stands for ``token_scale`` real tokens (so a 28K-token response is a
short list); costs are computed in real tokens.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional, Sequence

from asyncrl.rollout.base import SamplingParams, TokenOutput, check_scheduling_policy, request_priority
from asyncrl.rollout.engine_stats import IterationWindow
from asyncrl.sim.cost_models import RolloutCostModel
from asyncrl.sim.host import HostLoad

logger = logging.getLogger(__name__)

FILLER_TOKEN = 32
"""Id of every simulated token (a space in the embedded byte tokenizer; any id in the vocab works)."""


@dataclass
class _Request:
    rid: str
    ctx0: float  # real context tokens when it started running (prompt + earlier partial tokens)
    need: float  # real decode iterations to finish this call
    fut: asyncio.Future
    g0: float = 0.0  # global iteration count when it started running
    seq: int = 0
    slot: int = 0  # KV-cache slot (lowest free first, as the hf engine hands them out)
    logprobs: bool = True
    stop: str = "length"  # stop reason when it runs to the end ("completed" = natural EOS)
    priority: int = 0  # scheduling_policy="priority": the lowest waiting one is seated first (ties: seq)


@dataclass
class Timeline:
    """Busy intervals for the timeline picture: ``(lane, start_s, end_s, label)``, and the replicas'
    prefill work in real tokens: ``prefill_tokens`` (every prefill) and ``repeated_prefill_tokens`` (the
    prefills of requests resumed after an abort: prompt + tokens so far, whose KV was computed before)."""

    spans: list = field(default_factory=list)
    prefill_tokens: int = 0
    repeated_prefill_tokens: int = 0

    def add(self, lane: str, start: float, end: float, label: str) -> None:
        if end > start:
            self.spans.append((lane, start, end, label))


class CostModelInferenceEngine:
    """An inference replica priced by a :class:`RolloutCostModel` (backend name ``sim``; implements
    :class:`asyncrl.api.InferenceEngine`).

    Args:
        cost: the replica's cost model.
        token_scale: real tokens per simulated token.
        prompt_tokens: real prompt length charged for prefill (the simulated prompt ids are short).
        natural_length: ``fn(request_id, prompt_ids) -> real tokens`` for requests that stop at EOS
            (``prompt_ids``: the request's original prompt); ``None`` generates ``max_tokens`` (the
            synthetic length workload sets ``ignore_eos``).
        timeline: optional :class:`Timeline` receiving this replica's busy spans.
        name: lane name in the timeline.
        iteration_stats: report :attr:`iteration_window` (``rollout/engine_*``; ``not rollout.disable_log_stats``).
        host: the :class:`HostLoad` of the trainer beside it: ``cost.contention`` applies while the trainer
            computes; ``None``: to every decode iteration (a replica priced alone).
    """

    def __init__(self, cost: RolloutCostModel, token_scale: int = 1, prompt_tokens: int = 64,
                 natural_length: Optional[Callable[[str, Sequence[int]], int]] = None, timeline: Optional[Timeline] = None,
                 name: str = "replica", iteration_stats: bool = True, scheduling_policy: str = "fcfs",
                 host: Optional[HostLoad] = None, **_: Any):
        self.cost, self.scale, self.prompt_tokens = cost, max(1, int(token_scale)), prompt_tokens
        self.host = host
        if host is not None:
            host.engines.append(self)
        self.scheduling_policy = check_scheduling_policy(scheduling_policy)
        self.natural_length, self.timeline, self.name = natural_length, timeline, name
        self.param_version = 0
        self.running: dict[str, _Request] = {}
        self.waiting: list[_Request] = []
        self._finish_heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        self._g = 0.0  # decode iterations done so far (shared by all running sequences)
        self._ctx = 0.0  # summed context of the running sequences at the last advance
        self._t = 0.0  # loop time of the last advance
        self._busy_until = 0.0  # prefill / weight load in progress until then
        self._frozen = False  # pause("keep")
        self._admit = True  # new requests may start
        self._timer: Optional[asyncio.TimerHandle] = None
        self._first_prompt: dict[str, int] = {}
        self._prefilled: set[str] = set()  # requests that ran (their KV was computed) and may resume
        self._free_slots = list(range(max(1, int(cost.max_num_seqs))))  # a heap: lowest slot first
        self._switches: list[tuple[float, int]] = [(float("-inf"), 0)]  # (decode iteration, version from then on)
        self._drained: Optional[asyncio.Event] = None
        self.generated_tokens = 0
        # as the real engines' (asyncrl.rollout.engine_stats), in virtual s; None: not reported (disable_log_stats)
        self._window = IterationWindow()
        self.iteration_window: Optional[IterationWindow] = self._window if iteration_stats else None

    # ------------------------------------------------------------------ clock
    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def _advance(self) -> None:
        """Bring the decode progress up to now."""
        now = self._loop.time()
        start = max(self._t, self._busy_until)
        if self.running and not self._frozen and now > start:
            b = len(self.running)
            dg = self._iterations(start, now)
            self._g += dg
            self._ctx += b * dg
            self._window.add(now - start, dg, b * dg)
            if self.timeline is not None:
                self.timeline.add(self.name, start, now, "decode")
        self._t = now

    def _shape(self) -> tuple[int, float]:
        """``(rows, context)`` a decode iteration is priced at (:meth:`RolloutCostModel.decode_time`): the
        running sequences and their summed context; with ``static_slots`` (the hf engine) the rows up to
        the power-of-two bucket above the highest occupied slot (``compact_slots``: above the number of running
        requests, which the engine has moved to the lowest slots), each attending over the longest running
        context (``rows x longest``, which grows by ``rows`` per iteration: the same closed form)."""
        if not self.cost.static_slots or not self.running:
            return len(self.running), self._ctx
        reqs = self.running.values()
        top = len(reqs) - 1 if self.cost.compact_slots else max(r.slot for r in reqs)
        rows = min(self.cost.max_num_seqs, 1 << top.bit_length())
        return rows, rows * (max(r.ctx0 - r.g0 for r in reqs) + self._g)

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._finish_heap and self._finish_heap[0][2] not in self.running:
            heapq.heappop(self._finish_heap)
        if not self._finish_heap or self._frozen:
            return
        target = self._finish_heap[0][0]
        now = self._loop.time()
        at = self._done_at(max(now, self._busy_until), max(0.0, target - self._g))
        self._timer = self._loop.call_at(at, self._on_timer, target)

    def _iterations(self, t0: float, t1: float) -> float:
        """Decode iterations of the running batch from ``t0`` to ``t1``."""
        if self.host is None or not self.cost.contention:
            return self.cost.decode_iterations(t1 - t0, *self._shape())
        alone = self.host.free_seconds(t0, t1, self.cost.contention)
        return self.cost.decode_iterations(alone * (1.0 + self.cost.contention), *self._shape())

    def _done_at(self, t0: float, iterations: float) -> float:
        """When ``iterations`` decode iterations of the running batch, begun at ``t0``, are done."""
        if self.host is None or not self.cost.contention:
            return t0 + self.cost.decode_time(iterations, *self._shape())
        alone = self.cost.decode_time(iterations, *self._shape()) / (1.0 + self.cost.contention)
        return self.host.after(t0, alone, self.cost.contention)

    def _load_changed(self) -> None:
        """The trainer beside it starts computing (:class:`HostLoad`): progress so far at the old pace, the next
        finish repriced."""
        if self.running and not self._frozen:
            self._advance()
            self._reschedule()

    def _on_timer(self, target: float) -> None:
        """The first running request is due: its iterations are done, whatever :meth:`_advance` computed (an
        interval too small for the clock to move, e.g. microseconds at t = 1e6 s, advances nothing, and the
        request would be rescheduled at the same instant forever). The timer is cancelled on every change."""
        self._timer = None
        self._advance()
        if self._g < target:
            self._ctx += len(self.running) * (target - self._g)
            self._g = target
        eps = 1e-6 * max(1.0, self._g)
        while self._finish_heap and self._finish_heap[0][0] <= self._g + eps:
            _, _, rid = heapq.heappop(self._finish_heap)
            req = self.running.get(rid)
            if req is not None:
                self._g = max(self._g, req.g0 + req.need)
                self._finish(req, "length_or_eos")
        self._admit_waiting()
        self._reschedule()

    # ------------------------------------------------------------------ requests
    def _tokens_of(self, req: _Request) -> int:
        return int((min(self._g - req.g0, req.need) + 1e-9) // self.scale)

    def _finish(self, req: _Request, how: str) -> None:
        del self.running[req.rid]
        heapq.heappush(self._free_slots, req.slot)
        self._ctx -= req.ctx0 + min(self._g - req.g0, req.need)
        n = self._tokens_of(req) if how == "aborted" else int(round(req.need / self.scale))
        self.generated_tokens += n
        self._window.generated_tokens += n  # counted when the request ends (aborted: what it made)
        if how != "aborted":
            self._first_prompt.pop(req.rid, None)
            self._prefilled.discard(req.rid)
        if not req.fut.done():
            stop = "aborted" if how == "aborted" else req.stop
            req.fut.set_result(TokenOutput(token_ids=[FILLER_TOKEN] * n, log_probs=[0.0] * n if req.logprobs else None,
                                           stop_reason=stop, response_versions=self._versions(req, n)))
        if not self.running and self._drained is not None:
            self._drained.set()

    def _versions(self, req: _Request, n: int) -> list[int]:
        """The weight version of each of ``n`` tokens: the one in force at the iteration that produced it
        (a frozen request that continues after an in-flight update gets the new version from then on)."""
        pos = [p for p, _ in self._switches]  # token k: the last switch strictly before g0 + (k + 1) x scale
        at = [max(0, bisect.bisect_left(pos, req.g0 + (k + 1) * self.scale) - 1) for k in (0, n - 1)]
        if at[0] == at[1]:  # no update during the request (the common case): one version
            return [self._switches[at[0]][1]] * n
        return [self._switches[max(0, bisect.bisect_left(pos, req.g0 + (k + 1) * self.scale) - 1)][1] for k in range(n)]

    def _start(self, req: _Request) -> None:
        now = self._loop.time()
        begin = max(now, self._busy_until)
        # what a request costs once (prefill_s: admission, its output's trip back) it pays on its first start; a
        # partial rollout resumed after an abort pays only its recomputed context (session 20: charged on every
        # resume, the in-run replica ran batches of ~15 against the measured run's ~68, and d_s1 22% slow)
        resumed = req.rid in self._prefilled
        self._busy_until = begin + self.cost.prefill_time(int(req.ctx0)) - (self.cost.prefill_s if resumed else 0.0)
        # busy time and prompt tokens, not an iteration: the real engines prefill inside their decode iterations
        self._window.add(self._busy_until - begin, 0, 0, prefill_tokens=int(req.ctx0))
        if self.timeline is not None:
            self.timeline.add(self.name, begin, self._busy_until, "prefill")
            self.timeline.prefill_tokens += int(req.ctx0)
            if req.rid in self._prefilled:
                self.timeline.repeated_prefill_tokens += int(req.ctx0)
        self._prefilled.add(req.rid)
        req.g0 = self._g
        req.slot = heapq.heappop(self._free_slots)
        self._ctx += req.ctx0
        self.running[req.rid] = req
        heapq.heappush(self._finish_heap, (req.g0 + req.need, req.seq, req.rid))

    def _admit_waiting(self) -> None:
        while self._admit and self.waiting and len(self.running) < self.cost.max_num_seqs:
            first = 0
            if self.scheduling_policy == "priority":  # as vLLM's: (priority, arrival)
                first = min(range(len(self.waiting)), key=lambda i: (self.waiting[i].priority, self.waiting[i].seq))
            self._start(self.waiting.pop(first))

    async def generate(self, request_id: str, prompt_ids: Sequence[int], sampling_params: SamplingParams) -> TokenOutput:
        """Generate ``max_tokens`` simulated tokens (or the request's natural length, when it stops at
        EOS and ``natural_length`` is set); an abort returns the tokens so far."""
        priority = request_priority(sampling_params, self.param_version) if self.scheduling_policy == "priority" else 0
        first = self._first_prompt.setdefault(request_id, len(prompt_ids))
        done_before = max(0, len(prompt_ids) - first)  # simulated tokens generated by earlier calls
        want = int(sampling_params.max_tokens)
        stop = "length"
        if not sampling_params.ignore_eos and self.natural_length is not None:
            natural = max(1, -(-int(self.natural_length(request_id, prompt_ids[:first])) // self.scale))
            if natural - done_before <= want:
                want, stop = max(0, natural - done_before), "completed"
        fut = self._loop.create_future()
        req = _Request(request_id, ctx0=float(self.prompt_tokens + done_before * self.scale), need=float(want * self.scale),
                       fut=fut, seq=next(self._seq), logprobs=sampling_params.logprobs, stop=stop,
                       priority=priority)
        self._advance()
        self.waiting.append(req)
        self._admit_waiting()
        self._reschedule()
        try:
            return await fut
        except asyncio.CancelledError:
            self._drop(request_id)
            raise

    def _drop(self, rid: str) -> None:
        self._advance()
        self.waiting = [r for r in self.waiting if r.rid != rid]
        req = self.running.get(rid)
        if req is not None:
            self._finish(req, "aborted")
        self._reschedule()

    # ------------------------------------------------------------------ control
    async def start(self) -> None:
        return None

    async def shutdown(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    async def abort_all_requests(self) -> int:
        self._advance()
        reqs = list(self.running.values()) + self.waiting
        self.waiting = []
        for r in list(self.running.values()):
            self._finish(r, "aborted")
        for r in reqs:
            if not r.fut.done():
                r.fut.set_result(TokenOutput([], [] if r.logprobs else None, "aborted"))
        self._reschedule()
        return len(reqs)

    async def pause(self, mode: Literal["abort", "wait", "keep"] = "abort") -> None:
        """``abort``: running requests end now with their tokens; ``wait``: drain them; ``keep``: freeze
        them (no progress, KV kept) until :meth:`resume`. New requests wait in every mode."""
        self._advance()
        self._admit = False
        if mode == "abort":
            await self.abort_all_requests()
        elif mode == "keep":
            self._frozen = True
            self._reschedule()
        else:
            if self.running:
                self._drained = asyncio.Event()
                await self._drained.wait()
                self._drained = None

    async def resume(self) -> None:
        self._advance()
        self._frozen, self._admit = False, True
        self._admit_waiting()
        self._reschedule()

    async def load_weight_buckets(self, buckets: list, version: int) -> None:
        await self.begin_weight_update()
        await self.finish_weight_update(version)

    async def begin_weight_update(self) -> None:
        return None

    async def load_bucket(self, bucket: Any, metas: Any) -> None:
        return None

    async def finish_weight_update(self, version: int) -> int:
        """The replica is busy ``weight_load_s`` (running sequences stall), then reports ``version``."""
        self._advance()
        begin = max(self._loop.time(), self._busy_until)
        self._busy_until = begin + self.cost.weight_load_s
        if self.timeline is not None:
            self.timeline.add(self.name, begin, self._busy_until, "weight load")
        self._reschedule()
        await asyncio.sleep(self._busy_until - self._loop.time())
        self._advance()
        self.param_version = int(version)
        self._switches.append((self._g, self.param_version))
        return 0

    @property
    def num_inflight(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def num_weight_workers(self) -> int:
        return 1

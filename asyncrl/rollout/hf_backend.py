"""transformers backend: :class:`HFEngine`, continuous batching on CPU or CUDA (no vLLM needed).

::

    generate(req) ─► waiting deque ─┐       (one scheduler task on the event loop; scheduling_policy=priority:
    abort / pause / resume ─► flags ┴─► _run: settle aborts ─► admit into free slots ─► to_thread(   lowest first)
                                           batcher.add(new) + batcher.step())  under the model lock
                                           ─► finished ─► resolve each request's future
    load_bucket ─► BucketAssembler ─► param.copy_ (in place) under the model lock, between steps

Batching, KV cache and CUDA graphs: :mod:`asyncrl.rollout.hf_batch` / :mod:`asyncrl.rollout.hf_forward`;
sampling: :mod:`asyncrl.rollout.hf_sampler`. The vLLM backend's :class:`~asyncrl.rollout.base.InferenceEngine`
contract: token-in-token-out with per-token log-probs of the distribution sampled from, stop reasons
``completed`` / ``length`` / ``aborted``, ``pause(mode=abort|wait|keep)`` / ``resume``, weights copied into
the model's own tensors (CUDA graphs keep their addresses; every transport through
:class:`~asyncrl.sync.receiver.ModelWeightReceiver`), so the next step uses them. Queued requests at
``pause`` are vLLM's waiting queue (``abort`` aborts them, ``wait`` / ``keep`` hold them until ``resume``). Stop
strings, top logprobs: served; penalties: refused by name.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Literal, Optional, Sequence

import torch

from asyncrl.api import InferenceEngine
from asyncrl.compute_thread import run_compute
from asyncrl.rollout.base import (PromptTooLong, SamplingParams, TokenOutput, check_scheduling_policy, eos_token_ids,
                                  request_priority)
from asyncrl.rollout.engine_stats import IterationWindow
from asyncrl.rollout.hf_batch import ContinuousBatcher
from asyncrl.rollout.hf_requests import Finished, SlotRequest
from asyncrl.rollout.hf_forward import StaticCacheLM, num_kv_slots, resolve_device
from asyncrl.rollout.hf_sampler import refuse_penalties
from asyncrl.rollout.stop import StopStrings
from asyncrl.sync.bucket import ChunkMeta
from asyncrl.sync.receiver import ModelWeightReceiver, model_tensors

logger = logging.getLogger(__name__)

DECODE_SERIAL_FLOPS = 2e9
"""A CPU decode step below this many FLOPs (``2 x parameters x rows``) runs on one torch thread
(``HFEngine(decode_threads=None)``). Measured (``benchmarks/RESULTS.md``, session 27): the embedded 0.56M-parameter
models decode at the same speed on one and two threads at 4-256 rows (up to 0.29 GFLOP a step) on a quiet box,
and inside the colocated trainer one thread decoded at 1.4-1.6 ms per step against 2.1-2.2 (each of a step's ~100
microsecond-long OpenMP regions waits at its barrier when the other core is busy); SmolLM2-135M-Instruct decodes
alike at 4 rows (1.1 GFLOP) and 1.2x / 1.35x / 1.85x faster on two threads at 16 / 64 / 128 rows (4.3+ GFLOP)."""


class HFEngine(InferenceEngine):
    """A transformers ``AutoModelForCausalLM`` serving token ids with continuous batching.

    Args:
        model_path: HF model directory (Llama-family architecture, see :mod:`asyncrl.rollout.hf_forward`).
        dtype: ``float32`` | ``bfloat16`` | ``float16``.
        device: ``cpu`` | ``cuda`` | ``cuda:N`` | ``auto``.
        seed: base seed; requests without their own seed get one drawn from it.
        torch_threads: intra-op threads for this process (``None`` leaves torch's default).
        max_num_seqs: KV-cache slots, i.e. sequences decoded together (vLLM's name).
        scheduling_policy: ``fcfs`` | ``priority`` (vLLM's): which waiting request takes a free slot; under
            ``priority`` the lowest ``SamplingParams.priority`` (``None``: the current version), ties in arrival order.
        max_model_len: positions per slot (prompt + generated); longer prompts are refused.
            ``None``: the model's ``max_position_embeddings``, at most 4096.
        kv_cache_gb: KV-cache budget in GiB on CPU; fewer slots than ``max_num_seqs`` are made
            when they would not fit (logged). ``None``: no cap.
        gpu_memory_utilization: on CUDA, the fraction of the device's memory this engine may hold
            (weights, KV cache, and a reserve for logits / prefill activations); sizes the slots
            like ``kv_cache_gb``. ``None``: no cap.
        cuda_graphs: replay the decode step from CUDA graphs on CUDA (verl/vLLM: ``not enforce_eager``).
        max_prefill_tokens: padded prompt tokens per prefill forward.
        load_format: ``auto`` reads the checkpoint; ``dummy`` random-inits from its config.json
            (vLLM's name; the first weight sync delivers the weights).
        decode_threads: torch intra-op threads of a decode step on CPU. ``None`` (default): one thread for a step
            of fewer than :data:`DECODE_SERIAL_FLOPS` (``2 x parameters x rows``), else the process's; a number:
            always that many. Prefill and the trainer keep the process's threads. Ignored on CUDA. Config:
            ``actor_rollout_ref.rollout.engine_kwargs.hf.decode_threads``.
    """

    num_weight_workers = 1

    def __init__(self, model_path: str, *, dtype: str = "float32", device: str = "cpu", seed: int = 0,
                 torch_threads: Optional[int] = None, max_num_seqs: int = 256, scheduling_policy: str = "fcfs",
                 max_model_len: Optional[int] = None,
                 kv_cache_gb: Optional[float] = None, gpu_memory_utilization: Optional[float] = None,
                 cuda_graphs: bool = True, max_prefill_tokens: int = 16384, load_format: str = "auto",
                 iteration_stats: bool = True, decode_threads: Optional[int] = None, **_: Any):
        self.model_path = str(model_path)
        self.load_format = load_format
        self.dtype = getattr(torch, dtype)
        self.device = resolve_device(device)
        self.seed = seed
        self.torch_threads = torch_threads
        if decode_threads is not None and (isinstance(decode_threads, bool) or int(decode_threads) < 1):
            raise ValueError(f"decode_threads must be a whole number >= 1 or None, got {decode_threads!r}")
        self.decode_threads = None if decode_threads is None else int(decode_threads)
        self._n_params: Optional[int] = None  # the model's, counted at the first decode step
        self.max_num_seqs = max(1, int(max_num_seqs or 256))
        self.scheduling_policy = check_scheduling_policy(scheduling_policy)
        self.max_model_len = max_model_len
        self.kv_cache_gb = kv_cache_gb
        self.gpu_memory_utilization = gpu_memory_utilization
        self.cuda_graphs = cuda_graphs
        self.max_prefill_tokens = max_prefill_tokens
        self.param_version = 0
        self.eos_token_ids = eos_token_ids(self.model_path)
        # each add + step timed (asyncrl.rollout.engine_stats; ``not rollout.disable_log_stats``)
        self.iteration_window: Optional[IterationWindow] = IterationWindow() if iteration_stats else None
        self.model: Any = None
        self._tok: Any = None
        self.batcher: Optional[ContinuousBatcher] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None  # see _ensure_loop
        self._admitting = True  # False after pause(): queued requests stay queued
        self._frozen = False  # True after pause("keep"): admitted requests freeze
        self._waiting: collections.deque[SlotRequest] = collections.deque()
        self._futures: dict[str, asyncio.Future] = {}
        self._aborted: set[str] = set()
        self._rng, self._task = torch.Generator().manual_seed(seed), None  # _task: the scheduler (_ensure_loop)
        self._lock: asyncio.Lock
        self._wake: asyncio.Event
        self._drained: asyncio.Condition
        self._weights = ModelWeightReceiver(lambda: model_tensors(self.model))  # lock: see _ensure_loop

    # ------------------------------------------------------------------ lifecycle

    def _kv_budget_bytes(self) -> Optional[float]:
        if self.device.type == "cuda" and self.gpu_memory_utilization is not None:
            total = torch.cuda.get_device_properties(self.device).total_memory
            vocab = self.model.config.vocab_size
            reserve = 8 * self.max_num_seqs * vocab * 4 + (1 << 30)  # fp32 logits + sampling temporaries, prefill
            return self.gpu_memory_utilization * total - torch.cuda.memory_allocated(self.device) - reserve
        return None if self.kv_cache_gb is None else self.kv_cache_gb * (1 << 30)

    def _num_slots(self) -> int:
        return num_kv_slots(self.model.config, self.max_model_len, self.dtype, self.max_num_seqs, self._kv_budget_bytes())

    async def start(self) -> None:
        import transformers

        if self.torch_threads:
            torch.set_num_threads(self.torch_threads)

        def load() -> None:
            if self.load_format == "dummy":  # weights come with the first sync
                cfg = transformers.AutoConfig.from_pretrained(self.model_path)
                with torch.device(self.device):
                    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=self.dtype)
            else:
                model = transformers.AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.dtype)
            self.model = model.to(self.device).eval().requires_grad_(False)
            if self.max_model_len is None:
                self.max_model_len = min(int(getattr(model.config, "max_position_embeddings", 4096)), 4096)
            self.max_model_len = int(self.max_model_len)
            lm = StaticCacheLM(self.model, self._num_slots(), self.max_model_len)
            self.batcher = ContinuousBatcher(lm, cuda_graphs=self.cuda_graphs, max_prefill_tokens=self.max_prefill_tokens)

        await run_compute(load)
        self._ensure_loop()
        logger.info("HF engine ready: %s on %s, %d slots x %d positions, cuda_graphs=%s", self.model_path,
                    self.device, self.batcher.lm.num_slots, self.max_model_len, self.batcher.cuda_graphs)

    def _ensure_loop(self) -> None:
        """Bind the scheduler task and asyncio primitives to the running event loop.

        A Ray actor uses one loop for its life; a script or test may call ``asyncio.run`` once per
        call. Rebinding is only possible with nothing in flight (work lives on the old loop).
        """
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        if self._futures:
            raise RuntimeError("HFEngine used from a second event loop while requests are in flight")
        self._loop = loop
        self._lock = asyncio.Lock()  # one model user at a time: a step, or a weight copy
        self._weights.lock = self._lock
        self._wake = asyncio.Event()
        self._drained = asyncio.Condition()
        self._task = loop.create_task(self._run())

    async def shutdown(self) -> None:
        if self._loop is asyncio.get_running_loop():
            await self.abort_all_requests()
            async with self._drained:
                await self._drained.wait_for(lambda: not self._futures)
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._loop = None
        await self._weights.close()
        self.batcher = None
        self.model = None

    @property
    def num_inflight(self) -> int:
        return len(self._futures)

    # ------------------------------------------------------------------ generation

    def _slot_request(self, request_id: str, prompt_ids: Sequence[int], sp: SamplingParams) -> SlotRequest:
        priority = request_priority(sp, self.param_version) if self.scheduling_policy == "priority" else 0
        n = len(prompt_ids)
        if n >= self.max_model_len:
            raise PromptTooLong(n, self.max_model_len)
        if n < 1:
            raise ValueError(f"empty prompt: the hf engine needs 1 <= len(prompt_ids) < max_model_len ({self.max_model_len})")
        seed = sp.seed if sp.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._rng))
        stops = ([] if sp.ignore_eos else list(self.eos_token_ids)) + list(sp.stop_token_ids)
        strings = StopStrings(self._tokenizer(), sp.stop) if sp.stop else None
        check = (lambda ids: strings.first_stop(ids, len(ids) - 1) is not None) if strings else None
        return SlotRequest(request_id, list(prompt_ids), int(sp.max_tokens), seed % 2**64, temperature=sp.temperature,
                           top_k=sp.top_k, top_p=sp.top_p, min_p=sp.min_p, stop_token_ids=stops, stop_check=check,
                           top_logprobs=sp.top_logprobs if sp.logprobs else 0, priority=priority)

    def _tokenizer(self) -> Any:
        """The model's tokenizer (for stop strings), loaded on first use."""
        if self._tok is None:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(self.model_path)
        return self._tok

    async def generate(self, request_id: str, prompt_ids: Sequence[int], sampling_params: SamplingParams) -> TokenOutput:
        """See :meth:`InferenceEngine.generate`; aborts are honoured between decode steps.

        Raises:
            RuntimeError: the engine is not started.
            ValueError: ``request_id`` already in flight, or an empty / too long prompt.
        """
        if self.batcher is None:
            raise RuntimeError("HFEngine is not started (call `await engine.start()`)")
        if request_id in self._futures:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        self._ensure_loop()
        sp = sampling_params
        refuse_penalties(sp)
        req = self._slot_request(request_id, prompt_ids, sp)
        if sp.max_tokens <= 0:
            return TokenOutput(token_ids=[], log_probs=[] if sp.logprobs else None, stop_reason="length",
                               top_logprobs=[] if req.top_logprobs else None)
        fut = asyncio.get_running_loop().create_future()
        self._futures[request_id] = fut
        self._waiting.append(req)
        self._wake.set()
        try:
            done: Finished = await asyncio.shield(fut)
        except asyncio.CancelledError:  # the caller went away: free the slot
            self._aborted.add(request_id)
            self._wake.set()
            raise
        return TokenOutput(token_ids=done.token_ids, log_probs=done.log_probs if sp.logprobs else None,
                           stop_reason=done.stop_reason,  # type: ignore[arg-type]
                           response_versions=done.versions, top_logprobs=done.top_logprobs)

    def _resolve(self, finished: Sequence[Finished]) -> None:
        for f in finished:
            fut = self._futures.pop(f.request_id, None)
            self._aborted.discard(f.request_id)
            if fut is not None and not fut.done():
                fut.set_result(f)

    def _settle_aborts(self) -> None:
        """Abort flagged requests: queued ones at once (no tokens), active ones through the batcher."""
        if not self._aborted:
            return
        queued = [r for r in self._waiting if r.request_id in self._aborted]
        self._waiting = collections.deque(r for r in self._waiting if r.request_id not in self._aborted)
        self._resolve([Finished(r.request_id, [], [], [], "aborted", [] if r.top_logprobs else None) for r in queued])
        self._resolve(self.batcher.abort(self._aborted))
        self._aborted.intersection_update(self._futures)

    async def _run(self) -> None:
        """The scheduler: one iteration = admit what fits, then one decode step for all active slots."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                async with self._lock:
                    self._settle_aborts()
                    admit: list[SlotRequest] = []
                    if self._admitting and not self._frozen:
                        if self.scheduling_policy == "priority" and len(self._waiting) > 1 and self.batcher.num_free:
                            self._waiting = collections.deque(sorted(self._waiting, key=lambda r: r.priority))  # ties FIFO
                        while self._waiting and len(admit) < self.batcher.num_free:
                            admit.append(self._waiting.popleft())
                    stepping = not self._frozen and (self.batcher.num_active > 0 or bool(admit))
                    if stepping:
                        try:
                            finished = await run_compute(self._iterate, admit)
                        except Exception as exc:  # a failed step fails its requests, not the engine
                            logger.exception("HF engine step failed")
                            self._fail(admit, exc)
                            finished = []
                        self._resolve(finished)
                async with self._drained:
                    self._drained.notify_all()
                if not stepping:
                    break
                await asyncio.sleep(0)  # let new requests / pause calls in

    def _iterate(self, admit: list[SlotRequest]) -> list[Finished]:
        version = self.param_version  # weight loads wait for the lock: this is the version used
        t0, active = time.perf_counter(), self.batcher.num_active
        finished = self.batcher.add(admit, version) if admit else []
        stepped = self.batcher.num_active  # the admitted rows' first tokens came from their prefill
        finished += self._decode(version)
        if self.iteration_window is not None:
            self.iteration_window.record(time.perf_counter() - t0, active + len(admit), len(admit) + stepped,
                                         sum(len(r.prompt_ids) for r in admit))
        return finished

    def _decode(self, version: int) -> list[Finished]:
        """One decode step, on ``decode_threads`` torch threads on CPU (the calling thread's setting restored)."""
        threads = torch.get_num_threads()
        if self.device.type != "cpu":
            return self.batcher.step(version)
        want = self.decode_threads
        if want is None:
            if self._n_params is None:
                self._n_params = sum(p.numel() for p in self.model.parameters())
            want = 1 if 2 * self._n_params * self.batcher.num_active < DECODE_SERIAL_FLOPS else threads
        if want == threads:
            return self.batcher.step(version)
        torch.set_num_threads(want)
        try:
            return self.batcher.step(version)
        finally:
            torch.set_num_threads(threads)

    def _fail(self, admit: list[SlotRequest], exc: Exception) -> None:
        ids = {r.request_id for r in admit} | set(self.batcher.active_ids())
        self.batcher.abort(ids)
        for rid in ids:
            fut = self._futures.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_exception(exc)

    async def abort_all_requests(self) -> int:
        if self.batcher is None:
            return 0
        self._ensure_loop()
        ids = list(self._futures)
        self._aborted.update(ids)
        self._wake.set()
        return len(ids)

    async def pause(self, mode: Literal["abort", "wait", "keep"] = "abort") -> None:
        """vLLM's ``pause_generation`` modes; returns once in-flight work is settled.

        ``abort``: in-flight requests (queued or running) return ``aborted`` with their tokens so
        far; ``wait``: running ones finish, queued ones wait; ``keep``: running ones freeze with
        their KV cache after the current step.
        """
        if mode not in ("abort", "wait", "keep"):
            raise ValueError(f"pause mode must be abort | wait | keep, got {mode!r}")
        self._ensure_loop()
        self._admitting = False
        if mode == "keep":
            self._frozen = True
            async with self._lock:  # the step in progress, if any, completes first
                return
        if mode == "abort":
            self._aborted.update(self._futures)
        self._wake.set()
        async with self._drained:
            await self._drained.wait_for(lambda: self.batcher is None or self.batcher.num_active == 0 and (
                mode == "wait" or not self._aborted))

    async def resume(self) -> None:
        self._ensure_loop()
        self._admitting = True
        self._frozen = False
        self._wake.set()

    # ------------------------------------------------------------------ weights

    async def _set_version(self, version: int) -> None:
        async with self._lock:  # steps read the version under the lock: tokens are attributed exactly
            self.param_version = int(version)

    async def begin_weight_update(self) -> None:
        self._ensure_loop()
        await self._weights.begin()

    async def load_bucket(self, bucket: Any, metas: Sequence[ChunkMeta]) -> None:
        self._ensure_loop()
        await self._weights.load_bucket(bucket, metas)

    async def finish_weight_update(self, version: int) -> int:
        loaded = await self._weights.finish()
        await self._set_version(version)
        return loaded

    async def load_weight_buckets(self, buckets: list, version: int) -> None:
        """Load ``[(bucket, metas), ...]`` (all of one sync) as ``version``."""
        await self.begin_weight_update()
        for bucket, metas in buckets:
            await self.load_bucket(bucket, metas)
        await self.finish_weight_update(version)

    async def gloo_init(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float = 600.0) -> list[int]:
        return await self._weights.gloo_init(host, port, base_rank, world_size, timeout_s)

    async def _adopt(self, receiving: Any, version: int) -> int:
        """Run one transport's receive coroutine (on this engine's loop), then adopt ``version``."""
        self._ensure_loop()
        loaded = await receiving
        await self._set_version(version)
        return loaded

    async def gloo_receive(self, plan: Sequence[Sequence[ChunkMeta]], version: int) -> int:
        return await self._adopt(self._weights.gloo_receive(plan), version)

    async def nccl_init(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float = 600.0) -> list[int]:
        return await self._weights.nccl_init(host, port, base_rank, world_size, timeout_s,
                                             device=str(self.device) if self.device.index is not None else None)

    async def nccl_close(self) -> None:
        await self._weights.nccl_close()

    async def ipc_receive(self, items: list, version: int) -> int:
        return await self._adopt(self._weights.ipc_receive(items, self.device), version)

    async def nccl_receive(self, version: int) -> int:
        return await self._adopt(self._weights.nccl_receive(), version)

    async def param_checksums(self) -> dict[str, float]:
        return {n: float(p.detach().double().sum()) for n, p in self.model.named_parameters()}

    async def param_digests(self) -> dict[str, str]:
        """``{name: sha256 of the raw bytes}`` of the live tensors (bit-exact sync checks)."""
        return self._weights.digests()

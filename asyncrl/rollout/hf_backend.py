"""transformers backend: :class:`HFEngine`, the fallback when vLLM is absent.

::

    generate(req) ──► prefill (KV cache) ──► loop: [wait while paused] ─► sample ─► decode step
                                                 ▲ abort flag checked between tokens
    weights (cpu_rpc | gloo | nccl) ──► ModelWeightReceiver ──► param.copy_ under the model lock

Deliberately simple: one request per forward (no continuous batching), requests interleave at
token granularity on the event loop, each forward runs in a worker thread under a lock. Same
token-in-token-out contract as :class:`asyncrl.rollout.vllm_backend.VLLMEngine`, including
the log-prob of the sampled token under the filtered distribution it was drawn from (vLLM's
``processed_logprobs``; the filters are :mod:`asyncrl.rollout.sampling`'s, shared with the trainer).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal, Optional, Sequence

import torch

from asyncrl.api import InferenceEngine
from asyncrl.rollout.base import SamplingParams, TokenOutput, UnsupportedSamplingParam
from asyncrl.rollout.sampling import GREEDY_EPS, apply_sampling_filters
from asyncrl.rollout.stop import StopStrings
from asyncrl.rollout.vllm_backend import eos_token_ids
from asyncrl.sync.bucket import ChunkMeta
from asyncrl.sync.receiver import ModelWeightReceiver, model_tensors

logger = logging.getLogger(__name__)


def sample_token(logits: torch.Tensor, sp: SamplingParams, generator: Optional[torch.Generator]) -> tuple[int, float]:
    """Pick the next id from ``(vocab,)`` float logits; returns ``(id, logprob)``.

    Greedy when ``temperature == 0`` (logprob of the raw distribution); otherwise samples from
    the distribution of :func:`asyncrl.rollout.sampling.apply_sampling_filters` (temperature,
    min-p, top-k, top-p in vLLM's order) and reports the log-prob under that same filtered
    distribution (vLLM's ``processed_logprobs``), which is what the trainer recomputes.
    """
    filtered = apply_sampling_filters(logits, sp.temperature, sp.top_k, sp.top_p, sp.min_p)
    logp = torch.log_softmax(filtered, -1)
    if sp.temperature < GREEDY_EPS:
        tok = int(torch.argmax(filtered))
    else:
        tok = int(torch.multinomial(logp.exp(), 1, generator=generator))
    return tok, float(logp[tok])


def top_logprobs(logits: torch.Tensor, sp: SamplingParams, k: int) -> list[tuple[int, float]]:
    """The ``k`` most likely ids of the distribution :func:`sample_token` reports logprobs of (ids the
    filters removed are left out, as vLLM reports them at ``-inf``)."""
    logp = torch.log_softmax(apply_sampling_filters(logits, sp.temperature, sp.top_k, sp.top_p, sp.min_p), -1)
    vals, idx = torch.topk(logp, min(k, logp.numel()))
    return [(int(i), float(v)) for i, v in zip(idx, vals) if float(v) > -1e3]


def _refuse_penalties(sp: SamplingParams) -> None:
    for name, off in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
        if getattr(sp, name) != off:
            raise UnsupportedSamplingParam(name, f"{name} is not supported by the hf rollout backend "
                                                 f"(use actor_rollout_ref.rollout.name=vllm)")


class HFEngine(InferenceEngine):
    """A transformers ``AutoModelForCausalLM`` serving token ids (implements :class:`InferenceEngine`).

    Args:
        model_path: HF model directory.
        dtype: ``float32`` | ``bfloat16``.
        device: torch device (``cpu`` by default).
        seed: base seed; requests without their own seed draw from one engine generator.
        torch_threads: intra-op threads for this process (``None`` leaves torch's default).
        max_num_seqs: accepted for config symmetry with vLLM; unused (no batching).
        load_format: ``auto`` reads the checkpoint; ``dummy`` random-inits from its config.json
            (vLLM's name; the first weight sync delivers the weights).
    """

    def __init__(self, model_path: str, *, dtype: str = "float32", device: str = "cpu", seed: int = 0,
                 torch_threads: Optional[int] = None, max_num_seqs: int = 0, load_format: str = "auto", **_: Any):
        self.model_path = str(model_path)
        self.load_format = load_format
        self.dtype = getattr(torch, dtype)
        self.device = torch.device(device)
        self.seed = seed
        self.torch_threads = torch_threads
        self.param_version = 0
        self.eos_token_ids = eos_token_ids(self.model_path)
        self.model: Any = None
        self._tok: Any = None
        self._lock = asyncio.Lock()
        self._admit = asyncio.Event()  # cleared by pause(): new requests wait
        self._admit.set()
        self._running = asyncio.Event()  # cleared by pause("keep"): admitted requests freeze
        self._running.set()
        self._aborted: set[str] = set()
        self._inflight: set[str] = set()  # inside generate(), admitted or queued
        self._active: set[str] = set()  # admitted
        self._drained = asyncio.Condition()
        self._generator = torch.Generator().manual_seed(seed)
        self._weights = ModelWeightReceiver(lambda: model_tensors(self.model), self._lock)

    async def start(self) -> None:
        import transformers

        if self.torch_threads:
            torch.set_num_threads(self.torch_threads)
        def load() -> Any:
            if self.load_format == "dummy":  # weights come with the first sync
                cfg = transformers.AutoConfig.from_pretrained(self.model_path)
                with torch.device(self.device):
                    return transformers.AutoModelForCausalLM.from_config(cfg, dtype=self.dtype).eval()
            return transformers.AutoModelForCausalLM.from_pretrained(self.model_path, dtype=self.dtype).to(self.device).eval()

        self.model = await asyncio.to_thread(load)
        logger.info("HF engine ready: %s", self.model_path)

    async def shutdown(self) -> None:
        await self.abort_all_requests()
        await self._weights.close()
        self.model = None

    @property
    def num_inflight(self) -> int:
        return len(self._inflight)

    num_weight_workers = 1

    # ------------------------------------------------------------------ generation

    async def _forward(self, ids: torch.Tensor, past: Any) -> tuple[torch.Tensor, Any, int]:
        """One forward under the lock; returns ``(last logits, cache, param_version of the weights used)``."""
        def step() -> tuple[torch.Tensor, Any]:
            with torch.no_grad():
                out = self.model(input_ids=ids.to(self.device), past_key_values=past, use_cache=True)
            return out.logits[0, -1].float().cpu(), out.past_key_values

        async with self._lock:  # weight loads hold it too: the version read here is the one used
            version = self.param_version
            logits, cache = await asyncio.to_thread(step)
            return logits, cache, version

    async def generate(self, request_id: str, prompt_ids: Sequence[int], sampling_params: SamplingParams) -> TokenOutput:
        """See :meth:`InferenceEngine.generate`; abort is honoured between tokens."""
        if self.model is None:
            raise RuntimeError("HFEngine is not started (call `await engine.start()`)")
        if request_id in self._inflight:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        sp = sampling_params
        _refuse_penalties(sp)
        gen = torch.Generator().manual_seed(sp.seed) if sp.seed is not None else self._generator
        stops = (set() if sp.ignore_eos else set(self.eos_token_ids)) | set(sp.stop_token_ids)
        ids: list[int] = []
        lps: list[float] = []
        top: list[list[tuple[int, float]]] = []
        k_top = sp.top_logprobs if sp.logprobs else 0
        stop_strings = StopStrings(self._tokenizer(), sp.stop) if sp.stop else None
        versions: list[int] = []
        stop = "length"
        self._inflight.add(request_id)
        try:
            await self._admit.wait()
            self._active.add(request_id)
            past = None
            nxt = torch.tensor([list(prompt_ids)], dtype=torch.long)
            while len(ids) < sp.max_tokens:
                if request_id in self._aborted:
                    stop = "aborted"
                    break
                logits, past, version = await self._forward(nxt, past)
                tok, lp = sample_token(logits, sp, gen)
                ids.append(tok)
                lps.append(lp)
                versions.append(version)
                if k_top > 0:
                    top.append(top_logprobs(logits, sp, k_top))
                if tok in stops or (stop_strings and stop_strings.first_stop(ids, len(ids) - 1)):
                    stop = "completed"
                    break
                nxt = torch.tensor([[tok]], dtype=torch.long)
                if not self._running.is_set():  # pause(mode="keep"): freeze here
                    await self._running.wait()
            else:
                stop = "length"
        finally:
            self._inflight.discard(request_id)
            self._active.discard(request_id)
            self._aborted.discard(request_id)
            async with self._drained:
                self._drained.notify_all()
        return TokenOutput(token_ids=ids, log_probs=lps if sp.logprobs else None, stop_reason=stop,  # type: ignore[arg-type]
                           response_versions=versions, top_logprobs=top if k_top > 0 else None)

    def _tokenizer(self) -> Any:
        """The model's tokenizer (for stop strings), loaded on first use."""
        if self._tok is None:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(self.model_path)
        return self._tok

    async def abort_all_requests(self) -> int:
        ids = list(self._inflight)
        self._aborted.update(ids)
        return len(ids)

    async def pause(self, mode: Literal["abort", "wait", "keep"] = "abort") -> None:
        """Same modes as vLLM's ``pause_generation``; returns once in-flight work is settled."""
        self._admit.clear()
        if mode == "keep":
            self._running.clear()
            return
        if mode == "abort":
            self._aborted.update(self._active)
        async with self._drained:
            await self._drained.wait_for(lambda: not self._active)

    async def resume(self) -> None:
        self._admit.set()
        self._running.set()

    # ------------------------------------------------------------------ weights

    async def begin_weight_update(self) -> None:
        await self._weights.begin()

    async def load_bucket(self, bucket: Any, metas: Sequence[ChunkMeta]) -> None:
        await self._weights.load_bucket(bucket, metas)

    async def finish_weight_update(self, version: int) -> int:
        loaded = await self._weights.finish()
        self.param_version = int(version)
        return loaded

    async def load_weight_buckets(self, buckets: list, version: int) -> None:
        """Load ``[(bucket, metas), ...]`` (all of one sync) as ``version``."""
        await self.begin_weight_update()
        for bucket, metas in buckets:
            await self.load_bucket(bucket, metas)
        await self.finish_weight_update(version)

    async def gloo_init(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float = 600.0) -> list[int]:
        return await self._weights.gloo_init(host, port, base_rank, world_size, timeout_s)

    async def gloo_receive(self, plan: Sequence[Sequence[ChunkMeta]], version: int) -> int:
        loaded = await self._weights.gloo_receive(plan)
        self.param_version = int(version)
        return loaded

    async def nccl_init(self, host: str, port: int, base_rank: int, world_size: int, timeout_s: float = 600.0) -> list[int]:
        return await self._weights.nccl_init(host, port, base_rank, world_size, timeout_s,
                                             device=str(self.device) if self.device.index is not None else None)

    async def nccl_receive(self, version: int) -> int:
        loaded = await self._weights.nccl_receive()
        self.param_version = int(version)
        return loaded

    async def param_checksums(self) -> dict[str, float]:
        return {n: float(p.detach().double().sum()) for n, p in self.model.named_parameters()}

    async def param_digests(self) -> dict[str, str]:
        """``{name: sha256 of the raw bytes}`` of the live tensors (bit-exact sync checks)."""
        return self._weights.digests()

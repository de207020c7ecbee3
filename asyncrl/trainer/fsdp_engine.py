"""FSDP2 trainer engine: a transformers causal LM sharded with ``fully_shard`` over all ranks.

The GPU counterpart of :class:`asyncrl.trainer.engine.TrainEngine`; both implement
:class:`asyncrl.api.TrainEngine` (``compute_log_probs``, ``compute_ref_log_probs``, ``update``,
``named_tensors_for_sync``, ``state_dict`` / ``load_state_dict``). One process per GPU: Ray actors
of :class:`asyncrl.trainer.worker_group.TrainWorkerGroup` (``actor.strategy=fsdp2``), or ``torchrun``
in the benchmarks; every rank calls every method (they are collectives), with its own rows.

::

    batch (this rank's rows) -> micro-batches -> forward (bf16 params, all-gathered per layer)
      -> response log-probs (fp32) -> loss_fn -> backward (reduce-scatter fp32 grads per layer)
      -> clip by global grad norm -> AdamW on fp32 shards
    sync: per bucket of parameters, all-gather full tensors (sync dtype) -> yield -> drop

Design: torchtitan / verl FSDP2 workers. Mixed precision keeps fp32 master shards and computes
in bf16 (``MixedPrecisionPolicy``); activation checkpointing uses the model's own
``gradient_checkpointing_enable`` so parameter names stay the HF names the rollout side loads.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist

from asyncrl.rollout.sampling import SamplingFilters, token_log_probs
from asyncrl.trainer.logprobs import ForwardPlan, forward_plan, kept_log_probs
from asyncrl.trainer.losses import LossScale
from asyncrl.trainer.fsdp_dist import (  # noqa: F401 - re-exported: callers import them from here
    FSDPCheckpointState, _get, _len, _reshard, _rows, init_distributed)

logger = logging.getLogger(__name__)

SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
"""Attention kernels of the forward with ``use_dynamic_bsz`` on CUDA (``SDPBackend`` names): not cuDNN's, which plans
anew for each new shape, and every packed micro-batch has its own: an update on one H200 went 1.77-2.00 -> 1.28-1.56 s
per optimizer step (fixed-row micro-batches share one shape per step and keep cuDNN; ``benchmarks/RESULTS.md``, s11)."""

LossFn = Callable[[torch.Tensor, Any, LossScale, Optional[torch.Tensor]], tuple[torch.Tensor, dict]]
"""``loss_fn(log_probs, micro_batch, scale, entropy) -> (loss, metrics)``, as the CPU engine's."""


class FSDPEngine(FSDPCheckpointState):
    """A HF causal LM sharded with FSDP2, with AdamW and grad clipping.

    Args:
        model: a ``transformers`` model, a ``PretrainedConfig`` (random init, same seed on all
            ranks) or a path for ``from_pretrained``.
        lr, betas, weight_decay: AdamW settings (``actor_rollout_ref.actor.optim.*``).
        clip_grad: max global grad norm.
        micro_batch_size: sequences per forward/backward.
        max_token_len: verl's ``use_dynamic_bsz`` / ``ppo_max_token_len_per_gpu``: a
            :class:`~asyncrl.trainer.engine.Batch` is split into micro-batches of at most this many padded
            tokens, each cut to its own longest row (:func:`~asyncrl.trainer.engine.chunk_rows`); the
            ranks even out to the same count (:func:`~asyncrl.trainer.engine.even_chunks`). ``None``:
            ``micro_batch_size`` rows, every one padded to the batch's longest.
        activation_checkpointing: recompute each decoder layer in backward.
        param_dtype / reduce_dtype: compute and gradient-reduction dtypes of the
            ``MixedPrecisionPolicy`` (master weights and optimizer stay fp32).
        compile: ``torch.compile`` each decoder layer's forward (fuses norms / rotary / SwiGLU)
            and the log-prob head (no fp32 copy of the logits).
        reshard_after_forward: free gathered layer params after forward (ZeRO-3); ``False``
            keeps them to backward (ZeRO-2 style: fewer all-gathers, more memory).
        fused_optimizer: fused AdamW kernel instead of foreach (CUDA only).
        seed: init seed (must match across ranks).
        sampling: the rollout's sampling filters (:mod:`asyncrl.rollout.sampling`); every log-prob is
            of that filtered distribution unless a call passes its own.
        warmup, total_updates: linear warm-up then linear decay to 0 of the learning rate (updates);
            ``total_updates=0`` keeps it constant after warm-up.
        with_reference: keep a frozen, identically sharded copy for :meth:`compute_ref_log_probs`.
        sync_dtype: dtype the weights are sent in (the inference model's; ``None`` keeps fp32).

    Raises:
        ImportError: torch without ``torch.distributed.fsdp.fully_shard`` (needs torch >= 2.6).
    """

    def __init__(self, model: Any, lr: float = 1e-6, betas: tuple = (0.9, 0.999), weight_decay: float = 0.0,
                 clip_grad: float = 1.0, micro_batch_size: int = 1, activation_checkpointing: bool = False,
                 param_dtype: torch.dtype = torch.bfloat16, reduce_dtype: torch.dtype = torch.float32,
                 compile: bool = False, reshard_after_forward: bool = True, fused_optimizer: bool = False,
                 seed: int = 0, sampling: Optional[SamplingFilters] = None, warmup: int = 0, total_updates: int = 0,
                 with_reference: bool = False, sync_dtype: Optional[torch.dtype] = torch.bfloat16,
                 max_token_len: Optional[int] = None):
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError as e:  # pragma: no cover
            raise ImportError("FSDPEngine needs torch >= 2.6 (torch.distributed.fsdp.fully_shard)") from e
        self.rank, self.world_size, self.device = init_distributed()
        torch.manual_seed(seed)
        self.model = self._build(model)
        self.ref_model = copy.deepcopy(self.model).eval() if with_reference else None
        if activation_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model.config.use_cache = False
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        layers = self.model.model.layers
        for i, layer in enumerate(layers):
            if compile:  # compile forward only: FSDP hooks stay eager, names stay HF names
                layer.forward = torch.compile(layer.forward)
            # the last layer's params are needed again at once by backward: keep them gathered
            fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward and i < len(layers) - 1)
        fully_shard(self.model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
        self.model.train()
        if self.ref_model is not None:  # frozen: sharded like the policy, no optimizer state
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
            for layer in self.ref_model.model.layers:
                fully_shard(layer, mesh=mesh, mp_policy=mp)
            fully_shard(self.ref_model, mesh=mesh, mp_policy=mp)
        self._token_log_probs = (torch.compile(self._token_log_probs_eager) if compile
                                 else self._token_log_probs_eager)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=tuple(betas),
                                           weight_decay=weight_decay,
                                           **({"fused": True} if fused_optimizer else {"foreach": True}))
        from asyncrl.trainer.schedule import warmup_linear_decay

        # no schedule asked: the learning rate is left alone (callers may set it in param_groups)
        schedule = warmup_linear_decay(warmup, total_updates) if total_updates else (lambda k: min(1.0, (k + 1) / max(1, warmup)))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule) if warmup or total_updates else None
        self.clip_grad = clip_grad
        self.micro_batch_size = micro_batch_size
        self.max_token_len = max_token_len
        self.sampling = sampling
        self.sync_dtype = sync_dtype
        self.updates = 0

    def _build(self, model: Any) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM, PretrainedConfig

        if isinstance(model, torch.nn.Module):
            return model.to(device=self.device, dtype=torch.float32)
        if isinstance(model, PretrainedConfig):
            with torch.device(self.device):
                return AutoModelForCausalLM.from_config(model, dtype=torch.float32, attn_implementation="sdpa")
        return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="sdpa").to(self.device)

    # ------------------------------------------------------------------ forward
    def _plan(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, resp_index: Optional[torch.Tensor],
              resp_len: int) -> tuple[torch.Tensor, int, bool, bool]:
        """Per-batch facts read once (one host sync), so the micro-batch loop never waits on the GPU.

        Returns:
            ``(resp_index on device, first logit position, verl layout?, causal mask enough?)``. The
            causal mask is enough when no row has padding before a real token (all ones, or right-padded
            as :func:`~asyncrl.trainer.engine.collate` builds batches): no real token can attend to a later
            pad, so the model runs without a mask and the attention kernels take their unmasked path (a
            2,112-token micro-batch of 8 rows on an H200: backward 481 -> 206 ms per step of 16 calls).
        """
        seq = input_ids.shape[1]
        if resp_index is None:  # verl layout: the response is the last resp_len columns
            resp_index = torch.arange(seq - resp_len, seq, device=self.device).expand(input_ids.shape[0], resp_len)
        resp_index = resp_index.to(self.device)
        plan = forward_plan(input_ids, attention_mask, resp_index)
        return resp_index, plan.first, plan.verl, plan.causal_only

    def _attention_kernels(self) -> Any:
        """:data:`SDPA_BACKENDS` when packing on CUDA (the backward follows the forward's kernel); else torch's choice."""
        if self.device.type != "cuda" or not self.max_token_len:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, name) for name in SDPA_BACKENDS])

    def _log_probs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, resp_index: torch.Tensor,
                   first: int, verl: bool, causal_only: bool, sampling: Optional[SamplingFilters],
                   with_entropy: bool = False, model: Optional[torch.nn.Module] = None
                   ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``(b, resp_len)`` fp32 logprob of ``input_ids[resp_index]`` under the rollout's sampling
        filters (0 where ``resp_index`` is 0), and the filtered entropy when asked."""
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        seq = input_ids.shape[1]
        # causal only: no mask and no position ids (0..seq-1, the real tokens' own positions); ids that
        # stop counting over the pads would read to transformers as packed sequences, and mask again
        position_ids = None if causal_only else (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        # logits only from the first predicting position on: the prompt's logits are never used
        with self._attention_kernels():
            out = (model or self.model)(input_ids=input_ids, attention_mask=None if causal_only else attention_mask,
                                        position_ids=position_ids, logits_to_keep=seq - first, use_cache=False)
        return kept_log_probs(out.logits, input_ids, resp_index, ForwardPlan(first, verl, causal_only), sampling,
                              with_entropy, self._token_log_probs)

    @staticmethod
    def _token_log_probs_eager(logits: torch.Tensor, targets: torch.Tensor,
                               sampling: Optional[SamplingFilters]) -> torch.Tensor:
        """Filtered ``log_softmax(logits)[targets]`` in fp32 (:func:`asyncrl.rollout.sampling.token_log_probs`):
        ``(b, r, V)``, ``(b, r)`` -> ``(b, r)``."""
        return token_log_probs(logits, targets, sampling)

    @torch.no_grad()
    def log_probs_of(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor,
                     resp_index: Optional[torch.Tensor] = None, sampling: Optional[SamplingFilters] = None,
                     model: Optional[torch.nn.Module] = None) -> torch.Tensor:
        """Logprobs of the response tokens under the current weights (``model``: the reference instead).

        Args:
            input_ids: ``(batch, seq)`` int64, prompt then response (verl layout: the response is
                the last ``resp_len`` columns, right-padded) unless ``resp_index`` is given.
            attention_mask: ``(batch, seq)`` 1 on real tokens.
            response_mask: ``(batch, resp_len)``; only its shape is used here.
            resp_index: optional ``(batch, resp_len)`` int64 column of each response token
                (layout of :func:`asyncrl.trainer.engine.collate`; 0 marks padding).
            sampling: the rollout's temperature / top-k / top-p / min-p (:mod:`asyncrl.rollout.sampling`);
                default the engine's.

        Returns:
            ``(batch, resp_len)`` float32 on ``input_ids``' device.
        """
        ri, first, verl, full = self._plan(input_ids, attention_mask, resp_index, response_mask.shape[1])
        sampling = sampling or self.sampling
        m = self.micro_batch_size
        out = [self._log_probs(input_ids[i:i + m], attention_mask[i:i + m], ri[i:i + m], first, verl, full, sampling,
                               model=model)[0] for i in range(0, input_ids.shape[0], m)]
        _reshard(model or self.model)  # no backward follows: free the params kept gathered (root, last layer)
        return torch.cat(out).to(input_ids.device)

    @torch.no_grad()
    def _log_probs_by_tokens(self, batch: Any, model: Optional[torch.nn.Module] = None) -> torch.Tensor:
        """:meth:`log_probs_of` over token-budget micro-batches (``max_token_len``)."""
        out = torch.zeros(batch.response_mask.shape, dtype=torch.float32, device=self.device)
        for idx, mb, plan in self._token_chunks(batch.to(self.device)):
            lp = self._log_probs(mb.input_ids, mb.attention_mask, *plan, self.sampling, model=model)[0]
            if idx:
                out[idx, :lp.shape[1]] = lp
        _reshard(model or self.model)
        return out.to(batch.response_mask.device)

    def _token_chunks(self, batch: Any) -> Iterator[tuple[list[int], Any, tuple]]:
        """``(rows, trimmed micro-batch, _plan of it)`` per forward, the same count on every rank (an
        empty ``rows`` is a padding forward of row 0 that carries no loss)."""
        from asyncrl.trainer.engine import _trim, chunk_rows, even_chunks

        chunks = chunk_rows(batch, self.micro_batch_size, self.max_token_len)
        count = torch.tensor([len(chunks)], device=self.device)
        if self.world_size > 1:
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
        for idx in even_chunks(chunks, int(count)):
            mb = _trim(batch.select(idx or [0]))
            yield idx, mb, self._plan(mb.input_ids, mb.attention_mask, mb.resp_index, mb.response_mask.shape[1])

    def _by_tokens(self, batch: Any) -> bool:
        return bool(self.max_token_len) and hasattr(batch, "select")

    def compute_log_probs(self, batch: Any) -> torch.Tensor:
        """``(batch, resp_len)`` logprobs of a :class:`~asyncrl.trainer.engine.Batch` (or dict) under the policy."""
        if self._by_tokens(batch):
            return self._log_probs_by_tokens(batch)
        return self.log_probs_of(_get(batch, "input_ids"), _get(batch, "attention_mask"), _get(batch, "response_mask"),
                                 _get(batch, "resp_index"))

    def compute_ref_log_probs(self, batch: Any) -> torch.Tensor:
        """Same under the frozen reference model. Raises ``RuntimeError`` without ``with_reference``."""
        if self.ref_model is None:
            raise RuntimeError("reference model not loaded (actor_rollout_ref.actor.use_kl_loss is off)")
        if self._by_tokens(batch):
            return self._log_probs_by_tokens(batch, model=self.ref_model)
        return self.log_probs_of(_get(batch, "input_ids"), _get(batch, "attention_mask"), _get(batch, "response_mask"),
                                 _get(batch, "resp_index"), model=self.ref_model)

    # ------------------------------------------------------------------ update
    def train_step(self, batch: Any, loss_fn: LossFn, sampling: Optional[SamplingFilters] = None,
                   with_entropy: bool = False) -> dict[str, float]:
        """One optimizer step over this rank's ``batch``.

        Args:
            batch: a :class:`asyncrl.trainer.engine.Batch` or a dict with ``input_ids``,
                ``attention_mask``, ``response_mask`` (+ optional ``resp_index``) and any extra
                per-row tensors ``loss_fn`` reads.
            loss_fn: ``loss_fn(log_probs (mb, resp_len) fp32, micro_batch, scale, entropy) -> (loss,
                metrics)``; ``scale`` is the :class:`~asyncrl.trainer.losses.LossScale` of the whole
                step over all ranks and ``loss`` this micro-batch's share of the global loss
                (``agg_loss(..., scale=scale)``).
            sampling: the rollout's sampling filters (log-probs of the sampled distribution); default
                the engine's.
            with_entropy: pass the per-token entropy to ``loss_fn`` (else ``None``).

        Returns:
            Token-weighted means of ``loss_fn``'s metrics over all ranks, plus ``actor/grad_norm``,
            ``actor/lr``, ``perf/tokens`` (this rank, padded tokens through the model) and ``perf/step_s``.

        The step-wide normalisers are all-reduced once (:meth:`LossScale.of`), each micro-batch loss
        is already its share of the global loss, and it is scaled by the world size because the
        reduce-scatter averages over ranks: the gradient equals the full-batch gradient for any
        split over micro-batches and ranks, for every ``loss_agg_mode``.
        """
        t0 = time.perf_counter()
        sampling = sampling or self.sampling
        if hasattr(batch, "to"):  # a Batch: extras (old logprobs, advantages) must meet the log-probs' device
            batch = batch.to(self.device)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        ids, attn, rmask = _get(batch, "input_ids"), _get(batch, "attention_mask"), _get(batch, "response_mask")
        ri, first, verl, full = self._plan(ids, attn, _get(batch, "resp_index"), rmask.shape[1])
        rmask = rmask.to(self.device, torch.float32)

        def all_reduce(t: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(t)
            return t

        scale = LossScale.of(rmask, all_reduce)
        agg: dict[str, torch.Tensor] = {}
        n, m = _len(batch), self.micro_batch_size
        if self._by_tokens(batch):
            parts = ((idx, mb, mb.input_ids, mb.attention_mask, plan) for idx, mb, plan in self._token_chunks(batch))
        else:
            parts = ((True, _rows(batch, i, min(n, i + m)), ids[i:i + m], attn[i:i + m], (ri[i:i + m], first, verl, full))
                     for i in range(0, n, m))
        computed = 0  # padded tokens through the model: what a token budget saves
        for live, mb, mb_ids, mb_attn, plan in parts:
            computed += mb_ids.numel()
            log_probs, entropy = self._log_probs(mb_ids, mb_attn, *plan, sampling, with_entropy)
            loss, metrics = loss_fn(log_probs, mb, scale, entropy)
            (loss * (self.world_size if live else 0.0)).backward()  # a padding forward: no loss, same collectives
            # tokens: the metrics are token-weighted over all ranks below
            weight = _get(mb, "response_mask").to(self.device, torch.float32).sum() * (1.0 if live else 0.0)
            for k, v in metrics.items():
                agg[k] = agg.get(k, 0.0) + torch.as_tensor(v, device=self.device).detach().float() * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad)
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            logger.warning("non-finite grad norm %s; update skipped", grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        if self.scheduler is not None:
            self.scheduler.step()
        self.updates += 1
        keys = sorted(agg)  # every rank ran the same loss_fn: same keys
        vals = torch.stack([torch.as_tensor(agg[k], device=self.device).float() for k in keys] + [rmask.sum()])
        if self.world_size > 1:  # token-weighted over all ranks, not just this one's rows
            dist.all_reduce(vals)
        out = {k: float(v) / max(float(vals[-1]), 1.0) for k, v in zip(keys, vals[:-1])}
        out.update({"actor/grad_norm": float(grad_norm), "actor/lr": lr,
                    "perf/tokens": float(computed), "perf/step_s": time.perf_counter() - t0})
        return out

    update = train_step  # name of the CPU TrainEngine

    # ------------------------------------------------------------------ sync
    @torch.no_grad()
    def iter_params_for_sync(self, bucket_bytes: int = 1 << 30, dtype: Optional[torch.dtype] = torch.bfloat16
                             ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(hf_name, full tensor)`` for every parameter, gathering one bucket at a time.

        A collective: every rank must exhaust the iterator (non-zero ranks just drop the
        tensors). Each shard is cast to ``dtype`` (``None`` keeps fp32) before the all-gather, so
        the extra memory on a GPU is one bucket of full tensors (<= ``bucket_bytes`` plus the one
        parameter that crosses it), never a second whole model. Tied weights appear once.

        Yields:
            Tensors on this rank's device, contiguous; valid until the next bucket is gathered.
        """
        params = list(self.model.named_parameters())
        group: list[tuple[str, torch.nn.Parameter]] = []
        size = 0

        def gather(items):
            out = []
            for name, p in items:
                t = p.detach()
                t = t.to(dtype) if dtype is not None else t
                out.append((name, t.full_tensor() if hasattr(t, "full_tensor") else t))
            return out

        for name, p in params:
            nbytes = p.numel() * (torch.empty((), dtype=dtype or p.dtype).element_size())
            if group and size + nbytes > bucket_bytes:
                yield from gather(group)
                group, size = [], 0
            group.append((name, p))
            size += nbytes
        if group:
            yield from gather(group)

    def named_tensors_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        """:meth:`iter_params_for_sync` in ``sync_dtype``, 1 GiB gathers (a collective: every rank drains it)."""
        return self.iter_params_for_sync(dtype=self.sync_dtype)

    def num_params(self) -> int:
        """Total parameter count (full, not per shard)."""
        return sum(p.numel() for p in self.model.parameters())

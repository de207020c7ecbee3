"""TrainEngine: a transformers causal LM with its optimizer, for the CPU trainer (``strategy=cpu``).

Implements :class:`asyncrl.api.TrainEngine`, as does the FSDP2 engine of the GPU path
(:class:`asyncrl.trainer.fsdp_engine.FSDPEngine`): ``compute_log_probs``, ``compute_ref_log_probs``,
``update`` (one optimizer step over a mini-batch, micro-batched), ``named_tensors_for_sync``,
``state_dict`` / ``load_state_dict``. Batches come from :func:`collate`, which right-pads
prompt+response into one ``(batch, seq)`` tensor and keeps the response positions aligned in a
``(batch, resp_len)`` layout.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from asyncrl.agent_loop.base import AgentLoopOutput
from asyncrl.rollout.sampling import SamplingFilters
from asyncrl.trainer.logprobs import response_log_probs  # noqa: F401 - re-exported: callers import it from here
from asyncrl.trainer.losses import LossScale
from asyncrl.trainer.shared_prefix import PrefixPlan, policy_log_probs, prefix_plan, shares_prefix_exactly
from asyncrl.trainer.schedule import warmup_linear_decay

logger = logging.getLogger(__name__)

LossFn = Callable[[torch.Tensor, "Batch", LossScale, Optional[torch.Tensor]], tuple[torch.Tensor, dict]]
"""``loss_fn(log_probs, micro_batch, scale, entropy) -> (loss, metrics)``, see :meth:`TrainEngine.update`."""


def gradient_rows(batch: Batch) -> torch.Tensor:
    """``(batch,)`` bool: the rows whose advantage is non-zero on some model token (``extras["advantages"]``),
    i.e. the rows a PPO-clip policy loss gets a gradient from."""
    return ((batch.extras["advantages"] * batch.response_mask) != 0).any(-1)


def rows_with_gradient(batch: Batch) -> Batch:
    """``batch`` without the rows whose advantage is 0 on every response token (at least one row kept,
    so every parameter still gets its - zero - gradient and the optimizer steps as it would)."""
    keep = gradient_rows(batch).nonzero().flatten().tolist() or [0]
    return batch if len(keep) == len(batch) else batch.select(keep)


@dataclass
class Batch:
    """Training tensors for ``batch`` responses.

    Attributes:
        input_ids: ``(batch, seq)`` int64, prompt then response then pad (pad id 0, masked out).
        attention_mask: ``(batch, seq)`` int64.
        resp_index: ``(batch, resp_len)`` int64 position in ``input_ids`` of each response token.
        response_mask: ``(batch, resp_len)`` float32, 1 on model tokens (0 on tool tokens and pad).
        rollout_log_probs: ``(batch, resp_len)`` float32 logprobs from the rollout engine.
        rewards: ``(batch,)`` float32.
        group_ids: ``batch`` prompt-group ids.
        response_versions: ``(batch, resp_len)`` int64 parameter version of each response token (the
            engine's, from :attr:`AgentLoopOutput.response_versions`; -1 on pad).
        extras: per-row tensors added by the trainer (``old_log_probs``, ``advantages``,
            ``ref_log_probs``), sliced along with the batch.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    resp_index: torch.Tensor
    response_mask: torch.Tensor
    rollout_log_probs: torch.Tensor
    rewards: torch.Tensor
    group_ids: list
    response_versions: torch.Tensor
    extras: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def response_lengths(self) -> torch.Tensor:
        """``(batch,)`` int64 response tokens (model and tool tokens) of each row."""
        return (self.resp_index > 0).sum(-1)

    def to(self, device: torch.device | str) -> "Batch":
        """The same batch with every tensor (extras included) on ``device``."""
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.resp_index.to(device),
                     self.response_mask.to(device), self.rollout_log_probs.to(device), self.rewards.to(device),
                     list(self.group_ids), self.response_versions.to(device),
                     {k: v.to(device) for k, v in self.extras.items()})

    def select(self, idx: Sequence[int]) -> "Batch":
        i = torch.as_tensor(list(idx), dtype=torch.long)
        return Batch(self.input_ids[i], self.attention_mask[i], self.resp_index[i], self.response_mask[i],
                     self.rollout_log_probs[i], self.rewards[i], [self.group_ids[j] for j in idx], self.response_versions[i],
                     {k: v[i] for k, v in self.extras.items()})


def collate(outputs: Sequence[AgentLoopOutput], group_ids: Sequence, pad_id: int = 0) -> Batch:
    """Stack trajectories into a right-padded :class:`Batch` (shapes documented there)."""
    b = len(outputs)
    seq = max(len(o.prompt_ids) + len(o.response_ids) for o in outputs)
    rl = max(1, max(len(o.response_ids) for o in outputs))
    input_ids = torch.full((b, seq), pad_id, dtype=torch.long)
    attn = torch.zeros((b, seq), dtype=torch.long)
    resp_index = torch.zeros((b, rl), dtype=torch.long)
    mask = torch.zeros((b, rl))
    lps = torch.zeros((b, rl))
    versions = torch.full((b, rl), -1, dtype=torch.long)
    for i, o in enumerate(outputs):
        p, r = len(o.prompt_ids), len(o.response_ids)
        input_ids[i, :p + r] = torch.tensor(list(o.prompt_ids) + list(o.response_ids), dtype=torch.long)
        attn[i, :p + r] = 1
        resp_index[i, :r] = torch.arange(p, p + r)
        mask[i, :r] = torch.tensor(o.response_mask, dtype=torch.float32)
        lps[i, :r] = torch.tensor(o.response_logprobs, dtype=torch.float32)
        versions[i, :r] = torch.tensor(o.response_versions, dtype=torch.long)
    rewards = torch.tensor([float(o.reward_score or 0.0) for o in outputs])
    return Batch(input_ids, attn, resp_index, mask, lps, rewards, list(group_ids), versions)


def micro_batches(batch: Batch, micro_batch_size: int, max_token_len: Optional[int] = None) -> list[tuple[list[int], Batch]]:
    """Split ``batch`` for gradient accumulation; every chunk is cut to its own longest row.

    Fixed size (``max_token_len=None``): ``micro_batch_size`` rows in order. Dynamic (verl's
    ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu``): rows sorted by length and packed while
    ``rows x longest <= max_token_len`` (one row at least), so a long-tail batch is not padded to its
    longest response. Either way the padding columns no row of the chunk uses are dropped, which
    changes no result (they are masked) and saves their compute.

    Returns:
        ``[(row indices into batch, chunk)]`` covering every row once.
    """
    return [(idx, _trim(batch.select(idx))) for idx in chunk_rows(batch, micro_batch_size, max_token_len)]


def chunk_rows(batch: Batch, micro_batch_size: int, max_token_len: Optional[int] = None) -> list[list[int]]:
    """The row indices of each micro-batch of :func:`micro_batches` (fixed size, or packed by token budget)."""
    n = len(batch)
    if not max_token_len:
        return [list(range(i, min(n, i + micro_batch_size))) for i in range(0, n, micro_batch_size)]
    return pack_by_token_budget(batch.attention_mask.sum(-1).tolist(), max_token_len)


def pack_by_token_budget(lengths: list[float], max_token_len: float) -> list[list[int]]:
    """verl's ``use_dynamic_bsz`` packing: indices sorted by length, a chunk closed when one more row would
    make ``rows x longest`` exceed ``max_token_len`` (one row at least per chunk). Used by the trainer's
    engines and priced the same way by the simulator (``asyncrl.sim.cost_models.TrainCostModel``)."""
    chunks, cur = [], []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if cur and (len(cur) + 1) * lengths[i] > max_token_len:
            chunks.append(cur)
            cur = []
        cur.append(i)
    return chunks + [cur] if cur else chunks


def even_chunks(chunks: list[list[int]], count: int) -> list[list[int]]:
    """``chunks`` split until there are ``count`` of them (the one with most rows halved each time), then
    padded with empty chunks. FSDP ranks must run the same number of forwards (each is a collective), and
    token-budget packing gives each rank its own count: every rank evens out to the largest.

    Raises:
        ValueError: ``count`` below ``len(chunks)``.
    """
    if count < len(chunks):
        raise ValueError(f"cannot even {len(chunks)} micro-batches out to {count}")
    out = [list(c) for c in chunks]
    while len(out) < count:
        big = max(range(len(out)), key=lambda i: len(out[i])) if out else None
        if big is None or len(out[big]) < 2:
            out.append([])  # an empty micro-batch: the caller runs a forward with no loss
            continue
        half = len(out[big]) // 2
        out[big:big + 1] = [out[big][:half], out[big][half:]]
    return out


def _trim(mb: Batch) -> Batch:
    """Drop the padding columns beyond the chunk's longest sequence / response."""
    seq = int(mb.attention_mask.sum(-1).max())
    full_resp = mb.resp_index.shape[1]
    resp = max(1, int((mb.resp_index > 0).sum(-1).max()))
    if seq == mb.input_ids.shape[1] and resp == full_resp:
        return mb
    extras = {k: (v[:, :resp] if v.dim() == 2 and v.shape[1] == full_resp else v) for k, v in mb.extras.items()}
    return Batch(mb.input_ids[:, :seq], mb.attention_mask[:, :seq], mb.resp_index[:, :resp], mb.response_mask[:, :resp],
                 mb.rollout_log_probs[:, :resp], mb.rewards, mb.group_ids, mb.response_versions[:, :resp], extras)


class TrainEngine:
    """A HF causal LM + AdamW + warm-up/linear-decay schedule on one device.

    Args:
        model_path: HF model directory.
        lr, warmup, total_updates, weight_decay, betas, clip_grad: optimizer settings
            (``actor_rollout_ref.actor.optim.*``).
        dtype: ``float32`` | ``bfloat16``.
        micro_batch_size: sequences per forward/backward chunk.
        max_token_len: dynamic micro-batches of at most this many (padded) tokens instead
            (``actor.use_dynamic_bsz`` / ``ppo_max_token_len_per_gpu``); see :func:`micro_batches`.
        with_reference: keep a frozen copy for the KL penalty.
        sampling: the rollout's sampling filters; every log-prob is computed under them so it is
            of the distribution the rollout sampled from (vLLM ``processed_logprobs``).
        skip_zero_advantage: leave rows whose advantage is 0 on every token out of the forward and
            backward of :meth:`update`. Exact only when the loss is advantage times a function of the
            ratio (the PPO-clip policy loss without KL loss or entropy bonus): such rows add exactly zero
            gradient, and the step's normalisers (:class:`LossScale`) still count them. GRPO groups whose
            responses all scored the same are such rows. Metrics then count the skipped rows as zero.
        use_prefix_grouper: run each prompt group's shared prefix once per micro-batch and its rows'
            suffixes against its KV cache (``actor.use_prefix_grouper``, :mod:`asyncrl.trainer.shared_prefix`):
            the same log-probs and gradients in fewer tokens.
    """

    metric_prefix = "actor"

    def __init__(self, model_path: str, lr: float, warmup: int, total_updates: int, weight_decay: float = 0.0,
                 betas: tuple = (0.9, 0.999), clip_grad: float = 1.0, dtype: str = "float32",
                 micro_batch_size: int = 64, with_reference: bool = False, seed: int = 0,
                 sampling: Optional[SamplingFilters] = None, max_token_len: Optional[int] = None,
                 skip_zero_advantage: bool = False, use_prefix_grouper: bool = False):
        torch.manual_seed(seed)
        self.use_prefix_grouper = use_prefix_grouper
        self.skip_zero_advantage = skip_zero_advantage
        self.dtype = getattr(torch, dtype)
        self.model = self._load(model_path)
        self.model.train()
        self.ref_model = None
        if with_reference:
            self.ref_model = self._load(model_path).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=tuple(betas), weight_decay=weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_linear_decay(warmup, total_updates))
        self.clip_grad = clip_grad
        self.micro_batch_size = micro_batch_size
        self.max_token_len = max_token_len
        self.sampling = sampling
        self.updates = 0

    def _load(self, model_path: str) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype)

    def _prefix_plan(self, mb: Batch) -> Optional[PrefixPlan]:
        """The micro-batch's :class:`~asyncrl.trainer.shared_prefix.PrefixPlan` with ``use_prefix_grouper``
        (``None``: the plain forward)."""
        if not self.use_prefix_grouper:
            return None
        if not shares_prefix_exactly(self.model):
            logger.warning("use_prefix_grouper: this model's rope depends on the sequence length; the plain forward runs")
            self.use_prefix_grouper = False
            return None
        return prefix_plan(mb.input_ids, mb.attention_mask, mb.resp_index, mb.group_ids)

    def _forward(self, mb: Batch, with_entropy: bool,
                 plan: Optional[PrefixPlan] = None) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """What ``loss_fn`` receives: ``(log_probs, entropy)`` of the micro-batch (the critic: values)."""
        return policy_log_probs(self.model, mb, self.sampling, with_entropy, plan)

    def _chunks(self, batch: Batch) -> Iterator[Batch]:
        """Micro-batches for gradient accumulation (fixed size or by token budget, trimmed of padding)."""
        for _, mb in micro_batches(batch, self.micro_batch_size, self.max_token_len):
            yield mb

    def _gather(self, batch: Batch, fn: Callable[[Batch], torch.Tensor]) -> torch.Tensor:
        """``fn`` per micro-batch, reassembled into ``(batch, resp_len)`` in the batch's row order."""
        out = torch.zeros(batch.response_mask.shape, device=batch.response_mask.device)
        for idx, mb in micro_batches(batch, self.micro_batch_size, self.max_token_len):
            val = fn(mb)
            out[idx, :val.shape[1]] = val.float()
        return out

    @torch.no_grad()
    def compute_log_probs(self, batch: Batch) -> torch.Tensor:
        """``(batch, resp_len)`` log-probs under the current weights (recomputed old log-probs)."""
        self.model.eval()
        try:
            return self._gather(batch, lambda mb: policy_log_probs(self.model, mb, self.sampling,
                                                                   plan=self._prefix_plan(mb))[0])
        finally:
            self.model.train()

    @torch.no_grad()
    def compute_ref_log_probs(self, batch: Batch) -> torch.Tensor:
        """``(batch, resp_len)`` log-probs under the frozen reference model."""
        if self.ref_model is None:
            raise RuntimeError("reference model not loaded (TrainEngine(with_reference=True))")
        return self._gather(batch, lambda mb: policy_log_probs(self.ref_model, mb, self.sampling,
                                                               plan=self._prefix_plan(mb))[0])

    def update(self, batch: Batch, loss_fn: LossFn, with_entropy: bool = False) -> dict:
        """One optimizer step on ``batch`` (one mini-batch), micro-batched.

        Args:
            batch: the mini-batch.
            loss_fn: ``loss_fn(log_probs, micro_batch, scale, entropy) -> (loss, metrics)`` where
                ``scale`` is the mini-batch's :class:`~asyncrl.trainer.losses.LossScale` and ``loss``
                this micro-batch's share of the mini-batch loss (``agg_loss(..., scale=scale)``),
                so the gradients add up to the full-batch gradient for any micro-batch size.
            with_entropy: pass the per-token entropy (else ``None``).

        Returns:
            ``loss_fn``'s metrics averaged with token weights, plus ``actor/grad_norm``, ``actor/lr`` and
            ``actor/trained_rows_frac`` (the rows that went through forward and backward over the mini-batch's
            rows: at most 1 with ``skip_zero_advantage``, where a mini-batch without a row with a gradient still
            trains one) (``critic/...`` for the critic), and, as the FSDP2 engine, ``perf/tokens`` (tokens through
            the model: each micro-batch's rows x its longest row, padding included, which is what
            ``asyncrl.sim.calibrate.priced_tokens`` prices with ``use_dynamic_bsz``; with fixed micro-batches it
            counts real tokens; with ``use_prefix_grouper`` the prefix and suffix passes' tokens) and ``perf/step_s`` (seconds of this update).
        """
        t0 = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        scale = LossScale.of(batch.response_mask)
        rows = len(batch)
        if self.skip_zero_advantage and "advantages" in batch.extras:
            batch = rows_with_gradient(batch)
        agg: dict[str, float] = {f"{self.metric_prefix}/trained_rows_frac": len(batch) / max(1, rows)}
        computed = 0
        for mb in self._chunks(batch):
            plan = self._prefix_plan(mb)
            computed += plan.tokens if plan is not None else mb.input_ids.numel()
            weight = float(mb.response_mask.sum()) / max(scale.tokens, 1.0)
            out, entropy = self._forward(mb, with_entropy, plan)
            loss, metrics = loss_fn(out, mb, scale, entropy)
            loss.backward()
            for k, v in metrics.items():
                agg[k] = agg.get(k, 0.0) + float(v) * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            logger.warning("non-finite grad norm %s; update skipped", grad_norm)
        agg[f"{self.metric_prefix}/lr"] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        self.updates += 1
        agg[f"{self.metric_prefix}/grad_norm"] = float(grad_norm)
        agg.update({"perf/tokens": float(computed), "perf/step_s": time.perf_counter() - t0})
        return agg

    def named_tensors_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, tensor)`` for every parameter the inference engine needs (tied weights once)."""
        for name, p in self.model.named_parameters():
            yield name, p.detach()

    def state_dict(self) -> dict[str, Any]:
        """``{"model", "optimizer", "scheduler", "updates"}`` (references, not copies: save it at once)."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (same model architecture and optimizer settings)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates = int(state["updates"])

    def save_checkpoint(self, actor_dir: str, source_model_dir: str | None = None) -> None:
        """HF weights (+ the source dir's tokenizer), optimizer, LR schedule and RNG under ``actor_dir``
        (layout: :mod:`asyncrl.checkpoint.engine_io`)."""
        from asyncrl.checkpoint.engine_io import save_engine

        save_engine(self, actor_dir, source_model_dir)

    def load_checkpoint(self, actor_dir: str, load_weights: bool = True) -> None:
        """Restore what :meth:`save_checkpoint` wrote; ``load_weights=False`` when the engine was
        already built from ``actor_dir/huggingface``."""
        from asyncrl.checkpoint.engine_io import load_engine

        load_engine(self, actor_dir, load_weights)

"""TrainEngine: a transformers causal LM with its optimizer, for the CPU / single-device trainer.

Small interface (shared in spirit with the FSDP engine of the GPU path): ``compute_log_probs``,
``update`` (one optimizer step over a mini-batch, micro-batched), ``named_tensors_for_sync``.
Batches come from :func:`collate`, which right-pads prompt+response into one ``(batch, seq)``
tensor and keeps the response positions aligned in a ``(batch, resp_len)`` layout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from asyncrl.agent_loop.base import AgentLoopOutput

logger = logging.getLogger(__name__)


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
        token_versions: ``(batch, resp_len)`` int64 parameter version of each token (-1 on pad).
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
    token_versions: torch.Tensor
    extras: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, idx: Sequence[int]) -> "Batch":
        i = torch.as_tensor(list(idx), dtype=torch.long)
        return Batch(self.input_ids[i], self.attention_mask[i], self.resp_index[i], self.response_mask[i],
                     self.rollout_log_probs[i], self.rewards[i], [self.group_ids[j] for j in idx], self.token_versions[i],
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
        v = o.extra_fields.get("response_param_versions")
        if v is not None and len(v) == r:
            versions[i, :r] = torch.tensor(v, dtype=torch.long)
    rewards = torch.tensor([float(o.reward_score or 0.0) for o in outputs])
    return Batch(input_ids, attn, resp_index, mask, lps, rewards, list(group_ids), versions)


def response_log_probs(model: torch.nn.Module, batch: Batch, temperature: float = 1.0) -> torch.Tensor:
    """Logprob of each response token under ``model``: ``(batch, resp_len)`` float32 (0 on pad)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = F.log_softmax(logits[:, :-1], dim=-1)  # position t predicts token t+1
    targets = batch.input_ids[:, 1:]
    tok_lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (batch, seq-1)
    pred_pos = (batch.resp_index - 1).clamp(min=0)
    out = tok_lp.gather(1, pred_pos)
    valid = (batch.resp_index > 0).float()
    return out * valid


class TrainEngine:
    """A HF causal LM + AdamW + warm-up/linear-decay schedule on one device.

    Args:
        model_path: HF model directory.
        lr, warmup, total_updates, weight_decay, betas, clip_grad: optimizer settings
            (``actor_rollout_ref.actor.optim.*``).
        dtype: ``float32`` | ``bfloat16``.
        micro_batch_size: sequences per forward/backward chunk.
        with_reference: keep a frozen copy for the KL penalty.
        temperature: rollout sampling temperature; logits are divided by it so the recomputed
            logprobs match the sampling distribution (vLLM ``processed_logprobs``).
    """

    def __init__(self, model_path: str, lr: float, warmup: int, total_updates: int, weight_decay: float = 0.0,
                 betas: tuple = (0.9, 0.999), clip_grad: float = 1.0, dtype: str = "float32",
                 micro_batch_size: int = 64, with_reference: bool = False, seed: int = 0,
                 temperature: float = 1.0):
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        self.dtype = getattr(torch, dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype)
        self.model.train()
        self.ref_model = None
        if with_reference:
            self.ref_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype).eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=tuple(betas), weight_decay=weight_decay)
        total = max(total_updates, warmup + 1)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / max(1, warmup)
            return max(0.0, (total - step) / max(1, total - warmup))

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.clip_grad = clip_grad
        self.micro_batch_size = micro_batch_size
        self.temperature = temperature if temperature > 0 else 1.0
        self.updates = 0

    @torch.no_grad()
    def compute_ref_log_probs(self, batch: Batch) -> torch.Tensor:
        """``(batch, resp_len)`` logprobs under the frozen reference model."""
        assert self.ref_model is not None, "reference model not loaded (use_kl_loss is off)"
        return torch.cat([response_log_probs(self.ref_model, batch.select(range(i, min(len(batch), i + self.micro_batch_size))),
                                             self.temperature)
                          for i in range(0, len(batch), self.micro_batch_size)])

    def update(self, batch: Batch, loss_fn: Callable[[torch.Tensor, Batch], tuple[torch.Tensor, dict]]) -> dict:
        """One optimizer step on ``batch``; ``loss_fn(log_probs, micro_batch) -> (loss, metrics)``.

        Micro-batches are weighted by their share of mask-1 tokens so the result equals a
        full-batch token-mean loss. Returns averaged metrics plus ``actor/grad_norm`` and ``actor/lr``.
        """
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total_tokens = float(batch.response_mask.sum().clamp(min=1.0))
        agg: dict[str, float] = {}
        for i in range(0, len(batch), self.micro_batch_size):
            mb = batch.select(range(i, min(len(batch), i + self.micro_batch_size)))
            weight = float(mb.response_mask.sum()) / total_tokens
            log_probs = response_log_probs(self.model, mb, self.temperature)
            loss, metrics = loss_fn(log_probs, mb)
            (loss * weight).backward()
            for k, v in metrics.items():
                agg[k] = agg.get(k, 0.0) + float(v) * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad)
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            logger.warning("non-finite grad norm %s; update skipped", grad_norm)
        agg["actor/lr"] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        self.updates += 1
        agg["actor/grad_norm"] = float(grad_norm)
        return agg

    def named_tensors_for_sync(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, tensor)`` for every parameter the inference engine needs (tied weights once)."""
        for name, p in self.model.named_parameters():
            yield name, p.detach()

"""Response-token log-probs from one forward, shared by the CPU :class:`~asyncrl.trainer.engine.TrainEngine`
and the FSDP2 :class:`~asyncrl.trainer.fsdp_engine.FSDPEngine`.

Both engines read a batch the same way (:func:`forward_plan`, one host sync per batch) and compute logits
only from the first position that predicts a response token on (transformers' ``logits_to_keep``): the
prompt's logits are never used, and on short-response batches they are most of the ``(b, seq, vocab)``
tensor (the embedded arith demo: 33 prompt tokens against ~18 response tokens). Right-padded rows (real
tokens, then only pads: what :func:`~asyncrl.trainer.engine.collate` builds) need no attention mask: no real
token can attend to a later pad, so the model runs causal-only and the attention takes its unmasked path.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from asyncrl.rollout.sampling import SamplingFilters, filtered_entropy, token_log_probs

TokenLogProbs = Callable[[torch.Tensor, torch.Tensor, Optional[SamplingFilters]], torch.Tensor]


@dataclass(frozen=True)
class ForwardPlan:
    """What one forward needs to know about a batch (read once per batch).

    Attributes:
        first: the first column whose logits predict a response token (``min(resp_index) - 1``, >= 0).
        verl: every row's response starts at ``first + 1`` and is contiguous (verl's left-padded layout):
            the log-probs are a plain slice of the kept logits.
        causal_only: no row has padding before a real token, so the causal mask alone is exact.
    """

    first: int
    verl: bool
    causal_only: bool


def forward_plan(input_ids: torch.Tensor, attention_mask: torch.Tensor, resp_index: torch.Tensor) -> ForwardPlan:
    """:class:`ForwardPlan` of ``(batch, seq)`` ``input_ids`` / ``attention_mask`` and ``(batch, resp_len)``
    ``resp_index`` (column of each response token, 0 = padding), on any device (one host sync)."""
    seq, r = input_ids.shape[1], resp_index.shape[1]
    first = torch.where(resp_index > 0, resp_index, seq).min() - 1
    verl = (resp_index == torch.arange(r, device=resp_index.device) + first + 1).all()
    m = attention_mask.to(resp_index.device).bool()
    causal_only = (m[:, 1:] <= m[:, :-1]).all()  # every row: real tokens, then only pads
    facts = torch.stack([first, verl.long(), causal_only.long()]).tolist()
    return ForwardPlan(max(0, min(int(facts[0]), seq - 1)), bool(facts[1]), bool(facts[2]))


def accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` takes transformers' ``logits_to_keep`` (causal LMs since transformers 4.50)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def kept_log_probs(logits: torch.Tensor, input_ids: torch.Tensor, resp_index: torch.Tensor, plan: ForwardPlan,
                   sampling: Optional[SamplingFilters] = None, with_entropy: bool = False,
                   token_lp: TokenLogProbs = token_log_probs) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-prob (and entropy) of each response token from logits kept from ``plan.first`` on.

    Args:
        logits: ``(batch, seq - first, vocab)``; ``logits[:, t]`` predicts the token at column ``first + t + 1``.
        input_ids: ``(batch, seq)``.
        resp_index: ``(batch, resp_len)`` column of each response token, 0 = padding.
        plan: :func:`forward_plan` of the batch.
        sampling: the rollout's filters (:mod:`asyncrl.rollout.sampling`); ``None`` = plain softmax.
        with_entropy: also the filtered entropy at each response position.
        token_lp: the log-prob kernel (the FSDP engine passes a compiled one).

    Returns:
        ``(log_probs, entropy)``, each ``(batch, resp_len)`` float32, 0 on padding; ``entropy`` ``None``
        unless asked.
    """
    valid = resp_index > 0
    if plan.verl:
        sel = logits[:, :resp_index.shape[1]]  # a view, no copy of the (b, r, vocab) logits
        lp = token_lp(sel, input_ids.gather(1, resp_index), sampling)
        ent = filtered_entropy(sel, sampling) if with_entropy else None
    else:  # rows' responses start at different columns: log-probs at every kept position (a view of the
        # logits), then each row's response positions: no (b, r, vocab) gather copy and its index_put backward
        seq = input_ids.shape[1]
        nxt = input_ids[:, min(plan.first + 1, seq - 1):]  # the token each kept position predicts
        slab = logits[:, :nxt.shape[1]]
        pred = (resp_index - 1 - plan.first).clamp(min=0, max=nxt.shape[1] - 1)
        lp = token_lp(slab, nxt, sampling).gather(1, pred)
        ent = filtered_entropy(slab, sampling).gather(1, pred) if with_entropy else None
    ent = ent * valid if ent is not None else None
    return torch.where(valid, lp, torch.zeros_like(lp)), ent


def response_log_probs(model: torch.nn.Module, batch, sampling: Optional[SamplingFilters] = None,
                       with_entropy: bool = False) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-prob (and entropy) of each response token under ``model`` and the rollout's filters.

    One forward with logits only from the first predicting position on (``logits_to_keep``, when the
    model takes it) and, for right-padded rows, no attention mask (see the module docstring); rows with
    padding before a real token get the mask and position ids that skip the pads.

    Args:
        model: a transformers causal LM.
        batch: a :class:`~asyncrl.trainer.engine.Batch` (``input_ids``, ``attention_mask``, ``resp_index``).
        sampling: the rollout's temperature / top-k / top-p / min-p (:mod:`asyncrl.rollout.sampling`),
            so the result is a log-prob of the distribution the rollout sampled from.
        with_entropy: also return the entropy of that distribution at each response position.

    Returns:
        ``(log_probs, entropy)``, each ``(batch, resp_len)`` float32, 0 on pad; ``entropy`` is
        ``None`` unless requested. A token outside the filtered support gets
        :data:`~asyncrl.rollout.sampling.LOGP_FLOOR`.
    """
    plan = forward_plan(batch.input_ids, batch.attention_mask, batch.resp_index)
    kw = {} if plan.causal_only else {  # padding before a real token: the mask, and positions that skip the pads
        "attention_mask": batch.attention_mask, "position_ids": (batch.attention_mask.long().cumsum(-1) - 1).clamp(min=0)}
    if accepts_logits_to_keep(model):
        kw["logits_to_keep"] = batch.input_ids.shape[1] - plan.first
        logits = model(input_ids=batch.input_ids, use_cache=False, **kw).logits
    else:
        logits = model(input_ids=batch.input_ids, use_cache=False, **kw).logits[:, plan.first:]
    return kept_log_probs(logits, batch.input_ids, batch.resp_index, plan, sampling, with_entropy)

"""Response log-probs with each prompt group's shared prefix run once (``actor.use_prefix_grouper``).

GRPO samples ``n`` responses per prompt, and a plain forward runs the prompt ``n`` times, once in every row.
Here each group's shared prefix (its prompt, or the longest prefix all its rows share, up to the token
before the first response token) runs once, with the KV cache on; the cache is then expanded to the
group's rows and only the rows' suffixes run against it. Gradients flow back through the expanded cache
into the prefix (the expansion is an index, whose backward sums the rows' gradients), so the log-probs
and their gradients are the plain forward's up to float rounding. verl names the same saving
``actor_rollout_ref.actor.use_prefix_grouper`` (there through the PrefixGrouper package and a patched
attention; here through transformers' own ``past_key_values``: any causal LM that takes them).

Cost: the linear layers run ``G x prefix + B x suffix`` tokens instead of ``B x (prefix + suffix)``
(the embedded arith demo: 33-token prompts, ~18-token responses, n = 8: ~2.1x fewer); attention is as
before. Rows are grouped by :attr:`~asyncrl.trainer.engine.Batch.group_ids` within the micro-batch, so a
group split over two micro-batches runs its prefix in each. A batch where no two rows share a group falls
back to the plain forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from asyncrl.rollout.sampling import SamplingFilters, filtered_entropy, token_log_probs
from asyncrl.trainer.logprobs import TokenLogProbs, accepts_logits_to_keep, response_log_probs


MAX_TOKEN_RATIO = 0.75
"""The plan runs only when its tokens are at most this share of the plain forward's: each pass pads to its own
widest row, and the two calls cost more per token than one (a tester's timings: 0.97 of the tokens took 1.06-1.22
of the time, 0.89 took 1.05-1.11, 0.53 took 0.74; the arith demo's 0.47 took 0.49)."""

LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
"""Rope types whose frequencies transformers picks per call from the longest position (``dynamic_rope_update``):
the prefix pass alone would see a shorter sequence than the plain forward, so such models run the plain forward."""


def shares_prefix_exactly(model: torch.nn.Module) -> bool:
    """Whether :func:`shared_prefix_log_probs` gives ``model`` the plain forward's values: not with a
    :data:`LENGTH_DEPENDENT_ROPE` (Phi-3's ``longrope``, dynamic NTK)."""
    cfg = getattr(model, "config", None)
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if "rope_type" in rope or "type" in rope:
        rope = {"": rope}  # else one entry per layer type (Gemma 3: full / sliding attention)
    kinds = [str(v.get("rope_type", v.get("type", ""))) for v in rope.values() if isinstance(v, dict)]
    return not any(d in k for k in kinds for d in LENGTH_DEPENDENT_ROPE)


def uses_prefix_grouper(cfg: Any) -> bool:
    """Whether an experiment config (:class:`asyncrl.config.ExperimentConfig`) asks the trainer's engine for
    this module (``actor_rollout_ref.actor.use_prefix_grouper``; null = on with ``strategy=cpu``, the engine that
    has it). The engine still runs the plain forward where it would not be exact or not save
    (:func:`shares_prefix_exactly`, :func:`prefix_plan`).

    Not in the fsdp2 engine: its two forwards before one backward free each layer's gathered parameters after
    the first backward reaches them (tried in session 38: kept gathered, the layers' gradients went missing)."""
    actor = cfg.actor_rollout_ref.actor
    return actor.use_prefix_grouper if actor.use_prefix_grouper is not None else actor.strategy == "cpu"


@dataclass(frozen=True)
class PrefixPlan:
    """How a batch splits into shared prefixes and per-row suffixes.

    Attributes:
        leaders: ``(groups,)`` one row of each group (its first).
        row_group: ``(batch,)`` the group index of each row.
        prefix_len: ``(groups,)`` tokens of each group's shared prefix (>= 1).
        row_prefix: ``(batch,)`` ``prefix_len`` of each row's group.
        width: the longest prefix (the prefix pass's columns, left-padded).
        suffix_width: the longest suffix (the suffix pass's columns, right-padded).
    """

    leaders: torch.Tensor
    row_group: torch.Tensor
    prefix_len: torch.Tensor
    row_prefix: torch.Tensor
    width: int
    suffix_width: int

    @property
    def tokens(self) -> int:
        """Tokens through the model: the prefix pass's ``groups x width`` plus the suffix pass's
        ``batch x suffix_width`` (padding included), against a plain forward's ``batch x seq``."""
        return int(self.leaders.shape[0] * self.width + self.row_group.shape[0] * self.suffix_width)


def prefix_plan(input_ids: torch.Tensor, attention_mask: torch.Tensor, resp_index: torch.Tensor,
                group_ids: list) -> Optional[PrefixPlan]:
    """:class:`PrefixPlan` of a right-padded batch (``(batch, seq)`` ids / mask, ``(batch, resp_len)``
    ``resp_index``, ``batch`` group ids), or ``None`` for the plain forward: sharing saves too little (no group
    has two rows, some group's rows share no token before their first response token's predecessor, or the
    plan's tokens exceed :data:`MAX_TOKEN_RATIO` of the plain forward's), or a row has padding before a real
    token (only right-padded rows keep their positions in the suffix pass).

    A group's prefix is the longest run of tokens every one of its rows starts with, cut one token before the
    group's earliest response token (whose predecessor's logits the suffix pass must produce)."""
    b = input_ids.shape[0]
    order: dict = {}
    row_group_list = [order.setdefault(g, len(order)) for g in group_ids]
    if len(order) == b:
        return None
    dev = input_ids.device
    row_group = torch.tensor(row_group_list, dtype=torch.long, device=dev)
    leaders = torch.zeros(len(order), dtype=torch.long, device=dev).scatter_reduce(
        0, row_group, torch.arange(b, device=dev), "amin", include_self=False)
    lengths = attention_mask.sum(-1)
    first = torch.where(resp_index[:, 0] > 0, resp_index[:, 0], lengths)  # a row without response: its length
    same = (input_ids == input_ids[leaders[row_group]]) & attention_mask.bool()
    common = same.long().cumprod(-1).sum(-1)  # tokens this row shares with its group's leader from the start
    per_row = torch.minimum(common, first - 1)
    prefix_len = torch.full((len(order),), input_ids.shape[1], dtype=torch.long, device=dev).scatter_reduce(
        0, row_group, per_row, "amin")
    m = attention_mask.bool()
    right_padded = (m[:, 1:] <= m[:, :-1]).all()  # real tokens, then only pads (what collate builds)
    facts = torch.stack([prefix_len.min(), prefix_len.max(), (lengths - prefix_len[row_group]).max(),
                         right_padded.long()]).tolist()
    if facts[0] < 1 or not facts[3]:
        return None
    plan = PrefixPlan(leaders, row_group, prefix_len, prefix_len[row_group], int(facts[1]), int(facts[2]))
    # both passes pad to their widest row and add a little per-call work: worth it only with a clear saving
    return plan if plan.tokens <= MAX_TOKEN_RATIO * input_ids.numel() else None


def shared_prefix_log_probs(model: torch.nn.Module, batch, plan: PrefixPlan, sampling: Optional[SamplingFilters] = None,
                            with_entropy: bool = False, token_lp: TokenLogProbs = token_log_probs
                            ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Log-prob (and entropy) of each response token, each group's prefix run once (module docstring).

    Args:
        model: a transformers causal LM that takes ``past_key_values`` (and returns them with ``use_cache``).
        batch: a right-padded :class:`~asyncrl.trainer.engine.Batch`.
        plan: :func:`prefix_plan` of the batch.
        sampling, with_entropy, token_lp: as :func:`asyncrl.trainer.logprobs.kept_log_probs`.

    Returns:
        ``(log_probs, entropy)``, each ``(batch, resp_len)`` float32, 0 on padding (``entropy`` ``None``
        unless asked): the plain forward's values up to float rounding.

    Raises:
        RuntimeError: the model returned no KV cache (gradient checkpointing in training turns it off).
    """
    ids, mask, resp_index = batch.input_ids, batch.attention_mask, batch.resp_index
    dev, g, w, s = ids.device, plan.leaders.shape[0], plan.width, plan.suffix_width
    cols = torch.arange(w, device=dev)
    # the prefix pass: one left-padded row per group
    pre_mask = cols >= (w - plan.prefix_len)[:, None]  # (groups, width)
    src = (cols - (w - plan.prefix_len)[:, None]).clamp(min=0)
    pre_ids = torch.where(pre_mask, ids[plan.leaders].gather(1, src), torch.zeros_like(src))
    pre_pos = (pre_mask.long().cumsum(-1) - 1).clamp(min=0)
    kw = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}
    out = model(input_ids=pre_ids, attention_mask=pre_mask.long(), position_ids=pre_pos, use_cache=True, **kw)
    cache = out.past_key_values
    if cache is None:
        raise RuntimeError("use_prefix_grouper needs the model's KV cache, which it did not return "
                           "(gradient checkpointing turns it off in training: disable one of them)")
    cache.batch_select_indices(plan.row_group)  # each row gets its group's keys and values (an index: autograd sums back)
    # the suffix pass: each row from its prefix's end on, right-padded
    scol = torch.arange(s, device=dev)
    at = (plan.row_prefix[:, None] + scol).clamp(max=ids.shape[1] - 1)
    suf_mask = mask.gather(1, at).bool() & (plan.row_prefix[:, None] + scol < ids.shape[1])
    suf_ids = torch.where(suf_mask, ids.gather(1, at), torch.zeros_like(at))
    full_mask = torch.cat([pre_mask[plan.row_group], suf_mask], dim=1).long()
    # pad columns get position 0: past the row's end they could pass a learned position table's size
    pos = torch.where(suf_mask, plan.row_prefix[:, None] + scol, torch.zeros_like(scol))
    logits = model(input_ids=suf_ids, attention_mask=full_mask, position_ids=pos,
                   past_key_values=cache, use_cache=True).logits  # (batch, suffix, vocab)
    # logits[:, t] predicts the token at column row_prefix + t + 1
    nxt = torch.cat([suf_ids[:, 1:], torch.zeros_like(suf_ids[:, :1])], dim=1)
    valid = resp_index > 0
    pred = (resp_index - 1 - plan.row_prefix[:, None]).clamp(min=0, max=s - 1)
    lp = token_lp(logits, nxt, sampling).gather(1, pred)
    ent = filtered_entropy(logits, sampling).gather(1, pred) * valid if with_entropy else None
    return torch.where(valid, lp, torch.zeros_like(lp)), ent


def policy_log_probs(model: torch.nn.Module, batch, sampling: Optional[SamplingFilters] = None,
                     with_entropy: bool = False, plan: Optional[PrefixPlan] = None
                     ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """:func:`shared_prefix_log_probs` under ``plan``, or the plain
    :func:`~asyncrl.trainer.logprobs.response_log_probs` without one (same shapes and values)."""
    if plan is None:
        return response_log_probs(model, batch, sampling, with_entropy)
    return shared_prefix_log_probs(model, batch, plan, sampling, with_entropy)

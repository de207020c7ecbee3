"""The trainer's pass priced with ``actor.use_prefix_grouper`` (:mod:`asyncrl.trainer.shared_prefix`).

::

    TrainCostModel.pass_time(lengths, groups, prompts), shared_prefix on, one rank
      -> micro_batches(cost, lengths)        the engine's chunks: token-budget packed, fixed rows, or one
      -> chunk_plan(chunk)                    prefix_plan's decision from lengths alone (None: the plain forward)
      -> planned: the prefix pass + the suffix pass;  else: the chunk's plain price

The real engine decides per micro-batch from the token ids (:func:`~asyncrl.trainer.shared_prefix.prefix_plan`);
the simulator has lengths only, so a group's prefix is its rows' shortest prompt less one token (a group's rows
share their prompt: the token before the first response token must run in the suffix pass, whose logits
predict it), and the same :data:`~asyncrl.trainer.shared_prefix.MAX_TOKEN_RATIO` rule picks the plan.

Nothing here imports :mod:`asyncrl.sim.cost_models` (which calls it): the cost model comes in as an argument with
its ``work`` / ``suffix_work`` prices and its micro-batch fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence


@dataclass(frozen=True)
class ChunkPlan:
    """How one micro-batch splits (lengths in real tokens, prompt + response).

    Attributes:
        group_prefix: tokens of each group's shared prefix (>= 1), in order of first appearance.
        row_prefix: the prefix of each row's group, one per row of the chunk.
        width: the longest prefix (the prefix pass's padded width).
        suffix_width: the longest ``length - prefix`` (the suffix pass's padded width).
    """

    group_prefix: tuple
    row_prefix: tuple
    width: float
    suffix_width: float

    @property
    def tokens(self) -> float:
        """Tokens through the model, padding included: ``groups x width + rows x suffix_width``
        (:attr:`asyncrl.trainer.shared_prefix.PrefixPlan.tokens`)."""
        return len(self.group_prefix) * self.width + len(self.row_prefix) * self.suffix_width


def chunk_plan(lengths: Sequence[float], groups: Sequence, prompts: Sequence[float],
               plain_width: Optional[float] = None) -> Optional[ChunkPlan]:
    """The :class:`ChunkPlan` the engine would run one micro-batch with, or ``None`` for its plain forward.

    Args:
        lengths: ``(rows,)`` real tokens of each row (prompt + response).
        groups: ``(rows,)`` prompt-group ids (:attr:`asyncrl.trainer.engine.Batch.group_ids`).
        prompts: ``(rows,)`` prompt tokens of each row.
        plain_width: the width the plain forward pads the chunk to (default: its longest row).

    Returns:
        ``None`` as :func:`~asyncrl.trainer.shared_prefix.prefix_plan` returns it: no group with two rows, a group
        whose prefix (shortest ``min(prompt, length)`` of its rows, less one) is under one token, or plan tokens
        above ``MAX_TOKEN_RATIO x rows x plain_width``.
    """
    from asyncrl.trainer.shared_prefix import MAX_TOKEN_RATIO

    order: dict = {}
    row_group = [order.setdefault(g, len(order)) for g in groups]
    if len(order) == len(lengths):
        return None
    prefix = [float("inf")] * len(order)
    for g, p, n in zip(row_group, prompts, lengths):
        prefix[g] = min(prefix[g], min(p, n) - 1)
    if min(prefix) < 1:
        return None
    row_prefix = tuple(prefix[g] for g in row_group)
    plan = ChunkPlan(tuple(prefix), row_prefix, max(prefix), max(n - p for n, p in zip(lengths, row_prefix)))
    width = max(lengths) if plain_width is None else plain_width
    return plan if plan.tokens <= MAX_TOKEN_RATIO * len(lengths) * width else None


def micro_batches(cost: Any, lengths: Sequence[float]) -> list[list[int]]:
    """Row indices of each micro-batch of one mini-batch, as the engine cuts it: packed by ``cost.max_token_len``
    (:func:`asyncrl.trainer.engine.pack_by_token_budget`), else ``cost.micro_batch_rows`` rows in order, else one."""
    from asyncrl.trainer.engine import pack_by_token_budget

    n = len(lengths)
    if cost.max_token_len:
        return pack_by_token_budget(list(lengths), cost.max_token_len)
    step = cost.micro_batch_rows or n
    return [list(range(i, min(n, i + step))) for i in range(0, n, step)]


def grouped_pass_time(cost: Any, lengths: Sequence[float], groups: Sequence, prompts: Sequence[float]) -> float:
    """Forward + backward seconds of one mini-batch on one rank, each micro-batch priced as the grouper runs it
    (before ``contention``).

    A planned micro-batch of ``G`` groups and ``B`` rows costs, padded (``max_token_len`` or ``padded``)
    ``G x work(width) + B x suffix_work(suffix_width, width)`` plus one more call (``per_micro_batch_s``, or
    ``per_packed_micro_batch_s`` when packed) than its plain price; unpadded (the sum over rows), each group's
    ``work(prefix)`` plus each row's ``suffix_work(length - prefix, prefix)``. Any other micro-batch costs what
    :meth:`~asyncrl.sim.cost_models.TrainCostModel.pass_time` charges it without the grouper.

    Args:
        cost: a :class:`~asyncrl.sim.cost_models.TrainCostModel`.
        lengths, groups, prompts: ``(rows,)`` each, as :func:`chunk_plan`.

    Raises:
        ValueError: ``groups`` or ``prompts`` not one per row.
    """
    if not len(groups) == len(prompts) == len(lengths):
        raise ValueError(f"grouped_pass_time: {len(lengths)} lengths, {len(groups)} group ids and {len(prompts)} "
                         "prompt lengths: expected one of each per row")
    call = cost.per_micro_batch_s
    if cost.max_token_len and cost.per_packed_micro_batch_s is not None:
        call = cost.per_packed_micro_batch_s
    padded = bool(cost.max_token_len) or cost.padded
    step_width = max(lengths)  # padded without a token budget: every row at the mini-batch's longest
    total = 0.0
    for idx in micro_batches(cost, lengths):
        rows = [lengths[i] for i in idx]
        width = (max(rows) if cost.max_token_len else step_width) if padded else max(rows)
        plan = chunk_plan(rows, [groups[i] for i in idx], [prompts[i] for i in idx], width)
        if plan is None:
            total += len(rows) * cost.work(width) + call if padded else sum(cost.work(x) for x in rows)
        elif padded:
            total += (len(plan.group_prefix) * cost.work(plan.width)
                      + len(rows) * cost.suffix_work(plan.suffix_width, plan.width) + 2 * call)
        else:
            total += (sum(cost.work(p) for p in plan.group_prefix)
                      + sum(cost.suffix_work(x - p, p) for x, p in zip(rows, plan.row_prefix)))
    return total

"""Rule rewards, dispatched by a row's ``data_source`` (verl's ``default_compute_score`` contract)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Union

from asyncrl.registry import Registry
from asyncrl.reward import gsm8k

logger = logging.getLogger(__name__)

RewardFn = Callable[[str, str], Union[float, dict]]
"""``fn(solution_str, ground_truth) -> score`` or ``{"score": float, **extras}``."""

REWARD_FNS: Registry[RewardFn] = Registry("reward (data_source)")
"""data_source -> rule reward. Unknown sources fall back to the gsm8k-style scorer (logged once)."""
for _source in ("arith", "calc_tool", "gsm8k", "openai/gsm8k"):
    REWARD_FNS.register(_source, gsm8k.compute_score)
# task modules register their own rule on import; lazy here so every process (rollouter, agent-loop
# workers) finds it even when it never imported the task module
REWARD_FNS.register_lazy("word_problems", "asyncrl.data.word_problems:compute_score")
REWARD_FNS.register_lazy("longtail", "asyncrl.reward.countdown:compute_score")

_warned: set[str] = set()


def register_reward(data_source: str, fn: RewardFn) -> None:
    """Use ``fn(solution_str, ground_truth) -> float`` for rows whose ``data_source`` is ``data_source``."""
    REWARD_FNS.register(data_source, fn)


def get_reward_fn(data_source: str) -> RewardFn:
    """The rule reward for ``data_source``; an unregistered source gets the gsm8k-style scorer.

    The fallback is verl-compatible for datasets whose answers end in ``#### <number>``; it is logged
    once per source (naming the registered ones) so a misspelled ``data_source`` is visible.
    """
    if data_source not in REWARD_FNS:
        if data_source not in _warned:
            _warned.add(data_source)
            logger.warning("no reward registered for data_source %r (registered: %s); using the gsm8k-style "
                           "scorer. Register one with asyncrl.reward.register_reward.", data_source,
                           ", ".join(REWARD_FNS.names()))
        return gsm8k.compute_score
    return REWARD_FNS[data_source]


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: dict[str, Any] | None = None) -> float | dict[str, float]:
    """Score one response with the rule reward registered for ``data_source``.

    Args:
        data_source: the row's ``data_source`` (e.g. ``"arith"``); unknown values use gsm8k-style scoring.
        solution_str: the decoded response (no prompt).
        ground_truth: the row's ``reward_model.ground_truth``.
        extra_info: the row's ``extra_info`` (unused by the built-in rules; kept for verl parity).

    Returns:
        The score as a float (1.0 / 0.0 for the built-in rules), or, for a rule that reports more
        (verl's dict-valued scores), ``{"score": float, **extras}`` such as ``acc`` and ``format``
        (the extras become ``reward/<key>`` metrics; ``acc`` is the held-out accuracy when present).
    """
    result = get_reward_fn(data_source)(solution_str, str(ground_truth))
    if isinstance(result, dict):
        return {k: float(v) for k, v in result.items()}
    return float(result)


__all__ = ["REWARD_FNS", "compute_score", "get_reward_fn", "register_reward"]

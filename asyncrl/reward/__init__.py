"""Rule rewards, dispatched by a row's ``data_source`` (verl's ``default_compute_score`` contract)."""

from __future__ import annotations

import logging
from typing import Any, Callable

from asyncrl.registry import Registry
from asyncrl.reward import gsm8k

logger = logging.getLogger(__name__)

RewardFn = Callable[[str, str], float]
"""``fn(solution_str, ground_truth) -> score``."""

REWARD_FNS: Registry[RewardFn] = Registry("reward (data_source)")
"""data_source -> rule reward. Unknown sources fall back to the gsm8k-style scorer (logged once)."""
for _source in ("arith", "calc_tool", "gsm8k", "openai/gsm8k"):
    REWARD_FNS.register(_source, gsm8k.compute_score)

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
                  extra_info: dict[str, Any] | None = None) -> float:
    """Score one response with the rule reward registered for ``data_source``.

    Args:
        data_source: the row's ``data_source`` (e.g. ``"arith"``); unknown values use gsm8k-style scoring.
        solution_str: the decoded response (no prompt).
        ground_truth: the row's ``reward_model.ground_truth``.
        extra_info: the row's ``extra_info`` (unused by the built-in rules; kept for verl parity).

    Returns:
        The score as a float (1.0 / 0.0 for the built-in rules).
    """
    return float(get_reward_fn(data_source)(solution_str, str(ground_truth)))


__all__ = ["REWARD_FNS", "compute_score", "get_reward_fn", "register_reward"]

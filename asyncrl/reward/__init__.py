"""Rule rewards, dispatched by a row's ``data_source`` (verl's ``default_compute_score`` contract)."""

from __future__ import annotations

from typing import Any, Callable

from asyncrl.reward import gsm8k

RewardFn = Callable[[str, str], float]
"""``fn(solution_str, ground_truth) -> score``."""

REWARD_FNS: dict[str, RewardFn] = {
    "arith": gsm8k.compute_score,
    "gsm8k": gsm8k.compute_score,
    "openai/gsm8k": gsm8k.compute_score,
}
"""data_source -> rule reward. Unknown sources fall back to the gsm8k-style scorer."""


def register_reward(data_source: str, fn: RewardFn) -> None:
    """Use ``fn(solution_str, ground_truth) -> float`` for rows whose ``data_source`` is ``data_source``."""
    REWARD_FNS[data_source] = fn


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
    fn = REWARD_FNS.get(data_source, gsm8k.compute_score)
    return float(fn(solution_str, str(ground_truth)))


__all__ = ["REWARD_FNS", "compute_score", "register_reward"]

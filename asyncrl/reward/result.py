"""What a reward function returned, checked once: the one place a reward becomes the float a sample trains on.

A reward returns a score or verl's ``{"score": float, **extras}``. :func:`check_reward` turns it into a
:class:`RewardResult` or refuses it with one line naming the reward (``file:function``), the ``data_source``, the
sample and what came back; :func:`score_sample` calls a scorer and checks its answer. The agent-loop workers (a run's
rewards) and :func:`asyncrl.sim.calibrate.measure_rollout` score through :func:`score_sample`,
:func:`asyncrl.reward.compute_score` (the rule rewards) through :func:`check_reward`.

Extras follow verl's ``reward_extra_info``: every one is kept as returned (a worker puts them in the sample's
``extra_fields["reward_extra_info"]``); only numbers and bools become ``reward/<key>`` metrics, so a string such as
verl's ``math_dapo`` ``"pred"`` costs the sample nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from asyncrl.registry import UnknownNameError

CONTRACT = 'return a float or {"score": float, ...}'


class RewardError(ValueError):
    """A reward function returned something that is not a finite score, or raised: the sample fails with this one-line
    message (the failure counters key it as ``RewardError``)."""


@dataclass
class RewardResult:
    """One checked reward.

    Attributes:
        score: the finite float the sample trains on.
        extras: every key but ``score`` of a dict reward, as returned (verl's ``reward_extra_info``).
    """

    score: float
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def metrics(self) -> dict[str, float]:
        """``{"reward/<key>": float}`` for the extras that are numbers or bools (``acc``, ``format``, ...); strings and
        other objects are left out (they stay in :attr:`extras`)."""
        return {f"reward/{k}": float(v) for k, v in self.extras.items() if _number(v) is not None}


def reward_label(fn: Callable) -> str:
    """How messages name a scorer: its ``reward_label`` attribute (a custom reward's ``custom reward
    path:function``), else ``reward module.function``."""
    label = getattr(fn, "reward_label", None)
    if label:
        return label
    return f"reward {getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _number(value: Any) -> Optional[float]:
    """``float(value)`` for a number, bool or numpy/torch scalar; ``None`` for anything else (strings included:
    ``"1.0"`` is not a score)."""
    if isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):  # a tensor of several elements, a complex
        return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_reward(value: Any, label: str, data_source: str, where: Optional[str] = None) -> RewardResult:
    """Check what a reward returned.

    Args:
        value: the reward's return value.
        label: the reward, as :func:`reward_label` names it.
        data_source: the row's ``data_source``.
        where: the sample (``"sample <uid>-<k>"``, ``"row 7"``), shown in messages; ``None`` when unknown.

    Returns:
        The finite score and the dict's other keys.

    Raises:
        RewardError: ``None``, a string (even ``"1.0"``), a dict without ``"score"`` or with a non-number there, any
            other non-number, or a NaN / infinite score.
    """
    at = f" for data_source {data_source!r}" + (f" ({where})" if where else "")
    extras: dict[str, Any] = {}
    score_value, what = value, ""
    if isinstance(value, dict):
        if "score" not in value:
            keys = ", ".join(map(str, value)) or "none"
            raise RewardError(f'{label} returned a dict without "score" (its keys: {keys}){at}: {CONTRACT}')
        score_value, what = value["score"], '"score" '
        extras = {str(k): v for k, v in value.items() if k != "score"}
    score = _number(score_value)
    if score is None:
        kind = "None" if score_value is None else f"{type(score_value).__name__} {_shown(score_value)}"
        if isinstance(score_value, str):
            kind += " (a string is not a score, even a number's)"
        raise RewardError(f"{label} returned {what}{kind}{at}: {CONTRACT}")
    if not math.isfinite(score):
        raise RewardError(f"{label} returned {what}{score}{at}: a score must be finite (a NaN or infinite reward makes "
                          "every update's gradient norm non-finite, so no step would train)")
    return RewardResult(score, extras)


def score_sample(fn: Callable, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None,
                 where: Optional[str] = None) -> RewardResult:
    """Call the scorer ``fn(data_source, solution_str, ground_truth, extra_info)`` (:func:`asyncrl.reward.custom.
    scorer`'s) and check its answer (:func:`check_reward`).

    Raises:
        RewardError: ``fn`` raised (its type and message, naming the reward and the sample) or returned no score.
    """
    label = reward_label(fn)
    try:
        value = fn(data_source, solution_str, ground_truth, extra_info)
    except (RewardError, UnknownNameError):  # already one line naming the reward / the data_source
        raise
    except Exception as exc:  # the user's code: named in one line, its traceback kept as the cause
        at = f" for data_source {data_source!r}" + (f" ({where})" if where else "")
        raise RewardError(f"{label} raised {type(exc).__name__}: {' '.join(str(exc).split())[:200]}{at}") from exc
    return check_reward(value, label, data_source, where)


__all__ = ["RewardError", "RewardResult", "check_reward", "reward_label", "score_sample"]

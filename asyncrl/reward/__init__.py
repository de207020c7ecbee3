"""Rule rewards, dispatched by a row's ``data_source`` (verl's ``default_compute_score`` contract).

A ``data_source`` with no reward function is an error, as in verl (its ``default_compute_score`` raises
``NotImplementedError``): the rows a run reads are checked before anything starts (:func:`reward_problem`, called by
:func:`asyncrl.data.dataset.run_rows`), and :func:`get_reward_fn` raises for one that slips past. Scoring every row
by one function of the user's instead is verl's ``custom_reward_function`` (:mod:`asyncrl.reward.custom`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Union

from asyncrl.registry import Registry, UnknownNameError, closest_name
from asyncrl.reward import gsm8k
from asyncrl.reward.result import check_reward, reward_label

RewardFn = Callable[[str, str], Union[float, dict]]
"""``fn(solution_str, ground_truth) -> score`` or ``{"score": float, **extras}``."""

REWARD_FNS: Registry[RewardFn] = Registry("reward (data_source)")
"""data_source -> rule reward. A source not registered here has none (:func:`get_reward_fn` raises)."""
for _source in ("arith", "calc_tool", "gsm8k", "openai/gsm8k"):
    REWARD_FNS.register(_source, gsm8k.compute_score)
# task modules register their own rule on import; lazy here so every process (rollouter, agent-loop
# workers) finds it even when it never imported the task module
REWARD_FNS.register_lazy("word_problems", "asyncrl.data.word_problems:compute_score")
REWARD_FNS.register_lazy("longtail", "asyncrl.reward.countdown:compute_score")

EVERY_PROCESS_SOURCES = frozenset(REWARD_FNS.names())
"""The data_sources every process has a reward for (registered by importing this module). A run scores its rows in Ray
actors that never run the driver's code, so a :func:`register_reward` there reaches none of them."""

_CUSTOM = ("set custom_reward_function.path to a .py file whose compute_score(data_source, solution_str, ground_truth, "
           "extra_info) scores every row")


class UnknownDataSourceError(UnknownNameError):
    """A row's ``data_source`` has no reward function (verl raises ``NotImplementedError``). An
    :class:`~asyncrl.registry.UnknownNameError` (so a ``KeyError`` and a ``ValueError``) whose message says what to do
    (:func:`reward_problem`)."""

    def __init__(self, data_source: str, message: str):
        super().__init__(REWARD_FNS.kind, data_source, REWARD_FNS.names())
        self.args = (message,)


def register_reward(data_source: str, fn: RewardFn) -> None:
    """Use ``fn(solution_str, ground_truth) -> float`` for rows whose ``data_source`` is ``data_source``, in this
    process: what scores in it (``asyncrl.sim.simulate``, :mod:`asyncrl.answers`) sees it, the Ray actors of an
    :class:`~asyncrl.experiment.Experiment` do not (give those ``custom_reward_function.path``)."""
    REWARD_FNS.register(data_source, fn)


def reward_problem(data_source: str, every_process: bool = False) -> Optional[str]:
    """Why rows of ``data_source`` cannot be scored, or ``None`` when a rule reward is registered for it.

    Args:
        data_source: a row's ``data_source``.
        every_process: the rows are scored in other processes (an Experiment's Ray actors): only the sources
            registered by importing this module count (:data:`EVERY_PROCESS_SOURCES`), not a :func:`register_reward`
            made in this one.

    Returns:
        One line naming the source, the known ones (and the closest) and what to do; ``None`` if it has a reward.
    """
    known = EVERY_PROCESS_SOURCES if every_process else REWARD_FNS.names()
    if data_source in known:
        return None
    if every_process and data_source in REWARD_FNS:
        return (f"data_source {data_source!r} has a reward function registered in this process only "
                f"(asyncrl.reward.register_reward): the Ray actors that score a run never see it; {_CUSTOM}")
    close = closest_name(data_source, known)
    hint = f"; did you mean {close!r}?" if close else ""
    register = "" if every_process else " register one with asyncrl.reward.register_reward(name, fn),"
    return (f"data_source {data_source!r} has no reward function (known: {', '.join(sorted(known))}{hint}); name a "
            f"known one (gsm8k: the number after the last '####'),{register} or {_CUSTOM}")


def source_check(config: Any, every_process: bool = False) -> Optional[Callable[[str], Optional[str]]]:
    """What :func:`asyncrl.data.dataset.run_rows` checks each row's ``data_source`` with for a run of ``config``:
    ``None`` (no check) when ``custom_reward_function.path`` scores every row whatever its source, else
    :func:`reward_problem` (with ``every_process``)."""
    if config.custom_reward_function.path is not None:
        return None
    return functools.partial(reward_problem, every_process=every_process)


def get_reward_fn(data_source: str) -> RewardFn:
    """The rule reward registered for ``data_source``.

    Raises:
        UnknownDataSourceError: none is registered in this process (the message is :func:`reward_problem`'s).
    """
    problem = reward_problem(data_source)
    if problem is not None:
        raise UnknownDataSourceError(data_source, problem)
    return REWARD_FNS[data_source]


def compute_score(data_source: str, solution_str: str, ground_truth: Any,
                  extra_info: dict[str, Any] | None = None) -> float | dict[str, float]:
    """Score one response with the rule reward registered for ``data_source``.

    Args:
        data_source: the row's ``data_source`` (e.g. ``"arith"``).
        solution_str: the decoded response (no prompt).
        ground_truth: the row's ``reward_model.ground_truth``.
        extra_info: the row's ``extra_info`` (unused by the built-in rules; kept for verl parity).

    Returns:
        The score as a float (1.0 / 0.0 for the built-in rules), or, for a rule that reports more
        (verl's dict-valued scores), ``{"score": float, **extras}`` such as ``acc`` and ``format``, the extras as the
        rule returned them (numeric ones become ``reward/<key>`` metrics; ``acc`` is the held-out accuracy when
        present; :class:`~asyncrl.reward.result.RewardResult`).

    Raises:
        UnknownDataSourceError: no reward is registered for ``data_source`` (see :func:`get_reward_fn`).
        asyncrl.reward.result.RewardError: the rule returned no finite score (:func:`~asyncrl.reward.result.
            check_reward`'s message, naming the rule).
    """
    fn = get_reward_fn(data_source)
    raw = fn(solution_str, str(ground_truth))
    result = check_reward(raw, f"rule {reward_label(fn)}", data_source)
    return {"score": result.score, **result.extras} if isinstance(raw, dict) else result.score


__all__ = ["EVERY_PROCESS_SOURCES", "REWARD_FNS", "UnknownDataSourceError", "compute_score", "get_reward_fn",
           "register_reward", "reward_problem", "source_check"]

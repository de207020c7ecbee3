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
    return sources_problem(data_source, every_process)


def sources_problem(sources: Union[dict[str, str], str], every_process: bool = False,
                    register_hint: bool = True) -> Optional[str]:
    """Why rows of some of ``sources`` cannot be scored (every such source named, with where its rows are), or
    ``None`` when each has a rule reward: :func:`asyncrl.data.dataset.check_sources` checks a file's sources with it.

    Args:
        sources: ``{data_source: where its rows are}`` (``"3 rows, the first row 5"``; ``""``: not said), in the
            order to name them; one source alone as a string.
        every_process: as :func:`reward_problem`.
        register_hint: suggest :func:`register_reward` (this process scores the rows and its caller can run Python:
            ``asyncrl.sim.simulate``); ``False`` for ``asyncrl sim`` on the command line, which cannot.

    Returns:
        One line naming each unscorable source, the known ones (and the closest) and what to do.
    """
    if isinstance(sources, str):
        sources = {sources: ""}
    known = EVERY_PROCESS_SOURCES if every_process else REWARD_FNS.names()
    local = [s for s in sources if s not in known and every_process and s in REWARD_FNS]
    unknown = [s for s in sources if s not in known and s not in local]
    if not local and not unknown:
        return None

    def named(names: list[str], close: bool) -> str:
        def one(s: str) -> str:
            near = closest_name(s, known) if close and len(names) > 1 else None
            notes = [n for n in (sources[s], f"did you mean {near!r}?" if near else "") if n]
            return repr(s) + (f" ({'; '.join(notes)})" if notes else "")
        listed = [one(s) for s in names]
        return ("data_source " if len(listed) == 1 else "data_sources ") + (
            listed[0] if len(listed) == 1 else ", ".join(listed[:-1]) + " and " + listed[-1])

    parts = []
    if unknown:
        close = closest_name(unknown[0], known) if len(unknown) == 1 else None
        hint = f"; did you mean {close!r}?" if close else ""
        parts.append(f"{named(unknown, True)} {'has' if len(unknown) == 1 else 'have'} no reward function "
                     f"(known: {', '.join(sorted(known))}{hint})")
    if local:
        parts.append(f"{named(local, False)} {'has a reward function' if len(local) == 1 else 'have reward functions'} "
                     "registered in this process only (asyncrl.reward.register_reward): the Ray actors that score a "
                     "run never see it")
    if not unknown:
        return f"{'; '.join(parts)}; {_CUSTOM}"
    register = ("" if every_process or not register_hint else
                " register one with asyncrl.reward.register_reward(name, fn),")
    return (f"{'; '.join(parts)}; name a known one (gsm8k: the number after the last '####'),{register} or "
            f"{_CUSTOM}")


def source_check(config: Any, every_process: bool = False,
                 register_hint: bool = True) -> Optional[Callable[[dict[str, str]], Optional[str]]]:
    """What :func:`asyncrl.data.dataset.run_rows` checks the rows' ``data_source`` values with for a run of
    ``config``: ``None`` (no check) when ``custom_reward_function.path`` scores every row whatever its source, else
    :func:`sources_problem` (with ``every_process`` and ``register_hint``)."""
    if config.custom_reward_function.path is not None:
        return None
    return functools.partial(sources_problem, every_process=every_process, register_hint=register_hint)


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
           "register_reward", "reward_problem", "source_check", "sources_problem"]

"""Held-out greedy evaluation of the rollouter's current version, one sample never stopping the rest.

::

    FullyAsyncRollouter.evaluate(limit)
        held-out rows --render--> prompt_ids  (> data.max_prompt_length: failed "prompt_too_long")
            --gather--> AgentLoopManager.generate_sequences_single(row, "eval-v-tag-i", greedy, n=1)
                 each sample: an AgentLoopOutput (scored)  or  an exception (failed, with its reason)
        -> {"version", "accuracy" (over scored samples), "n" (scored), "rows", "accuracy_of", "eval/failed",
            "eval/failed_reasons" {reason: count}, "eval/<agent|reward metric>" means, ...}

A sample's failure (an agent loop that raises, an engine that refuses the prompt, a prompt longer than
the context, a tool that crashes, a sandbox trial whose retries ran out) is one *failed* evaluation
sample: counted under ``eval/failed`` by reason (the exception type, as training failures are keyed
in :mod:`asyncrl.failures`), logged once per reason per evaluation with its first message, and kept
in the rollouter's recent failures for the dashboard (but not in its consecutive-failure count: held-out
failures never halt training rollout). It never ends the evaluation nor the run. Only the rollouter's own
cancellation (``stop()``) propagates.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from typing import Any, Optional

from asyncrl.failures import FailureLog, own_cancellation

logger = logging.getLogger(__name__)

PROMPT_TOO_LONG = "prompt_too_long"
"""Reason of a held-out row whose rendered prompt exceeds ``data.max_prompt_length`` (as in training)."""


class EvalSampleFailed(Exception):
    """One evaluation sample's failure: ``reason`` (its counter key) and ``message`` (the first line)."""

    def __init__(self, reason: str, message: str):
        super().__init__(reason, message)
        self.reason, self.message = reason, message


async def _one(ro: Any, log: FailureLog, i: int, row: dict, rid: str) -> Any:
    """The scored output of held-out row ``i``, or an :class:`EvalSampleFailed` (returned, not raised)."""
    from asyncrl.agent_loop.chat_encoding import render_prompt_ids

    try:
        prompt_ids = render_prompt_ids(ro.tokenizer, list(row["prompt"]), row.get("tools"))
        limit = ro.cfg.data.max_prompt_length
        if len(prompt_ids) > limit:
            return EvalSampleFailed(PROMPT_TOO_LONG, f"prompt of {len(prompt_ids)} tokens > data.max_prompt_length={limit}")
        outs = await ro.agent_loops.generate_sequences_single(row, rid, ro.greedy_sp, 1, prompt_ids, trained=False)
        return outs[0]
    except asyncio.CancelledError as exc:
        if own_cancellation():  # the evaluation itself is being cancelled (the rollouter stops)
            raise
        return _failed(log, exc, rid, i, "a callee raised CancelledError")
    except Exception as exc:  # one sample's failure; the others are still scored
        return _failed(log, exc, rid, i)


def _failed(log: FailureLog, exc: BaseException, rid: str, i: int, message: str = "") -> EvalSampleFailed:
    reason = log.record(exc, rid, index=i, phase="eval")
    return EvalSampleFailed(reason, message or log.recent[-1]["message"])


def accuracy_of(outs: list, cfg: Any) -> str:
    """What an evaluation's ``accuracy`` is the mean of: ``"acc"`` (every scored sample's reward reported an ``acc``
    extra), ``"score"`` (a ``custom_reward_function`` that reports none: its mean score, which need not be an accuracy)
    or ``"rule"`` (a built-in rule's score, 1 for a correct answer and 0 otherwise: an accuracy)."""
    if outs and all("reward/acc" in o.metrics for o in outs):
        return "acc"
    return "score" if cfg.custom_reward_function.path is not None else "rule"


async def evaluate(ro: Any, limit: Optional[int] = None) -> dict:
    """Greedy evaluation of ``ro.val_rows[:limit]`` at ``ro.param_version``; appended to ``ro.eval_history``.

    Args:
        ro: the :class:`~asyncrl.rollouter.FullyAsyncRollouter` (its agent loops, tokenizer, config).
        limit: evaluate only the first ``limit`` held-out rows (all when ``None``).

    Returns:
        ``{"version", "accuracy", "n", "rows", "accuracy_of", "time", "eval_s", "eval/failed",
        "eval/failed_reasons"}`` plus the mean of numeric agent / reward metrics under ``eval/...``. ``accuracy`` is
        the mean score over the ``n`` scored samples of the ``rows`` evaluated (0.0 when none was scored: the
        summary reports no figure then, :func:`asyncrl.summary.held_out`); ``accuracy_of`` says what it means
        (:func:`accuracy_of`); ``eval/failed`` counts the failed ones and ``eval/failed_reasons`` maps each reason to
        its count.
    """
    version, t0 = ro.param_version, time.time()
    rows = ro.val_rows[: limit or len(ro.val_rows)]
    tag = uuid.uuid4().hex[:6]
    log = FailureLog()  # this evaluation's own: held-out failures never count toward a training failure storm
    results = await asyncio.gather(*[_one(ro, log, i, r, f"eval-{version}-{tag}-{i}") for i, r in enumerate(rows)])
    ro.failures.recent.extend(log.snapshot())  # the dashboard's recent failures show them, tagged phase "eval"
    outs = [r for r in results if not isinstance(r, EvalSampleFailed)]
    failed = [r for r in results if isinstance(r, EvalSampleFailed)]
    reasons = collections.Counter(f.reason for f in failed)
    for reason, count in sorted(reasons.items()):  # once per reason, with its first message
        first = next(f.message for f in failed if f.reason == reason)
        logger.warning("eval v%d: %d of %d held-out samples failed with %s (first: %s)", version, count,
                       len(rows), reason, first)
    # verl: a rule that reports "acc" (dict-valued reward) is scored by it, else by the reward itself
    scores = [float(o.metrics.get("reward/acc", o.reward_score or 0.0)) for o in outs]
    result = {"version": version, "accuracy": sum(scores) / max(1, len(scores)), "n": len(scores),
              "rows": len(rows), "accuracy_of": accuracy_of(outs, ro.cfg),
              "time": time.time() - ro.t_start, "eval_s": time.time() - t0,
              "eval/failed": len(failed), "eval/failed_reasons": dict(reasons)}
    keys = {k for o in outs for k, v in o.metrics.items() if isinstance(v, (int, float))
            and k.startswith(("agent/", "reward/"))}
    for k in sorted(keys):
        vals = [float(o.metrics[k]) for o in outs if k in o.metrics]
        result["eval/" + k.split("/", 1)[1]] = sum(vals) / len(vals)
    ro.eval_history.append(result)
    logger.info("eval v%d: accuracy %.3f on %d scored, %d failed", version, result["accuracy"], len(scores), len(failed))
    return result

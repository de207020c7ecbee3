"""A model's greedy answers to dataset rows, scored, as trajectory dicts the inspector widget reads.

::

    rows (verl schema) --chat template--> prompt ids --replica.generate (greedy)--> response ids
         --decode + rule reward (asyncrl.reward, by data_source)--> Answer(text, score, extras)
         --as_trajectory()--> {uid, prompt_ids, response_ids, response_mask, response_logprobs,
                               prompt_tokens, response_tokens, reward, ...}  (widgets.TrajectoryInspector)

Used to look at a model before and after training on the same questions (notebook 08): the same
replica answers before the run and again after it (the run leaves its last weights in the replica).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Optional

from asyncrl.rollout.base import SamplingParams


@dataclasses.dataclass
class Answer:
    """One greedy answer.

    Attributes:
        question: the user message.
        text: the decoded response (special tokens skipped), as the reward saw it.
        score: the rule reward's score.
        extras: the rule's other values (``acc``, ``format`` for ``word_problems``).
        trajectory: the inspector's dict for this answer.
    """

    question: str
    text: str
    score: float
    extras: dict
    trajectory: dict


def _as_trajectory(uid: str, tokenizer: Any, prompt_ids: list[int], out: Any, score: float, version: int) -> dict:
    ids = list(out.token_ids)
    return {"uid": uid, "index": 0, "reward": score, "num_turns": 2, "prompt_ids": prompt_ids, "response_ids": ids,
            "response_mask": [1] * len(ids),
            "response_logprobs": list(out.log_probs) if out.log_probs is not None else [0.0] * len(ids),
            "response_versions": list(getattr(out, "response_versions", None) or [version] * len(ids)),
            "prompt_tokens": [tokenizer.decode([t]) for t in prompt_ids],
            "response_tokens": [tokenizer.decode([t]) for t in ids],
            "min_global_steps": version, "max_global_steps": version}


async def greedy_answers_async(replica: Any, tokenizer: Any, rows: list[dict], max_tokens: int, tag: str = "answer",
                               version: int = 0) -> list[Answer]:
    """Greedy answers of ``replica`` to ``rows`` (all requests in flight at once).

    Args:
        replica: a :class:`~asyncrl.rollout.replica.RolloutReplica`.
        tokenizer: the model's tokenizer (chat template; EOS ends generation).
        rows: verl-schema rows (``prompt`` messages, ``data_source``, ``reward_model.ground_truth``).
        max_tokens: generation budget per answer.
        tag: prefix of the trajectories' ``uid`` (``before`` / ``after``): ``"<tag>-<i>"``.
        version: parameter version the replica holds (shown by the inspector).

    Returns:
        One :class:`Answer` per row, in order.
    """
    from asyncrl.agent_loop.single_turn import render_prompt_ids
    from asyncrl.reward import compute_score

    stop = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=True, stop_token_ids=stop)
    prompts = [render_prompt_ids(tokenizer, list(r["prompt"])) for r in rows]
    outs = await asyncio.gather(*[replica.generate_async(f"{tag}-{i}", p, sp) for i, p in enumerate(prompts)])
    answers = []
    for i, (row, p, out) in enumerate(zip(rows, prompts, outs)):
        text = tokenizer.decode(out.token_ids, skip_special_tokens=True)
        result = compute_score(row.get("data_source", ""), text, row["reward_model"]["ground_truth"])
        extras = {k: v for k, v in result.items() if k != "score"} if isinstance(result, dict) else {}
        score = float(result["score"] if isinstance(result, dict) else result)
        answers.append(Answer(question=row["prompt"][-1]["content"], text=text, score=score, extras=extras,
                              trajectory=_as_trajectory(f"{tag}-{i}", tokenizer, p, out, score, version)))
    return answers


def rate(answers: list[Answer], key: str) -> Optional[float]:
    """Mean of ``extras[key]`` (e.g. ``"format"``, ``"acc"``) over the answers that report it."""
    vals = [a.extras[key] for a in answers if key in a.extras]
    return sum(vals) / len(vals) if vals else None


def answers_table(before: list[Answer], after: Optional[list[Answer]] = None, width: int = 160) -> Any:
    """A DataFrame: question, ground-truth-free view of each answer's last line, score (before/after)."""
    import pandas as pd

    def last_line(text: str) -> str:
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        return (lines[-1] if lines else "")[:width]

    data = {"question": [a.question.split("\n")[0][:width] for a in before],
            "before: last line": [last_line(a.text) for a in before], "before: score": [a.score for a in before]}
    if after is not None:
        data["after: last line"] = [last_line(a.text) for a in after]
        data["after: score"] = [a.score for a in after]
    return pd.DataFrame(data)

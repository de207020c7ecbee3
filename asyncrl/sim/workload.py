"""Response-length workloads for the simulator: ``natural_length(request_id, prompt_ids)`` functions.

The lengths a simulated model answers with are the workload, not a cost of the machine: drawn from measured
lengths (a rollout-only's responses, or a run's own ``summary.response_length_counts``) or from the rows'
correct-answer lengths (the ``longtail`` task). The cost models that price them live in ``cost_models.py``,
their calibration in ``calibrate.py``.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
import statistics
from typing import Any, Callable, Mapping, Optional, Sequence, Union


def _unit(key: str) -> float:
    """A number in (0, 1) fixed by ``key`` (MD5: the same in every process and Python version)."""
    return (int.from_bytes(hashlib.md5(key.encode()).digest()[:8], "big") + 0.5) / 2.0 ** 64


def empirical_lengths(lengths: Union[Sequence[int], Mapping[Any, int]], group_correlation: float = 0.0) -> Callable[..., int]:
    """``natural_length(request_id, prompt_ids=None)``: a length drawn from ``lengths``, fixed per request id.

    Args:
        lengths: response lengths in tokens, one per response, or their counts ``{tokens: responses}`` (a run's
            ``summary.response_length_counts``; keys may be strings, as JSON leaves them).
        group_correlation: in [0, 1): how much the responses to one prompt share their length (the ``rho`` of a
            Gaussian copula: a response's normal score is ``sqrt(rho) z_prompt + sqrt(1 - rho) z_response``, so
            the lengths over all responses stay ``lengths`` whatever ``rho``). 0 (the default): every response
            drawn on its own, as before session 25. A GRPO group answers one prompt: on the long-tail task its
            responses share the answer's length (:func:`group_correlation` measures 0.57-0.66 on rollout-only
            groups), so its longest response - what the group waits for - is longer than independent draws
            give. Needs ``prompt_ids`` at the call; a call without them draws independently.

    Raises:
        ValueError: no lengths, a negative count, or ``group_correlation`` outside [0, 1).
    """
    if not 0.0 <= group_correlation < 1.0:
        raise ValueError(f"group_correlation must be in [0, 1), got {group_correlation!r}")
    if isinstance(lengths, Mapping):
        counts = sorted((int(k), int(v)) for k, v in lengths.items())
        if any(v < 0 for _, v in counts):
            raise ValueError(f"negative count in {dict(counts)}")
        counts = [(k, v) for k, v in counts if v > 0]
    else:
        counts = [(int(x), 1) for x in sorted(int(x) for x in lengths)]
    if not counts:
        raise ValueError("no lengths to sample from")
    values = [k for k, _ in counts]
    cum = list(itertools.accumulate(v for _, v in counts))  # the i-th response (sorted) is values[bisect(cum, i)]

    normal = statistics.NormalDist()
    own, shared = math.sqrt(1.0 - group_correlation), math.sqrt(group_correlation)

    def draw(request_id: str, prompt_ids: Any = None) -> int:
        if group_correlation == 0.0 or prompt_ids is None or len(prompt_ids) == 0:
            h = int.from_bytes(hashlib.md5(request_id.encode()).digest()[:8], "big")
            return values[bisect.bisect_right(cum, h % cum[-1])]
        z = (shared * normal.inv_cdf(_unit("prompt:" + ",".join(map(str, prompt_ids))))
             + own * normal.inv_cdf(_unit("response:" + request_id)))
        return values[min(len(values) - 1, bisect.bisect_right(cum, int(normal.cdf(z) * cum[-1])))]

    return draw


def group_correlation(groups: Sequence[Sequence[float]]) -> float:
    """The share of the lengths' spread that lies between groups: the intraclass correlation of the responses'
    normal scores (each length's mid-rank over all responses, through the inverse normal; ties share a score), the
    ``rho`` :func:`empirical_lengths` draws with. 0 when the groups are too few (< 2) or every length is the same;
    clipped to [0, 0.95].

    Args:
        groups: response lengths per group (e.g. a rollout-only's ``[[tokens] * n] * groups``).
    """
    groups = [list(g) for g in groups if len(g) > 0]
    flat = sorted(x for g in groups for x in g)
    if len(groups) < 2 or flat[0] == flat[-1]:
        return 0.0
    normal, n = statistics.NormalDist(), len(flat)
    first = {}
    for i, x in enumerate(flat):
        first.setdefault(x, i)
    last = {x: i for i, x in enumerate(flat)}
    score = {x: normal.inv_cdf(((first[x] + last[x]) / 2.0 + 0.5) / n) for x in first}
    z = [[score[x] for x in g] for g in groups]
    total = statistics.pvariance([v for g in z for v in g])
    within = statistics.fmean(statistics.pvariance(g) for g in z)
    return min(0.95, max(0.0, 1.0 - within / total)) if total > 0 else 0.0


def lengths_from_rows(rows: Sequence[dict], tokenizer: Any) -> Optional[Callable[..., Optional[int]]]:
    """``natural_length`` from rows that carry their correct answer's length (``extra_info.response_tokens``,
    e.g. the ``longtail`` task): the simulated model answers every prompt at exactly that length.
    ``None`` when the rows carry none."""
    from asyncrl.agent_loop.single_turn import render_prompt_ids

    by_prompt = {tuple(render_prompt_ids(tokenizer, r["prompt"])): int(r["extra_info"]["response_tokens"])
                 for r in rows if (r.get("extra_info") or {}).get("response_tokens")}
    if not by_prompt:
        return None
    fallback = sorted(by_prompt.values())[len(by_prompt) // 2]

    def length(request_id: str, prompt_ids: Sequence[int] = ()) -> int:
        return by_prompt.get(tuple(prompt_ids), fallback)

    return length


def gradient_fraction(counts: Mapping[Any, int], gradient_counts: Mapping[Any, int]) -> Callable[[float], float]:
    """``fraction(response_tokens)``: the share of a run's trained rows of that response length that had a
    gradient (a non-zero advantage), from its ``summary.response_length_counts`` and
    ``summary.gradient_length_counts``. The trainer skips the other rows (``TrainEngine.skip_zero_advantage``:
    GRPO groups whose responses all scored alike), so this is the share of the workload's rows that the update
    trains (by tokens it can differ: rows with a gradient can be the shorter ones). It moves as the policy
    learns, in either direction, which is why a simulation of a measured run takes it from the run. A length the
    run never trained gets the run's overall share.

    Raises:
        ValueError: no rows, or more gradient rows than rows at some length.
    """
    rows = {int(k): int(v) for k, v in counts.items() if int(v) > 0}
    grad = {int(k): int(v) for k, v in gradient_counts.items() if int(v) > 0}
    if not rows:
        raise ValueError("no trained rows to take a gradient fraction from")
    over = {k: (v, rows.get(k, 0)) for k, v in grad.items() if v > rows.get(k, 0)}
    if over:
        raise ValueError(f"more gradient rows than rows at lengths {over} (gradient, rows)")
    overall = sum(grad.values()) / sum(rows.values())
    share = {k: grad.get(k, 0) / n for k, n in rows.items()}

    def fraction(response_tokens: float) -> float:
        return share.get(int(round(response_tokens)), overall)

    fraction.overall = overall  # type: ignore[attr-defined]
    return fraction

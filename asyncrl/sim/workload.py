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
from typing import Any, Callable, Mapping, Optional, Sequence, Union


def empirical_lengths(lengths: Union[Sequence[int], Mapping[Any, int]]) -> Callable[..., int]:
    """``natural_length(request_id, prompt_ids=None)``: a length drawn from ``lengths``, fixed per request id.

    Args:
        lengths: response lengths in tokens, one per response, or their counts ``{tokens: responses}`` (a run's
            ``summary.response_length_counts``; keys may be strings, as JSON leaves them).

    Raises:
        ValueError: no lengths, or a negative count.
    """
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

    def draw(request_id: str, prompt_ids: Any = None) -> int:
        h = int.from_bytes(hashlib.md5(request_id.encode()).digest()[:8], "big")
        return values[bisect.bisect_right(cum, h % cum[-1])]

    return draw


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

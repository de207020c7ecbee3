"""GSM8K-style rule reward: the last ``#### <number>`` near the end of the response.

Semantics follow verl's ``gsm8k`` strict scorer: only the final ``LOOKBACK_CHARS`` characters of the
response are searched (so a long response cannot hide an answer early on), the *last* marker wins,
commas and ``$`` are stripped, and the score is binary.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

LOOKBACK_CHARS = 300
"""Only the last this-many characters of the response are searched for the answer marker."""

_ANSWER_RE = re.compile(r"####\s*(-?[\$0-9.,]+)")


def _normalise(s: str) -> str:
    return s.replace(",", "").replace("$", "").strip().rstrip(".")


def extract_answer(solution_str: str) -> str | None:
    """The normalised number after the last ``####`` within the final 300 characters.

    Args:
        solution_str: the decoded response text.

    Returns:
        The answer string without commas / ``$`` (e.g. ``"-1234"``), or ``None`` if no marker is found.
    """
    matches = _ANSWER_RE.findall(solution_str[-LOOKBACK_CHARS:])
    if not matches:
        return None
    ans = _normalise(matches[-1])
    return ans or None


def _same_number(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return False


def compute_score(solution_str: str, ground_truth: str | int | float, correct: float = 1.0,
                  wrong: float = 0.0) -> float:
    """Score a response against the ground-truth number.

    Args:
        solution_str: the decoded response text.
        ground_truth: the expected number (commas / ``$`` allowed).
        correct: score for a matching answer.
        wrong: score for a wrong or missing answer.

    Returns:
        ``correct`` if the extracted answer equals the ground truth numerically, else ``wrong``.
    """
    ans = extract_answer(solution_str)
    if ans is None:
        return wrong
    return correct if _same_number(ans, _normalise(str(ground_truth))) else wrong

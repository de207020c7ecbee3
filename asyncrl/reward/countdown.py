"""Rule reward of the ``longtail`` countdown task (:mod:`asyncrl.data.longtail`)."""

from __future__ import annotations


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 when the response is exactly the expected countdown (whitespace at the ends ignored), else 0.0.

    Args:
        solution_str: the decoded response, e.g. ``"5 4 3"``.
        ground_truth: the expected sequence, e.g. ``"5 4 3"``.
    """
    return 1.0 if solution_str.strip() == str(ground_truth).strip() else 0.0

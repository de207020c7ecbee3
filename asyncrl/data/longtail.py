"""The ``longtail`` task: count down to zero, with a heavy-tailed response length.

Every row asks e.g. ``Count down from 12 to 0, separated by ;`` and expects::

    12;11;10;9;8;7;6;5;4;3;2;1;0

Each step is a local operation (decrement the previous number; stop after ``0``), which the
embedded 2-layer model learns (a target other than 0 needs a comparison with the prompt, which it
does not learn in a CPU-sized warm start), while the response length is set by the start number,
drawn from a lognormal law (median ``COUNT_MEDIAN``, log-std ``COUNT_SIGMA``, clipped to
``[0, MAX_START]``): most answers are a few tokens, a few are hundreds. With the embedded
byte-level tokenizer (one token per character) a response is 2 to 375 tokens, EOS included: more
than two orders of magnitude, so a synchronous step waits for its longest answer (seed ``000``
section 1.3, the long tail that fully async training absorbs).

The question space (every start number with every separator in ``SEPARATORS``) is split once by a
stable hash of the question into a train pool (~90%) and a test pool (~10%), as in
:mod:`asyncrl.data.arith`; the length law is applied inside each pool, so both splits share it.
The rule reward (:mod:`asyncrl.reward.countdown`, ``data_source="longtail"``) is 1.0 for the exact sequence
(surrounding whitespace ignored) and 0.0 otherwise.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Any

DATA_SOURCE = "longtail"
MAX_START = 120
"""Largest first number: its countdown to 0 is 374 characters, which with the ~50-token chat
prompt fits the embedded model's 512 positions (``rollout.response_length=384``)."""
SEPARATORS = (" ", ",", ";", "|", "/")
"""Separators between the numbers (one per question; the prompt names it)."""
COUNT_MEDIAN = 6.0
"""Median of the lognormal law of the start number."""
COUNT_SIGMA = 1.1
"""Log-standard deviation of the start law: P(start > 50) ~ 3%, so a 32-prompt batch holds one
such answer about two times in three."""
TEST_BUCKETS = 10
"""One question in ``TEST_BUCKETS`` (by stable hash) belongs to the test pool."""


def countdown(start: int, sep: str = " ") -> str:
    """The correct answer: ``"start<sep>start-1<sep>...<sep>0"``."""
    return sep.join(str(i) for i in range(start, -1, -1))


def answer_tokens(start: int, sep: str = " ") -> int:
    """Response length in tokens with the embedded byte tokenizer (characters + EOS)."""
    return len(countdown(start, sep)) + 1


def is_test_question(start: int, sep: str) -> bool:
    """Whether ``(start, sep)`` belongs to the held-out pool (md5, identical in every process)."""
    return hashlib.md5(f"countdown {start} {sep!r}".encode()).digest()[0] % TEST_BUCKETS == 0


def _pool(split: str) -> dict[int, list[str]]:
    """Separators of one split by start number."""
    if split not in ("train", "test", "val"):
        raise ValueError(f"split must be 'train', 'test' or 'val', got {split!r}")
    want_test = split != "train"
    by_start: dict[int, list[str]] = {}
    for start in range(MAX_START + 1):
        for sep in SEPARATORS:
            if is_test_question(start, sep) == want_test:
                by_start.setdefault(start, []).append(sep)
    return by_start


def draw_start(rng: random.Random, median: float = COUNT_MEDIAN, sigma: float = COUNT_SIGMA,
               max_start: int = MAX_START) -> int:
    """One start number from the clipped, rounded lognormal law (in ``[0, max_start]``)."""
    return int(min(max_start, max(0, round(rng.lognormvariate(math.log(median), sigma)))))


def make_row(start: int, sep: str, split: str, index: int) -> dict[str, Any]:
    """One verl-schema row for ``Count down from <start> to 0, separated by <sep>``."""
    question = f"Count down from {start} to 0, separated by {sep}"
    answer = countdown(start, sep)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": "counting",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question,
                       "start": start, "response_tokens": answer_tokens(start, sep)},
    }


def make_longtail_rows(n: int, seed: int, split: str = "train") -> list[dict[str, Any]]:
    """Generate ``n`` countdown rows deterministically.

    Each row draws a start number from the lognormal law (the nearest one the split has questions
    for), then one of that number's separators in the split's pool.

    Args:
        n: number of rows (>= 0).
        seed: RNG seed; the same ``(n, seed, split)`` gives the same rows.
        split: ``"train"`` or ``"test"``/``"val"``; the two never share a question.

    Returns:
        ``n`` rows; ``extra_info`` holds ``start`` and ``response_tokens`` (the correct length).

    Raises:
        ValueError: unknown split or negative ``n``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    pool = _pool(split)
    starts = sorted(pool)
    rng = random.Random(f"longtail/{seed}/{split}")
    rows = []
    for i in range(n):
        c = draw_start(rng)
        start = min(starts, key=lambda k: (abs(k - c), k))  # a start the split has questions for
        rows.append(make_row(start, rng.choice(pool[start]), split, i))
    return rows


def longtail_task(size: int, seed: int, split: str, operators: str = "", **_: object) -> list[dict[str, Any]]:
    """The ``data.task=longtail`` generator (registered lazily in :mod:`asyncrl.data.dataset`)."""
    return make_longtail_rows(size, seed, split)

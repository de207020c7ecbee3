"""The ``arith`` task: seeded arithmetic questions in the verl dataset schema.

Every row asks one question such as ``What is 47+38?`` and expects a worked line followed by a
GSM8K-style final answer::

    47+38=85
    #### 85

The question space is split once, by a stable hash of the question text, into a *train pool* (~90%)
and a *test pool* (~10%). The split does not depend on the seed or the sizes, so a train split and a
test split generated independently (by different processes, with different seeds) never share a
question. Test rows are drawn without replacement from the test pool (recycled with a warning only when
more rows are asked for than the pool holds); train rows are drawn with replacement from the train pool
(two-digit addition has only 90 * 90 = 8100 distinct questions, fewer than the default 20000 rows).

Operand ranges (chosen so that a whole response fits in <= 20 tokens of the embedded character-level
tokenizer, EOS included, under the default ``response_length=24``):

* ``+``: two-digit + two-digit (10..99 each).
* ``-``: two-digit - two-digit with ``a >= b`` (non-negative results).
* ``*``: two-digit times one-digit, either order (10..99 times 2..9) -- a deliberate simplification:
  two-digit times two-digit would need 21+ tokens.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DATA_SOURCE = "arith"
SUPPORTED_OPERATORS = "+-*"
TEST_BUCKETS = 10
"""One question in ``TEST_BUCKETS`` (by stable hash) belongs to the test pool."""


def _operand_pairs(op: str) -> list[tuple[int, int]]:
    """All operand pairs of one operator, in a fixed order."""
    if op == "+":
        return [(a, b) for a in range(10, 100) for b in range(10, 100)]
    if op == "-":
        return [(a, b) for a in range(10, 100) for b in range(10, a + 1)]
    if op == "*":
        return [(a, b) for a in range(10, 100) for b in range(2, 10)] + [
            (b, a) for a in range(10, 100) for b in range(2, 10)
        ]
    raise ValueError(f"unsupported arith operator {op!r}; choose from {SUPPORTED_OPERATORS!r}")


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def is_test_question(expression: str) -> bool:
    """Whether an expression such as ``"47+38"`` belongs to the held-out test pool.

    Uses md5 rather than ``hash()`` so the split is identical in every process.
    """
    return hashlib.md5(expression.encode()).digest()[0] % TEST_BUCKETS == 0


def _pools(operators: str, split: str) -> dict[str, list[tuple[int, int]]]:
    if not operators:
        raise ValueError("operators must name at least one of '+', '-', '*'")
    if split not in ("train", "test", "val"):
        raise ValueError(f"split must be 'train', 'test' or 'val', got {split!r}")
    want_test = split != "train"
    pools = {}
    for op in dict.fromkeys(operators):  # unique, order kept
        pools[op] = [(a, b) for a, b in _operand_pairs(op) if is_test_question(f"{a}{op}{b}") == want_test]
    return pools


def make_row(a: int, op: str, b: int, split: str, index: int) -> dict[str, Any]:
    """One verl-schema row for the question ``a op b``.

    Returns:
        ``{"data_source", "prompt": [{"role": "user", "content"}], "ability", "reward_model":
        {"style": "rule", "ground_truth"}, "extra_info": {"split", "index", "answer", "question"}}``.
    """
    expr = f"{a}{op}{b}"
    result = _apply(op, a, b)
    question = f"What is {expr}?"
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(result)},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": f"{expr}={result}\n#### {result}",
            "question": question,
        },
    }


def make_arith_rows(n: int, seed: int, operators: str = "+", split: str = "train") -> list[dict[str, Any]]:
    """Generate ``n`` arithmetic rows deterministically.

    Each row first picks an operator uniformly from ``operators``, then a question from that
    operator's pool for ``split`` (see module docstring for the pools).

    Args:
        n: number of rows (>= 0).
        seed: RNG seed; the same ``(n, seed, operators, split)`` gives the same rows.
        operators: any non-empty combination of ``"+"``, ``"-"``, ``"*"``.
        split: ``"train"`` (with replacement from the train pool) or ``"test"``/``"val"`` (without
            replacement from the test pool; an operator whose test pool runs out is skipped, and only
            when all are used up do questions repeat, with a warning).

    Returns:
        ``n`` rows in the verl schema, ``extra_info.index`` = 0..n-1.

    Raises:
        ValueError: on an unknown operator or split, or negative ``n``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    pools = _pools(operators, split)
    rng = random.Random(f"arith/{seed}/{split}/{operators}")
    ops = list(pools)
    rows = []
    if split == "train":
        for i in range(n):
            op = rng.choice(ops)
            a, b = rng.choice(pools[op])
            rows.append(make_row(a, op, b, split, i))
        return rows
    remaining: dict[str, list[tuple[int, int]]] = {}
    for op in ops:
        remaining[op] = list(pools[op])
        rng.shuffle(remaining[op])
    for i in range(n):
        live = [op for op in ops if remaining[op]]
        if not live:  # every test question used once: recycle (only for very large test splits)
            logger.warning("arith test pool exhausted after %d rows; questions repeat", i)
            for op in ops:
                remaining[op] = list(pools[op])
                rng.shuffle(remaining[op])
            live = ops
        op = rng.choice(live)
        a, b = remaining[op].pop()
        rows.append(make_row(a, op, b, split, i))
    return rows


def write_splits(
    out_dir: str | Path,
    train_size: int = 20000,
    test_size: int = 200,
    seed: int = 0,
    operators: str = "+",
) -> dict[str, Path]:
    """Write ``train``/``test`` splits as both parquet and jsonl (verl layout).

    Args:
        out_dir: directory to create; files are ``{train,test}.{parquet,jsonl}``.
        train_size: rows in the train split.
        test_size: rows in the test split.
        seed: generator seed.
        operators: operators, as in :func:`make_arith_rows`.

    Returns:
        Mapping like ``{"train.parquet": Path, "train.jsonl": Path, "test.parquet": ..., ...}``.
    """
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for split, size in (("train", train_size), ("test", test_size)):
        rows = make_arith_rows(size, seed, operators, split)
        pq = out / f"{split}.parquet"
        pd.DataFrame(rows).to_parquet(pq, index=False)
        jl = out / f"{split}.jsonl"
        with jl.open("w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        paths[pq.name], paths[jl.name] = pq, jl
    logger.info("wrote arith splits to %s (train=%d, test=%d)", out, train_size, test_size)
    return paths

"""The ``calc_tool`` task: arithmetic the tiny model cannot do in its head, with a calculator tool.

Each row asks ``What is <expression>?`` and offers ``calculator(expression: str)``. The target
trajectory (what the warm start imitates and RL rewards)::

    user       What is 123*45?
    assistant  <tool_call>\\n{"name": "calculator", "arguments": {"expression": "123*45"}}\\n</tool_call>
    tool       5535
    assistant  #### 5535

Expression shapes (one drawn uniformly per row), chosen so that a whole trajectory fits the embedded
model's 512-token context next to the tool schema in the system prompt:

* ``a*b``: three-digit times two-digit;
* ``a*b+c``: two-digit times two-digit plus three-digit;
* ``a*b-c``: two-digit times two-digit minus two-digit (never negative);
* ``a+b+c``: three three-digit numbers.

Rows are in the verl schema with ``data_source="calc_tool"`` (scored by the gsm8k-style rule on the
final ``#### <number>``), ``agent_name="tool_agent"``, the tool schema in ``tools`` and
``extra_info.tool_selection=["calculator"]``. As in :mod:`asyncrl.data.arith`, a stable md5 hash of
the expression puts one question in ten into the test pool, so train and test never share a question
whatever the seeds and sizes. Importing this module registers the task (``data.task=calc_tool``).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Callable

from asyncrl.agent_loop.tools.calculator import CALCULATOR_SCHEMA
from asyncrl.data.dataset import register_task

DATA_SOURCE = "calc_tool"
AGENT_NAME = "tool_agent"
TOOL_NAME = "calculator"
TEST_BUCKETS = 10

_SHAPES: dict[str, Callable[[random.Random], tuple[str, int]]] = {}


def _shape(name: str) -> Callable:
    def deco(fn: Callable[[random.Random], tuple[str, int]]) -> Callable:
        _SHAPES[name] = fn
        return fn
    return deco


@_shape("a*b")
def _mul(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(100, 999), rng.randint(10, 99)
    return f"{a}*{b}", a * b


@_shape("a*b+c")
def _mul_add(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(100, 999)
    return f"{a}*{b}+{c}", a * b + c


@_shape("a*b-c")
def _mul_sub(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(10, 99)
    return f"{a}*{b}-{c}", a * b - c


@_shape("a+b+c")
def _add3(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(100, 999), rng.randint(100, 999), rng.randint(100, 999)
    return f"{a}+{b}+{c}", a + b + c


def is_test_question(expression: str) -> bool:
    """Whether ``expression`` (e.g. ``"123*45"``) belongs to the held-out pool (md5, process-stable)."""
    return hashlib.md5(f"calc_tool/{expression}".encode()).digest()[0] % TEST_BUCKETS == 0


def make_row(expression: str, result: int, split: str, index: int) -> dict[str, Any]:
    """One verl-schema row.

    Returns:
        ``{"data_source", "agent_name", "prompt", "tools", "ability", "reward_model",
        "extra_info": {"split", "index", "question", "expression", "answer", "tool_selection"}}``;
        ``extra_info.answer`` is the final assistant text (``"#### <result>"``).
    """
    question = f"What is {expression}?"
    return {
        "data_source": DATA_SOURCE,
        "agent_name": AGENT_NAME,
        "prompt": [{"role": "user", "content": question}],
        "tools": [CALCULATOR_SCHEMA],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(result)},
        "extra_info": {
            "split": split,
            "index": index,
            "question": question,
            "expression": expression,
            "answer": f"#### {result}",
            "tool_selection": [TOOL_NAME],
        },
    }


def make_calc_tool_rows(n: int, seed: int, split: str = "train", shapes: str = "") -> list[dict[str, Any]]:
    """Generate ``n`` rows deterministically.

    Args:
        n: number of rows (>= 0).
        seed: RNG seed; the same ``(n, seed, split, shapes)`` gives the same rows.
        split: ``"train"`` or ``"test"`` / ``"val"`` (disjoint question pools, see module docstring).
        shapes: comma-separated subset of ``a*b,a*b+c,a*b-c,a+b+c``; empty = all.

    Returns:
        ``n`` rows; test rows never repeat a question (the pools hold ~10^5 questions or more).

    Raises:
        ValueError: unknown split or shape, or negative ``n``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if split not in ("train", "test", "val"):
        raise ValueError(f"split must be 'train', 'test' or 'val', got {split!r}")
    names = [s.strip() for s in shapes.split(",") if s.strip()] or list(_SHAPES)
    unknown = [s for s in names if s not in _SHAPES]
    if unknown:
        raise ValueError(f"unknown calc_tool shapes {unknown}; choose from {list(_SHAPES)}")
    want_test = split != "train"
    rng = random.Random(f"calc_tool/{seed}/{split}/{','.join(names)}")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(rows) < n:
        expression, result = _SHAPES[rng.choice(names)](rng)
        if is_test_question(expression) != want_test or (want_test and expression in seen):
            continue
        seen.add(expression)
        rows.append(make_row(expression, result, split, len(rows)))
    return rows


def demonstration(row: dict[str, Any], call_tool: bool = True) -> list[dict[str, Any]]:
    """The target conversation for a row (what the warm start imitates).

    Args:
        row: a row from :func:`make_calc_tool_rows`.
        call_tool: ``True`` for the tool trajectory (user, assistant call, tool result, answer);
            ``False`` for a direct answer without the tool (used to leave the warm start partial).

    Returns:
        OpenAI-style messages, the row's prompt first; tool-call arguments as a dict.
    """
    result = row["reward_model"]["ground_truth"]
    answer = {"role": "assistant", "content": row["extra_info"]["answer"]}
    if not call_tool:
        return list(row["prompt"]) + [answer]
    call = {"type": "function", "function": {"name": TOOL_NAME,
                                             "arguments": {"expression": row["extra_info"]["expression"]}}}
    return list(row["prompt"]) + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": str(result), "name": TOOL_NAME},
        answer,
    ]


def _task(size: int, seed: int, split: str, operators: str) -> list[dict[str, Any]]:
    """Registry adapter: ``operators`` (an ``arith`` knob) does not apply to this task."""
    return make_calc_tool_rows(size, seed, split)


register_task(DATA_SOURCE, _task)

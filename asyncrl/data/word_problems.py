"""The ``word_problems`` task: GSM8K-style multi-step word problems, generated procedurally.

Each problem follows one person's stock of one kind of item through a few steps and asks for the
final count::

    Mia has 12 apples. She buys 3 bags with 5 apples in each bag. Then she gives 7 apples to her
    brother. How many apples does Mia have now?

with a GSM8K-style worked answer (``extra_info.answer``)::

    Mia starts with 12 apples.
    She buys 3*5=15 apples, so she has 12+15=27.
    She gives away 7, so she has 27-7=20.
    #### 20

Difficulty knobs (``data.word_problems.*``): ``min_steps`` / ``max_steps`` (operations after the
start, each one sentence; a ``k bags of m`` step is two operations' worth of reasoning) and
``max_number`` (largest number written in the question; intermediate counts stay below
``max_number ** 2``). Step kinds: ``add`` (finds / buys / is given k), ``sub`` (gives away / sells /
eats k, never below zero), ``groups`` (buys k groups of m), ``mult`` (the count doubles / triples),
``share`` (splits the stock equally into k parts and keeps one; only when k divides it).

Rows are in the verl schema with ``data_source="word_problems"``; the rule reward
(:func:`compute_score`) gives ``1.0`` for a well-formed correct answer, ``FORMAT_SCORE`` for a
well-formed wrong one, ``MARKER_SCORE`` for another answer with a ``####`` marker and ``0.0``
otherwise, and reports ``acc`` and ``format`` separately (verl's
dict-valued reward: ``eval/acc`` is the held-out accuracy, ``eval/format`` the well-formed rate).
As in :mod:`asyncrl.data.arith`, a stable md5 hash of the question text puts one question in ten
into the test pool, so train and test never share a question. Importing this module registers the
task (``data.task=word_problems``) and its reward.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from asyncrl.data.dataset import register_task
from asyncrl.reward import gsm8k, register_reward

DATA_SOURCE = "word_problems"
TEST_BUCKETS = 10
FORMAT_SCORE = 0.2
"""Reward of a well-formed (``#### <integer>`` last) but wrong answer (verl gsm8k's ``format_score``)."""
MARKER_SCORE = 0.1
"""Reward of an answer with a ``#### <number>`` marker that is not well-formed (text after it, not an
integer). SmolLM2-135M-Instruct samples a well-formed answer less than once in 16 tries at temperature
1.0, so with only the two scores above GRPO saw all-zero groups (no signal) for its first steps; the
marker, which it writes about a quarter of the time, gives the groups something to rank."""
INSTRUCTION = "Solve the problem step by step. On the last line, write only the final answer as: #### <number>"
"""Appended to each question (the user message)."""

NAMES = [("Mia", "she", "her"), ("Tom", "he", "his"), ("Ava", "she", "her"), ("Leo", "he", "his"),
         ("Zoe", "she", "her"), ("Sam", "he", "his"), ("Ella", "she", "her"), ("Ben", "he", "his"),
         ("Nora", "she", "her"), ("Omar", "he", "his"), ("Lily", "she", "her"), ("Ivan", "he", "his")]
ITEMS = [("apples", "bags"), ("stickers", "packs"), ("marbles", "jars"), ("pencils", "boxes"),
         ("cookies", "trays"), ("books", "boxes"), ("cards", "decks"), ("shells", "buckets"),
         ("eggs", "cartons"), ("coins", "purses")]
OTHERS = ["{poss} brother", "a friend", "{poss} sister", "a classmate", "the teacher", "a neighbour"]
_WELL_FORMED = re.compile(r"####[ \t]*(-?\d+)\s*$")


@dataclass
class Step:
    """One sentence of a problem and its worked line."""

    sentence: str
    work: str
    value: int


def _add(rng: random.Random, n: int, name: str, pron: str, poss: str, item: str, group: str, hi: int) -> Optional[Step]:
    k = rng.randint(2, hi)
    verb = rng.choice([f"{pron} finds {k} more {item}", f"{pron} buys {k} more {item}",
                       f"{rng.choice(OTHERS).format(poss=poss)} gives {name} {k} {item}"])
    return Step(verb[0].upper() + verb[1:] + ".", f"{name} gets {k} more, so {pron} has {n}+{k}={n + k}.", n + k)


def _sub(rng: random.Random, n: int, name: str, pron: str, poss: str, item: str, group: str, hi: int) -> Optional[Step]:
    if n < 3:
        return None
    k = rng.randint(1, min(hi, n - 1))
    verb = rng.choice([f"{pron} gives {k} {item} to {rng.choice(OTHERS).format(poss=poss)}", f"{pron} sells {k} of {poss} {item}",
                       f"{pron} loses {k} {item}"])
    return Step(verb[0].upper() + verb[1:] + ".", f"{name} gives away {k}, so {pron} has {n}-{k}={n - k}.", n - k)


def _groups(rng: random.Random, n: int, name: str, pron: str, poss: str, item: str, group: str, hi: int) -> Optional[Step]:
    k, m = rng.randint(2, max(2, min(9, hi))), rng.randint(2, max(2, min(12, hi)))
    s = f"{pron.capitalize()} buys {k} {group} with {m} {item} in each."
    return Step(s, f"{name} buys {k}*{m}={k * m} {item}, so {pron} has {n}+{k * m}={n + k * m}.", n + k * m)


def _mult(rng: random.Random, n: int, name: str, pron: str, poss: str, item: str, group: str, hi: int) -> Optional[Step]:
    k, word = rng.choice([(2, "doubles"), (3, "triples")])
    return Step(f"Then the number of {item} {name} has {word}.", f"It {word}: {n}*{k}={n * k}.", n * k)


def _share(rng: random.Random, n: int, name: str, pron: str, poss: str, item: str, group: str, hi: int) -> Optional[Step]:
    ks = [k for k in (2, 3, 4, 5) if n % k == 0 and n // k >= 1]
    if not ks or n < 4:
        return None
    k = rng.choice(ks)
    one = group[:-2] if group.endswith("xes") else group[:-1]
    s = f"{pron.capitalize()} splits {poss} {item} equally into {k} {group} and keeps one {one}."
    return Step(s, f"{name} keeps one of {k} equal parts: {n}/{k}={n // k}.", n // k)


STEP_KINDS: dict[str, Callable[..., Optional[Step]]] = {"add": _add, "sub": _sub, "groups": _groups, "mult": _mult,
                                                         "share": _share}


def is_test_question(question: str) -> bool:
    """Whether a question text belongs to the held-out test pool (md5, identical in every process)."""
    return hashlib.md5(question.encode()).digest()[0] % TEST_BUCKETS == 0


def make_problem(rng: random.Random, min_steps: int = 2, max_steps: int = 3, max_number: int = 20) -> dict[str, Any]:
    """One problem: ``{"question", "answer" (worked, ends ``#### n``), "result", "steps"}``.

    Raises:
        ValueError: ``min_steps < 1``, ``max_steps < min_steps`` or ``max_number < 5``.
    """
    if min_steps < 1 or max_steps < min_steps:
        raise ValueError(f"need 1 <= min_steps <= max_steps, got {min_steps}, {max_steps}")
    if max_number < 5:
        raise ValueError(f"max_number must be >= 5, got {max_number}")
    name, pron, poss = rng.choice(NAMES)
    item, group = rng.choice(ITEMS)
    n = rng.randint(3, max_number)
    sentences, work = [f"{name} has {n} {item}."], [f"{name} starts with {n} {item}."]
    cap = max_number * max_number
    kinds = list(STEP_KINDS)
    steps = rng.randint(min_steps, max_steps)
    done = 0
    while done < steps:
        kind = rng.choice(kinds)
        if kind == "mult" and n * 3 > cap:
            continue
        step = STEP_KINDS[kind](rng, n, name, pron, poss, item, group, max_number)
        if step is None or step.value > cap:
            continue
        sentences.append(step.sentence)
        work.append(step.work)
        n = step.value
        done += 1
    sentences.append(f"How many {item} does {name} have now?")
    return {"question": " ".join(sentences), "answer": "\n".join(work + [f"#### {n}"]), "result": n, "steps": steps}


def make_word_problem_rows(n: int, seed: int, split: str = "train", min_steps: int = 2, max_steps: int = 3,
                           max_number: int = 20) -> list[dict[str, Any]]:
    """Generate ``n`` verl-schema rows deterministically.

    Args:
        n: number of rows (>= 0).
        seed: the same ``(n, seed, split, knobs)`` gives the same rows.
        split: ``"train"`` or ``"test"``/``"val"``; questions are drawn until one falls in the split's
            pool (test rows are distinct from each other; train rows may repeat only by chance).
        min_steps, max_steps, max_number: difficulty (module docstring).

    Returns:
        Rows ``{"data_source", "prompt": [{"role": "user", "content"}], "ability", "reward_model":
        {"style": "rule", "ground_truth"}, "extra_info": {"split", "index", "question", "answer", "steps"}}``.

    Raises:
        ValueError: negative ``n``, unknown split, or bad difficulty knobs.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if split not in ("train", "test", "val"):
        raise ValueError(f"split must be 'train', 'test' or 'val', got {split!r}")
    want_test = split != "train"
    rng = random.Random(f"word_problems/{seed}/{split}/{min_steps}/{max_steps}/{max_number}")
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    tries = 0
    while len(rows) < n:
        tries += 1
        if tries > 200 * (n + 10):
            raise ValueError(f"could not draw {n} distinct {split} problems with these knobs; raise max_number/max_steps")
        p = make_problem(rng, min_steps, max_steps, max_number)
        if is_test_question(p["question"]) != want_test or (want_test and p["question"] in seen):
            continue
        seen.add(p["question"])
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{p['question']}\n{INSTRUCTION}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(p["result"])},
            "extra_info": {"split": split, "index": len(rows), "question": p["question"], "answer": p["answer"],
                           "steps": p["steps"]},
        })
    return rows


# ------------------------------------------------------------------ reward


def is_well_formed(solution_str: str) -> bool:
    """The response ends with ``#### <integer>`` (only whitespace after it)."""
    return _WELL_FORMED.search(solution_str) is not None


def compute_score(solution_str: str, ground_truth: str, format_score: float = FORMAT_SCORE,
                  marker_score: float = MARKER_SCORE) -> dict[str, float]:
    """Rule reward for one decoded response (special tokens skipped).

    Args:
        solution_str: the response text.
        ground_truth: the expected integer as a string.
        format_score: reward of a well-formed wrong answer.
        marker_score: reward of an answer that has a ``#### <number>`` marker but is not well-formed.

    Returns:
        ``{"score", "acc", "format"}``: ``acc`` is 1.0 if the last ``#### n`` equals the ground truth
        (gsm8k extraction; also counts when not well-formed), ``format`` 1.0 if well-formed. The
        score is 1.0 for a well-formed correct answer, ``format_score`` for a well-formed wrong one,
        ``marker_score`` for any other answer with a marker (a correct number followed by more text
        included), else 0.0.
    """
    acc = float(gsm8k.compute_score(solution_str, ground_truth) > 0)
    fmt = float(is_well_formed(solution_str))
    if fmt:
        score = 1.0 if acc else format_score
    else:
        score = marker_score if gsm8k.extract_answer(solution_str) is not None else 0.0
    return {"score": score, "acc": acc, "format": fmt}


def _task(size: int, seed: int, split: str, operators: str = "", **knobs: Any) -> list[dict[str, Any]]:
    """Task generator (``data.task=word_problems``); ``knobs`` come from ``data.word_problems``."""
    return make_word_problem_rows(size, seed, split, **knobs)


register_task(DATA_SOURCE, _task)
register_reward(DATA_SOURCE, compute_score)

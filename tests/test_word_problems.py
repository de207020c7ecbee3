"""The word_problems task: generator, difficulty knobs, split, config wiring and the rule reward."""

import re

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.data.dataset import get_task_rows, task_options
from asyncrl.data.word_problems import (FORMAT_SCORE, MARKER_SCORE, compute_score, is_test_question,
                                        is_well_formed, make_problem, make_word_problem_rows)
from asyncrl.reward import compute_score as dispatch_score


def _replay(answer: str) -> int:
    """Re-evaluate every ``a op b = c`` of a worked answer; return the final ``#### n``."""
    for a, op, b, c in re.findall(r"(\d+)([-+*/])(\d+)=(\d+)", answer):
        expected = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) // int(b)}[op]
        assert int(c) == expected, answer
        if op == "/":
            assert int(a) % int(b) == 0, answer
    return int(answer.rsplit("#### ", 1)[1])


def test_rows_are_verl_schema_and_answers_are_right():
    rows = make_word_problem_rows(300, seed=0)
    for r in rows:
        assert set(r) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
        assert r["data_source"] == "word_problems" and r["reward_model"]["style"] == "rule"
        (msg,) = r["prompt"]
        assert msg["role"] == "user" and msg["content"].endswith("#### <number>")
        info = r["extra_info"]
        assert msg["content"].startswith(info["question"]) and info["question"].endswith("have now?")
        assert _replay(info["answer"]) == int(r["reward_model"]["ground_truth"]) >= 0
        # the worked answer is a well-formed, correct response
        assert compute_score(info["answer"], r["reward_model"]["ground_truth"]) == {"score": 1.0, "acc": 1.0,
                                                                                      "format": 1.0}


def test_deterministic_and_seed_dependent():
    assert make_word_problem_rows(20, seed=3) == make_word_problem_rows(20, seed=3)
    assert make_word_problem_rows(20, seed=3) != make_word_problem_rows(20, seed=4)


def test_train_and_test_never_share_a_question():
    train = make_word_problem_rows(2000, seed=1, split="train")
    test = make_word_problem_rows(200, seed=7, split="test")
    tq = {r["extra_info"]["question"] for r in test}
    assert len(tq) == 200  # test questions are distinct
    assert not tq & {r["extra_info"]["question"] for r in train}
    assert all(is_test_question(q) for q in tq)


@pytest.mark.parametrize("lo,hi,max_number", [(1, 1, 10), (2, 3, 20), (4, 5, 50)])
def test_difficulty_knobs(lo, hi, max_number):
    import random

    rng = random.Random(0)
    for _ in range(200):
        p = make_problem(rng, lo, hi, max_number)
        assert lo <= p["steps"] <= hi
        assert p["answer"].count("\n") == p["steps"] + 1  # start line + one line per step + answer
        assert 0 <= p["result"] <= max_number * max_number
        assert max(int(x) for x in re.findall(r"\d+", p["question"])) <= max(max_number, 12)


def test_bad_knobs_raise():
    with pytest.raises(ValueError, match="min_steps"):
        make_word_problem_rows(2, 0, min_steps=3, max_steps=2)
    with pytest.raises(ValueError, match="max_number"):
        make_word_problem_rows(2, 0, max_number=2)
    with pytest.raises(ValueError, match="split"):
        make_word_problem_rows(2, 0, split="dev")


def test_config_section_reaches_the_generator():
    cfg = load_config(overrides=["data.task=word_problems", "data.word_problems.min_steps=4",
                                 "data.word_problems.max_steps=4", "data.word_problems.max_number=30"])
    opts = task_options(cfg.data)
    assert opts == {"min_steps": 4, "max_steps": 4, "max_number": 30}
    rows = get_task_rows("word_problems", "train", 10, 0, **opts)
    assert all(r["extra_info"]["steps"] == 4 for r in rows)
    assert task_options(load_config(overrides=["data.task=arith"]).data) == {}
    with pytest.raises(ConfigError, match="data.word_problems.max_steps"):
        load_config(overrides=["data.word_problems.max_step=4"])


@pytest.mark.parametrize("response,gt,expected", [
    ("Mia has 12+15=27.\n#### 27", "27", (1.0, 1.0, 1.0)),
    ("#### 27\n", "27", (1.0, 1.0, 1.0)),                    # trailing whitespace is fine
    ("The answer is 27.\n####27", "27", (1.0, 1.0, 1.0)),     # no space after the marker
    ("so 20.\n#### 21", "20", (FORMAT_SCORE, 0.0, 1.0)),     # well-formed, wrong
    ("#### 20 apples", "20", (MARKER_SCORE, 1.0, 0.0)),     # right number, text after it
    ("#### 80\nThe final answer is 80.", "80", (MARKER_SCORE, 1.0, 0.0)),  # SmolLM2's habit
    ("#### 20.5", "20", (MARKER_SCORE, 0.0, 0.0)),          # not an integer
    ("The answer is 20.", "20", (0.0, 0.0, 0.0)),           # no marker
    ("#### 1,200", "1200", (MARKER_SCORE, 1.0, 0.0)),       # commas: gsm8k reads it, not well-formed
    ("####", "20", (0.0, 0.0, 0.0)),                        # a marker without a number
    ("#### 5\n#### 20", "20", (1.0, 1.0, 1.0)),             # the last marker counts
    ("#### 20\n#### 5", "20", (FORMAT_SCORE, 0.0, 1.0)),
    ("", "20", (0.0, 0.0, 0.0)),
])
def test_reward_on_hand_made_cases(response, gt, expected):
    got = compute_score(response, gt)
    assert (got["score"], got["acc"], got["format"]) == expected
    assert is_well_formed(response) == bool(expected[2])
    assert dispatch_score("word_problems", response, gt) == got  # registered by data_source


def test_cpu_recipe_is_reachable_by_task_and_name():
    from asyncrl.recipes import RECIPES, TASK_RECIPES, smollm2_word_problems

    assert RECIPES["smollm2_word_problems"] is TASK_RECIPES["word_problems"] is smollm2_word_problems
    cfg = smollm2_word_problems("/nonexistent/model")  # a path given: nothing is fetched
    assert cfg.data.task == "word_problems" and cfg.actor_rollout_ref.model.path == "/nonexistent/model"
    assert cfg.async_training.partial_rollout and cfg.async_training.staleness_threshold > 0  # mode d


def test_gpu_recipe_builds_with_the_gpu_keys():
    from asyncrl.config import valid_keys
    from asyncrl.recipes import SMOLLM2_GPU_OVERRIDES, smollm2_word_problems_gpu

    missing = [o.split("=")[0] for o in SMOLLM2_GPU_OVERRIDES if o.split("=")[0] not in valid_keys()]
    if missing:
        pytest.skip(f"GPU config keys not in this asyncrl yet: {missing}")
    cfg = smollm2_word_problems_gpu("/nonexistent/model")
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2" and cfg.actor_rollout_ref.rollout.name == "hf"
    assert cfg.trainer.n_gpus_per_node == cfg.rollout.n_gpus_per_node == 1
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.backend == "nccl"
    assert cfg.trainer.total_training_steps == 100 and cfg.actor_rollout_ref.rollout.n == 8

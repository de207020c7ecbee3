"""The gsm8k-style rule reward."""

import pytest

from asyncrl.reward import REWARD_FNS, compute_score, register_reward
from asyncrl.reward.gsm8k import extract_answer


@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("47+38=85\n#### 85", "85", 1.0),  # correct
        ("47+38=84\n#### 84", "85", 0.0),  # wrong
        ("47+38=85", "85", 0.0),  # missing marker
        ("#### 85\n" + "x" * 300, "85", 0.0),  # marker only before the last 300 chars
        ("x" * 300 + "#### 85", "85", 1.0),  # marker inside the last 300 chars
        ("#### 12\nno, wait\n#### 85", "85", 1.0),  # last marker wins
        ("#### 85\nno, wait\n#### 12", "85", 0.0),
        ("10-47=-37\n#### -37", "-37", 1.0),  # negative
        ("#### 37", "-37", 0.0),
        ("#### 1,234", "1234", 1.0),  # commas
        ("#### $1,234", "1,234", 1.0),  # dollar sign, comma in truth
        ("#### 85.", "85", 1.0),  # sentence full stop
        ("#### 85.0", "85", 1.0),  # numerically equal
        ("####", "85", 0.0),
        ("", "85", 0.0),
    ],
)
def test_gsm8k_cases(response, truth, score):
    assert compute_score("arith", response, truth) == score
    assert compute_score("openai/gsm8k", response, truth) == score
    assert compute_score("unknown_source", response, truth) == score  # default is gsm8k-style


def test_extract_answer_and_int_truth():
    assert extract_answer("a\n#### -1,000") == "-1000"
    assert extract_answer("no answer") is None
    assert compute_score("arith", "#### 85", 85) == 1.0


def test_dispatch_by_data_source():
    try:
        register_reward("always_one", lambda s, gt: 1.0)
        assert compute_score("always_one", "nothing", "85") == 1.0
    finally:
        REWARD_FNS.pop("always_one", None)

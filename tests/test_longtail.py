"""The ``longtail`` countdown task and the synthetic length workload."""

import statistics

import pytest

from asyncrl.config import ConfigError, LengthWorkloadConfig, load_config
from asyncrl.data import get_task_rows
from asyncrl.data.length_workload import LengthWorkload
from asyncrl.data.longtail import MAX_START, answer_tokens, countdown, make_longtail_rows
from asyncrl.reward import compute_score
from asyncrl.rollout.base import SamplingParams


def test_countdown_rows_have_the_right_answer_and_reward():
    rows = get_task_rows("longtail", "train", 300, seed=0)
    for r in rows:
        q = r["prompt"][0]["content"]
        head, sep = q.split(" to 0, separated by ")
        start = int(head[len("Count down from "):])
        assert 0 <= start <= MAX_START and r["extra_info"]["start"] == start
        assert r["reward_model"]["ground_truth"] == countdown(start, sep)
        assert r["extra_info"]["response_tokens"] == len(r["reward_model"]["ground_truth"]) + 1
    r = rows[0]
    gt = r["reward_model"]["ground_truth"]
    assert compute_score("longtail", gt + "\n", gt) == 1.0
    assert compute_score("longtail", gt + " -1", gt) == 0.0
    assert countdown(3, ";") == "3;2;1;0" and answer_tokens(0) == 2


def test_train_and_test_never_share_a_question_and_are_deterministic():
    train = make_longtail_rows(3000, seed=1, split="train")
    test = make_longtail_rows(200, seed=1, split="test")
    assert not {r["extra_info"]["question"] for r in train} & {r["extra_info"]["question"] for r in test}
    assert make_longtail_rows(50, 1) == make_longtail_rows(50, 1) != make_longtail_rows(50, 2)


def test_response_length_spans_two_orders_of_magnitude_with_a_heavy_tail():
    lengths = sorted(r["extra_info"]["response_tokens"] for r in make_longtail_rows(5000, seed=0))
    assert lengths[0] <= 3 and lengths[-1] >= 300  # > 100x between the shortest and the longest
    median, p99 = lengths[len(lengths) // 2], lengths[int(0.99 * len(lengths))]
    mean = statistics.fmean(lengths)
    assert median < mean < 3 * median  # right-skewed
    assert p99 > 8 * median  # heavy tail: a 32-prompt synchronous batch waits for a rare long answer


def test_length_workload_draws_deterministic_clipped_lengths():
    cfg = LengthWorkloadConfig(distribution="lognormal", median=40, sigma=1.0, min_tokens=2, max_tokens=300)
    wl = LengthWorkload(cfg, response_length=256, seed=0)
    assert wl.enabled and wl.max_tokens == 256  # capped by rollout.response_length
    assert wl.lengths(7, 8) == wl.lengths(7, 8) != wl.lengths(8, 8)
    many = [x for i in range(400) for x in wl.lengths(i, 4)]
    assert min(many) >= 2 and max(many) <= 256
    assert 30 <= statistics.median(many) <= 52
    base = SamplingParams(max_tokens=256, stop_token_ids=[258], temperature=0.7)
    sps = wl.sampling_params(base, 3, 4)
    assert [s.max_tokens for s in sps] == wl.lengths(3, 4)
    assert all(s.ignore_eos and s.stop_token_ids == [] and s.temperature == 0.7 for s in sps)
    assert base.stop_token_ids == [258] and not base.ignore_eos  # the shared params are untouched


@pytest.mark.parametrize("dist,check", [
    ("constant", lambda xs: set(xs) == {50}),
    ("uniform", lambda xs: min(xs) == 1 and max(xs) == 100),
    ("pareto", lambda xs: min(xs) >= 4 and statistics.median(xs) < 10 and max(xs) == 100),
])
def test_other_length_laws(dist, check):
    wl = LengthWorkload(LengthWorkloadConfig(distribution=dist, median=50, alpha=1.2, min_tokens=4 if dist == "pareto" else 1),
                        response_length=100)
    assert check([x for i in range(300) for x in wl.lengths(i, 4)])


def test_length_workload_and_hybrid_engine_config_keys():
    cfg = load_config(overrides=["data.length_workload.distribution=pareto", "data.length_workload.alpha=1.3",
                                 "actor_rollout_ref.hybrid_engine=True", "async_training.staleness_threshold=0",
                                 "actor_rollout_ref.model.tokenizer_path=/tmp/tok", "data.task=longtail"])
    assert cfg.data.length_workload.distribution == "pareto" and cfg.actor_rollout_ref.hybrid_engine
    with pytest.raises(ConfigError, match="staleness_threshold=0"):
        load_config(overrides=["actor_rollout_ref.hybrid_engine=True"])  # default staleness 0.5
    with pytest.raises(ConfigError, match="data.length_workload.distribution"):
        load_config(overrides=["data.length_workload.distribution=zipf"])
    with pytest.raises(ConfigError, match=r"data.length_workload.alpha=0.0 must be > 0 \(with distribution=.pareto.\)"):
        load_config(overrides=["data.length_workload.distribution=pareto", "data.length_workload.alpha=0"])

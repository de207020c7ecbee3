"""The rule rewards (gsm8k-style), their dispatch by data_source, and verl's custom_reward_function."""

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


KNOWN = "arith, calc_tool, gsm8k, longtail, openai/gsm8k, word_problems"
CUSTOM_FIX = ("set custom_reward_function.path to a .py file whose compute_score(data_source, solution_str, "
              "ground_truth, extra_info) scores every row")


def test_a_data_source_with_no_reward_function_is_an_error_not_the_gsm8k_scorer():
    """A fresh user's ``data_source: my_task`` was scored by the gsm8k rule with a WARNING in an actor's log (a
    reward of 0 for answers of any other form); verl's ``default_compute_score`` raises ``NotImplementedError``."""
    from asyncrl.registry import UnknownNameError
    from asyncrl.reward import UnknownDataSourceError, reward_problem

    here = (f"data_source 'my_task' has no reward function (known: {KNOWN}); name a known one (gsm8k: the number "
            f"after the last '####'), register one with asyncrl.reward.register_reward(name, fn), or {CUSTOM_FIX}")
    with pytest.raises(UnknownDataSourceError) as info:
        compute_score("my_task", "#### 85", "85")
    assert str(info.value) == reward_problem("my_task") == here
    assert isinstance(info.value, UnknownNameError) and isinstance(info.value, KeyError)
    assert reward_problem("my_task", every_process=True) == here.replace(
        " register one with asyncrl.reward.register_reward(name, fn),", "")
    assert "(known: " + KNOWN + "; did you mean 'gsm8k'?); " in reward_problem("GSM8k")
    assert all(reward_problem(s, every_process=True) is None for s in KNOWN.split(", "))
    try:  # registered in the driver: this process scores with it, the Ray actors of a run never see it
        register_reward("my_task", lambda s, gt: 1.0)
        assert reward_problem("my_task") is None and compute_score("my_task", "x", "1") == 1.0
        assert reward_problem("my_task", every_process=True) == (
            "data_source 'my_task' has a reward function registered in this process only "
            f"(asyncrl.reward.register_reward): the Ray actors that score a run never see it; {CUSTOM_FIX}")
    finally:
        REWARD_FNS.pop("my_task", None)


def test_source_check_is_off_when_a_custom_reward_function_scores_every_row():
    from asyncrl.config import ExperimentConfig
    from asyncrl.reward import source_check

    cfg = ExperimentConfig()
    assert source_check(cfg)("my_task").startswith("data_source 'my_task' has no reward function")
    assert "registered in this process only" not in source_check(cfg, every_process=True)("my_task")
    cfg.custom_reward_function.path = "my_reward.py"
    assert source_check(cfg) is None and source_check(cfg, every_process=True) is None


CUSTOM = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str.strip() == ground_truth), "source_is_mine": float(data_source == "my_task")}

def by_length(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str) / (extra_info or {}).get("scale", 1)

NOT_A_FUNCTION = 3
'''


def test_custom_reward_function_is_loaded_from_its_file_and_called_by_keyword(tmp_path):
    """verl's ``custom_reward_function.path`` / ``.name``: the function scores every row whatever its data_source,
    called with verl's keywords; unset, the rule reward of the row's data_source scores it."""
    from asyncrl.config import ExperimentConfig
    from asyncrl.reward.custom import load_custom_reward, scorer

    (tmp_path / "my_reward.py").write_text(CUSTOM)
    path = str(tmp_path / "my_reward.py")
    assert load_custom_reward(path)("my_task", " 42 ", "42") == {"score": 1.0, "source_is_mine": 1.0}
    assert load_custom_reward(path, "by_length")("arith", "abcd", "1", extra_info={"scale": 2}) == 2.0
    cfg = ExperimentConfig()
    assert scorer(cfg) is compute_score
    cfg.custom_reward_function.path, cfg.custom_reward_function.name = path, "by_length"
    assert scorer(cfg)("anything", "abc", "x") == 3.0


@pytest.mark.parametrize("path, name, says", [
    ("", "compute_score", r"^custom_reward_function.path='' is an empty path: give a .py file, or null \(omit the key\) "
                          r"to score each row by the rule reward of its data_source$"),
    ("missing.py", "compute_score", r"^custom_reward_function.path='.*missing.py': no such file \(a .py file defining "
                                    r"compute_score\(data_source, solution_str, ground_truth, extra_info\)\)$"),
    ("broken.py", "compute_score", r"^custom_reward_function.path='.*broken.py' failed to import: ZeroDivisionError: "
                                   r"division by zero$"),
    ("my_reward.py", "score", r"^custom_reward_function.name='score': .*my_reward.py defines no function 'score' "
                              r"\(its functions: by_length, compute_score\)$"),
    ("my_reward.py", "NOT_A_FUNCTION", r"^custom_reward_function.name='NOT_A_FUNCTION': .*my_reward.py sets "
                                       r"NOT_A_FUNCTION to int 3, not a function \(its functions: by_length, "
                                       r"compute_score\)$"),
])
def test_a_custom_reward_function_that_cannot_load_is_a_config_error(tmp_path, path, name, says):
    from asyncrl.config import ConfigError
    from asyncrl.reward.custom import load_custom_reward

    (tmp_path / "my_reward.py").write_text(CUSTOM)
    (tmp_path / "broken.py").write_text("x = 1 / 0\n")
    with pytest.raises(ConfigError, match=says):
        load_custom_reward(str(tmp_path / path) if path else path, name)


def test_the_agent_loop_worker_scores_with_the_custom_reward_function(tmp_path, model_dir):
    """The worker (in the rollouter's process or an actor of its own, which never run the driver's code) loads the
    file named by the config and scores a row whose data_source has no rule reward."""
    import asyncio

    from fake_replica import FakeAbortingReplica, FakePool

    from asyncrl.agent_loop.base import AGENT_LOOPS, AgentLoopBase, AgentLoopOutput, register
    from asyncrl.agent_loop.worker import AgentLoopWorker
    from asyncrl.config import ExperimentConfig
    from asyncrl.rollout.base import SamplingParams

    @register("test_answers_42")
    class Answers42(AgentLoopBase):
        async def run(self, sampling_params, **sample):
            ids = self.tokenizer.encode("42", add_special_tokens=False)
            return AgentLoopOutput(list(sample["prompt_ids"]), ids, [1] * len(ids), [-0.5] * len(ids),
                                   response_versions=[0] * len(ids))

    (tmp_path / "my_reward.py").write_text(CUSTOM)
    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.model.path = str(model_dir)
    cfg.custom_reward_function.path = str(tmp_path / "my_reward.py")
    row = {"agent_name": "test_answers_42", "data_source": "my_task", "prompt": [{"role": "user", "content": "6*7?"}],
           "reward_model": {"ground_truth": "42"}}
    try:
        worker = AgentLoopWorker(cfg, FakePool({"r": FakeAbortingReplica()}))
        outs = asyncio.run(worker.generate_sequences_single(row, "u", SamplingParams(), 2, prompt_ids=[1, 2]))
    finally:
        AGENT_LOOPS.pop("test_answers_42", None)
    assert [(o.reward_score, o.metrics["reward/source_is_mine"]) for o in outs] == [(1.0, 1.0)] * 2

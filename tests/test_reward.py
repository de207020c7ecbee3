"""The rule rewards (gsm8k-style), their dispatch by data_source, and verl's custom_reward_function."""

import re

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


def test_a_reward_files_output_at_import_goes_to_stderr_below_python_too(tmp_path, capfd, monkeypatch):
    """``print`` at import went to stderr, but a raw ``os.write(1, ...)`` or a C extension's output (here libc's
    ``printf``, buffered) bypassed ``sys.stdout`` and landed in ``asyncrl train --dry-run``'s YAML on stdout. The
    descriptor is used by number: as in a Jupyter kernel, ``sys.stdout`` here has no descriptor of its own."""
    import io
    import os

    from asyncrl.reward.custom import load_custom_reward

    (tmp_path / "noisy.py").write_text(
        "import ctypes, os, sys\n"
        "print('python print')\n"
        "os.write(1, b'raw fd write\\n')\n"
        "ctypes.CDLL(None).printf(b'c printf\\n')\n"
        "sys.__stdout__.write('python stdout object\\n')\n"
        "def compute_score(**kw):\n    return 1.0\n")
    os.write(1, b"before\n")
    notebook = io.StringIO()  # a notebook's stream: not fd 1
    monkeypatch.setattr("sys.stdout", notebook)
    assert load_custom_reward(str(tmp_path / "noisy.py"))("s", "x", "y") == 1.0
    os.write(1, b"after\n")  # fd 1 is given back
    out, err = capfd.readouterr()
    assert out.split() == ["before", "after"], (out, err)
    for line in ("python print", "raw fd write", "c printf", "python stdout object"):
        assert line in err
    assert notebook.getvalue() == ""


def test_ctrl_c_while_a_reward_file_imports_is_an_interrupt_not_a_config_error(tmp_path, capfd):
    """``KeyboardInterrupt`` raised during the import propagates as itself (a config error would have reported a
    Ctrl-C as a broken file), with the half-imported module dropped and fd 1 given back."""
    import os
    import sys

    from asyncrl.reward.custom import load_custom_reward

    (tmp_path / "slow.py").write_text("import os\nos.write(1, b'importing\\n')\nraise KeyboardInterrupt\n")
    loaded = {m for m in sys.modules if m.startswith("asyncrl_custom_reward_")}
    with pytest.raises(KeyboardInterrupt):
        load_custom_reward(str(tmp_path / "slow.py"))
    assert {m for m in sys.modules if m.startswith("asyncrl_custom_reward_")} == loaded
    os.write(1, b"after\n")
    out, err = capfd.readouterr()
    assert (out, err) == ("after\n", "importing\n")


def _worker_outputs(tmp_path, model_dir, reward_source: str, reward_kwargs: dict | None = None) -> list:
    """Two trajectories answering "42" to a ``my_task`` row, scored by an AgentLoopWorker with the reward file
    ``reward_source`` as its ``custom_reward_function`` (and ``reward_kwargs``)."""
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

    (tmp_path / "my_reward.py").write_text(reward_source)
    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.model.path = str(model_dir)
    cfg.custom_reward_function.path = str(tmp_path / "my_reward.py")
    cfg.custom_reward_function.reward_kwargs = dict(reward_kwargs or {})
    row = {"agent_name": "test_answers_42", "data_source": "my_task", "prompt": [{"role": "user", "content": "6*7?"}],
           "reward_model": {"ground_truth": "42"}}
    try:
        worker = AgentLoopWorker(cfg, FakePool({"r": FakeAbortingReplica()}))
        return asyncio.run(worker.generate_sequences_single(row, "u", SamplingParams(), 2, prompt_ids=[1, 2]))
    finally:
        AGENT_LOOPS.pop("test_answers_42", None)


def test_the_agent_loop_worker_scores_with_the_custom_reward_function(tmp_path, model_dir):
    """The worker (in the rollouter's process or an actor of its own, which never run the driver's code) loads the
    file named by the config and scores a row whose data_source has no rule reward."""
    outs = _worker_outputs(tmp_path, model_dir, CUSTOM)
    assert [(o.reward_score, o.metrics["reward/source_is_mine"]) for o in outs] == [(1.0, 1.0)] * 2


def test_a_reward_with_a_string_extra_scores_and_keeps_it_as_verl_reward_extra_info(tmp_path, model_dir):
    """verl's math_dapo returns ``"pred": str``: the worker did float() on every key, failing every sample. Numbers
    and bools become ``reward/<key>`` metrics; every extra is kept in ``extra_fields["reward_extra_info"]``."""
    outs = _worker_outputs(tmp_path, model_dir, 'def compute_score(data_source, solution_str, ground_truth, extra_info):'
                                                '\n    return {"score": 1.0, "pred": "x", "acc": True, "n": 3}\n')
    for o in outs:
        assert o.reward_score == 1.0 and "reward/pred" not in o.metrics
        assert (o.metrics["reward/acc"], o.metrics["reward/n"]) == (1.0, 3.0)
        assert o.extra_fields["reward_extra_info"] == {"pred": "x", "acc": True, "n": 3}


def test_a_non_finite_reward_fails_the_sample_in_the_worker_naming_the_reward(tmp_path, model_dir):
    """A NaN score was trained on: every update skipped (non-finite grad norm) and the run exited 0."""
    from asyncrl.reward.result import RewardError

    with pytest.raises(RewardError, match=r"^custom reward .*my_reward.py:compute_score returned nan for data_source "
                                          r"'my_task' \(sample u-[01]\): a score must be finite"):
        _worker_outputs(tmp_path, model_dir, "def compute_score(**kwargs):\n    return float('nan')\n")


RETURNS = "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return eval(solution_str)\n"
FIX = r': return a float or \{"score": float, \.\.\.\}$'


@pytest.mark.parametrize("returned, says", [
    ("None", r"returned None for data_source 'my_sum' \(sample u-0\)" + FIX),
    ("'wrong'", r"returned str 'wrong' \(a string is not a score, even a number's\) for data_source 'my_sum' "
                r"\(sample u-0\)" + FIX),
    ("'1.0'", r"returned str '1.0' \(a string is not a score, even a number's\) for data_source 'my_sum'"),
    ("{'acc': 1.0, 'pred': '7'}", r'returned a dict without "score" \(its keys: acc, pred\) for data_source '
                                  r"'my_sum' \(sample u-0\)" + FIX),
    ("{'score': None}", r'returned "score" None for data_source' + r".*" + FIX),
    ("[1.0]", r"returned list \[1.0\] for data_source 'my_sum'"),
    ("float('nan')", r"returned nan for data_source 'my_sum' \(sample u-0\): a score must be finite \(a NaN or "
                     r"infinite reward makes every update's gradient norm non-finite, so no step would train\)$"),
    ("{'score': float('-inf')}", r'returned "score" -inf for data_source'),
    ("1 / 0", r"raised ZeroDivisionError: division by zero for data_source 'my_sum' \(sample u-0\)$"),
])
def test_what_a_custom_reward_returned_is_checked_once_naming_the_reward_and_the_sample(tmp_path, returned, says):
    """``None`` said "float() argument must be ... NoneType", a dict without score ``KeyError 'score'``, "1.0" was
    accepted: now one line names the reward (file:function), the data_source, the sample and the contract."""
    from asyncrl.reward.custom import load_custom_reward
    from asyncrl.reward.result import RewardError, score_sample

    (tmp_path / "x.py").write_text(RETURNS)
    fn = load_custom_reward(str(tmp_path / "x.py"))
    with pytest.raises(RewardError, match=rf"^custom reward {tmp_path}/x.py:compute_score " + says):
        score_sample(fn, "my_sum", returned, "64", {}, where="sample u-0")


def test_a_rule_reward_is_checked_the_same_way_and_keeps_its_string_extras(monkeypatch):
    from asyncrl.reward.result import RewardError

    monkeypatch.setitem(REWARD_FNS, "dapo_like", lambda s, gt: {"score": float(s == gt), "pred": s})
    assert compute_score("dapo_like", "7", "7") == {"score": 1.0, "pred": "7"}
    monkeypatch.setitem(REWARD_FNS, "nan_rule", lambda s, gt: float("nan"))
    with pytest.raises(RewardError, match=r"^rule reward .*<lambda> returned nan for data_source 'nan_rule': a score"):
        compute_score("nan_rule", "7", "7")


@pytest.mark.parametrize("signature, ok", [
    ("solution, truth", False), ("data_source, solution_str, ground_truth", False),
    ("**kwargs", True), ("data_source, solution_str, ground_truth, extra_info=None, *, scale=1", True),
    ("*, data_source, solution_str, **rest", True),
])
def test_a_reward_function_that_cannot_take_verls_four_keywords_is_a_config_error(tmp_path, signature, ok):
    """``def compute_score(solution, truth)`` passed --dry-run and failed every group 40 s into the run. The
    signature is checked; the function is never called at load (made-up input may fail legitimately)."""
    from asyncrl.config import ConfigError
    from asyncrl.reward.custom import load_custom_reward

    (tmp_path / "x.py").write_text(f"def compute_score({signature}):\n    raise AssertionError('called')\n")
    if ok:
        load_custom_reward(str(tmp_path / "x.py"))
        return
    with pytest.raises(ConfigError) as info:
        load_custom_reward(str(tmp_path / "x.py"))
    assert re.fullmatch(
        rf"custom_reward_function.name='compute_score': {tmp_path}/x.py:compute_score\({re.escape(signature)}\) "
        r"cannot be called as verl calls it \(.+\): it must accept the keywords data_source, solution_str, "
        r"ground_truth, extra_info \(rename its parameters to these, or add \*\*kwargs\)", str(info.value)), info.value


def test_an_async_reward_function_is_a_config_error(tmp_path):
    """Session 31's second fresh user: ``async def compute_score`` passed --dry-run, then every sample 'returned
    coroutine' (never awaited). Rows are scored by a plain call: refused at load, the function not called."""
    from asyncrl.config import ConfigError
    from asyncrl.reward.custom import load_custom_reward

    (tmp_path / "x.py").write_text("async def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                   "    return 1.0\n")
    with pytest.raises(ConfigError, match=rf"^custom_reward_function.name='compute_score': {tmp_path}/x.py:compute_score "
                                          r"is an async function; rows are scored by a plain call: make it a plain def"):
        load_custom_reward(str(tmp_path / "x.py"))


def test_a_directory_or_a_relative_path_says_what_it_was_resolved_to(tmp_path, monkeypatch):
    from asyncrl.config import ConfigError, ExperimentConfig
    from asyncrl.reward.custom import load_custom_reward, resolve_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mytask").mkdir()
    with pytest.raises(ConfigError, match=rf"^custom_reward_function.path='mytask' is a directory \(resolved against "
                                          rf"{tmp_path}\): give the .py file in it that defines compute_score\("):
        load_custom_reward("mytask")
    with pytest.raises(ConfigError, match=rf"^custom_reward_function.path='{tmp_path}/mytask' is a directory: give"):
        load_custom_reward(str(tmp_path / "mytask"))
    with pytest.raises(ConfigError, match=rf"^custom_reward_function.path='mytask/x.py': no such file \(resolved "
                                          rf"against {tmp_path}\) \(a .py file defining compute_score\("):
        load_custom_reward("mytask/x.py")
    cfg = ExperimentConfig()
    cfg.custom_reward_function.path = "mytask/x.py"  # the actors may run in another directory: absolute in the driver
    resolve_path(cfg)
    assert cfg.custom_reward_function.path == str(tmp_path / "mytask" / "x.py")


def test_a_function_name_without_a_path_is_a_config_error():
    """``custom_reward_function.name=my_fn`` alone was ignored; verl's default name (set always) is fine."""
    from asyncrl.config import ConfigError, load_config

    assert load_config(overrides=["custom_reward_function.name=compute_score"]).custom_reward_function.path is None
    with pytest.raises(ConfigError, match=r"^custom_reward_function.name='my_fn' is set without "
                                          r"custom_reward_function.path, so nothing would call it \(each row is scored "
                                          r"by the rule reward of its data_source\): set custom_reward_function.path to "
                                          r"the .py file that defines my_fn, or drop the name$"):
        load_config(overrides=["custom_reward_function.name=my_fn"])


def test_the_calibration_scores_through_the_same_check(tmp_path, model_dir):
    """asyncrl.sim.calibrate.measure_rollout scores as the workers do: a string extra is fine, a NaN names the row."""
    import asyncio

    from asyncrl.config import ExperimentConfig
    from asyncrl.reward.result import RewardError
    from asyncrl.rollout.base import TokenOutput
    from asyncrl.sim.calibrate import measure_rollout

    class StubReplica:  # a fake: two tokens for every request
        async def generate_async(self, request_id, prompt_ids, sp):
            return TokenOutput([10, 11], [-0.5, -0.5], "length", response_versions=[0, 0])

    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.model.path = str(model_dir)
    cfg.custom_reward_function.path = str(tmp_path / "r.py")
    rows = [{"data_source": "my_sum", "prompt": [{"role": "user", "content": "1+1?"}],
             "reward_model": {"ground_truth": "2"}}]
    (tmp_path / "r.py").write_text("def compute_score(**kw):\n    return {'score': 1.0, 'pred': 'x'}\n")
    _, outputs = asyncio.run(measure_rollout(StubReplica(), cfg, rows, 1))
    assert outputs[0][3] == [1.0] * cfg.actor_rollout_ref.rollout.n
    (tmp_path / "r.py").write_text("def compute_score(**kw):\n    return float('inf')\n")
    with pytest.raises(RewardError, match=r"returned inf for data_source 'my_sum' \(row 0\): a score must be finite"):
        asyncio.run(measure_rollout(StubReplica(), cfg, rows, 1))

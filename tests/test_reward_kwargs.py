"""verl's ``custom_reward_function.reward_kwargs``: more keyword arguments for the user's reward function, on every
call (verl: ``partial(raw_fn, **reward_kwargs)``), set from the command line, checked against the function's
signature at ``--dry-run``, and passed wherever rows are scored (agent-loop workers, the simulator's calibration)."""

import re

import pytest

from test_reward import _worker_outputs

SCALED = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0, tag="none"):
    return {"score": float(solution_str.strip() == str(ground_truth)) * scale, "scale": scale, "tag": tag}
'''


@pytest.mark.parametrize("override", [
    "custom_reward_function.reward_kwargs.scale=2",        # a key inside the mapping, as engine_kwargs.vllm.*
    "+custom_reward_function.reward_kwargs.scale=2",       # Hydra's add, as a verl command line writes it
    "++custom_reward_function.reward_kwargs.scale=2",      # Hydra's add-or-override
    "custom_reward_function.reward_kwargs={scale: 2}",     # the whole mapping
])
def test_reward_kwargs_are_set_from_the_command_line_as_verl_writes_them(tmp_path, override):
    from asyncrl.config import load_config, to_yaml

    cfg = load_config(overrides=[f"custom_reward_function.path={tmp_path / 'r.py'}", override])
    assert cfg.custom_reward_function.reward_kwargs == {"scale": 2}
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))  # a run directory's config.yaml reads back the same
    assert load_config(tmp_path / "config.yaml").custom_reward_function.reward_kwargs == {"scale": 2}


def test_the_scorer_passes_reward_kwargs_on_every_call(tmp_path):
    from asyncrl.config import load_config
    from asyncrl.reward.custom import scorer

    (tmp_path / "r.py").write_text(SCALED)
    cfg = load_config(overrides=[f"custom_reward_function.path={tmp_path / 'r.py'}",
                                 "custom_reward_function.reward_kwargs.scale=2.5",
                                 "custom_reward_function.reward_kwargs.tag=mine"])
    fn = scorer(cfg)
    assert fn("my_sum", " 4 ", "4") == {"score": 2.5, "scale": 2.5, "tag": "mine"}
    assert fn("my_sum", "5", "4", extra_info={"i": 1}) == {"score": 0.0, "scale": 2.5, "tag": "mine"}
    cfg.custom_reward_function.reward_kwargs = {}
    assert scorer(cfg)("my_sum", "4", "4") == {"score": 1.0, "scale": 1.0, "tag": "none"}  # the function's defaults


def test_the_agent_loop_worker_scores_with_the_reward_kwargs(tmp_path, model_dir):
    """The worker (the rollouter's process or an actor of its own: training and evaluation) loads the file and binds
    the config's reward_kwargs: the score and the extras are the function's for ``scale=3``."""
    outs = _worker_outputs(tmp_path, model_dir, SCALED, {"scale": 3.0})
    assert [(o.reward_score, o.metrics["reward/scale"]) for o in outs] == [(3.0, 3.0)] * 2
    assert all(o.extra_fields["reward_extra_info"]["tag"] == "none" for o in outs)


def test_the_calibration_scores_with_the_reward_kwargs(tmp_path, model_dir):
    """``asyncrl sim``'s calibration (asyncrl.sim.calibrate.measure_rollout) scores through the same scorer."""
    import asyncio

    from asyncrl.config import ExperimentConfig
    from asyncrl.rollout.base import TokenOutput
    from asyncrl.sim.calibrate import measure_rollout

    class StubReplica:  # a fake: two tokens for every request
        async def generate_async(self, request_id, prompt_ids, sp):
            return TokenOutput([10, 11], [-0.5, -0.5], "length", response_versions=[0, 0])

    (tmp_path / "r.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info, bonus):\n"
                                   "    return 0.25 + bonus\n")
    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.model.path = str(model_dir)
    cfg.custom_reward_function.path = str(tmp_path / "r.py")
    cfg.custom_reward_function.reward_kwargs = {"bonus": 0.5}
    rows = [{"data_source": "my_sum", "prompt": [{"role": "user", "content": "1+1?"}],
             "reward_model": {"ground_truth": "2"}}]
    _, outputs = asyncio.run(measure_rollout(StubReplica(), cfg, rows, 1))
    assert outputs[0][3] == [0.75] * cfg.actor_rollout_ref.rollout.n


def test_reward_kwargs_without_a_path_is_a_config_error():
    """No function would receive them: each row is scored by its data_source's rule reward (the same rule as
    ``custom_reward_function.name`` without a path)."""
    from asyncrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^custom_reward_function.reward_kwargs=\{'scale': 2\} is set without "
                                          r"custom_reward_function.path, so no function would receive them \(each row "
                                          r"is scored by the rule reward of its data_source\): set "
                                          r"custom_reward_function.path, or drop the reward_kwargs$"):
        load_config(overrides=["custom_reward_function.reward_kwargs.scale=2"])


def test_a_reward_kwarg_the_function_cannot_take_is_a_config_error_naming_the_key_and_the_function(tmp_path):
    from asyncrl.config import ConfigError
    from asyncrl.reward.custom import load_custom_reward

    (tmp_path / "r.py").write_text(SCALED)
    path = str(tmp_path / "r.py")
    with pytest.raises(ConfigError) as info:
        load_custom_reward(path, reward_kwargs={"scale": 2, "sacle": 3, "mode": "x"})
    assert str(info.value) == (
        f"custom_reward_function.reward_kwargs.sacle, custom_reward_function.reward_kwargs.mode: {path}:compute_score"
        "(data_source, solution_str, ground_truth, extra_info=None, scale=1.0, tag='none') takes no keyword 'sacle' "
        "(did you mean 'scale'?) or 'mode', and every call passes it (custom_reward_function.reward_kwargs={'scale': "
        "2, 'sacle': 3, 'mode': 'x'}): the reward_kwargs it takes are scale, tag; rename the keys, add the parameters "
        "(or **kwargs) to compute_score, or drop the keys")
    (tmp_path / "kw.py").write_text("def compute_score(**kwargs):\n    raise AssertionError('called')\n")
    load_custom_reward(str(tmp_path / "kw.py"), reward_kwargs={"anything": 1})  # **kwargs takes any; never called
    (tmp_path / "need.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info, bonus):\n"
                                      "    return 1.0\n")  # a parameter without a default, given by reward_kwargs
    load_custom_reward(str(tmp_path / "need.py"), reward_kwargs={"bonus": 1})
    with pytest.raises(ConfigError) as info:
        load_custom_reward(str(tmp_path / "need.py"))
    assert str(info.value) == (  # the fix is reward_kwargs or a default, not renaming it to one of verl's four
        f"custom_reward_function.name='compute_score': {tmp_path}/need.py:compute_score(data_source, solution_str, "
        "ground_truth, extra_info, bonus) requires 'bonus', which no row passes (each call passes data_source, "
        "solution_str, ground_truth, extra_info and the keys of custom_reward_function.reward_kwargs): set "
        "custom_reward_function.reward_kwargs.bonus=..., or give it a default value in compute_score")
    (tmp_path / "two.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info, *, tok, "
                                     "n, m=1):\n    return 1.0\n")  # keyword-only ones too; reward_kwargs gives n
    with pytest.raises(ConfigError, match=r"requires 'tok', which no row passes .*: set "
                                          r"custom_reward_function.reward_kwargs.tok=\.\.\., or give it a default"):
        load_custom_reward(str(tmp_path / "two.py"), reward_kwargs={"n": 2})


def test_a_misspelt_reward_kwarg_gets_a_did_you_mean_and_the_names_the_function_takes(tmp_path):
    """A fresh user's pass (session 33): ``reward_kwargs.threshhold=0.5`` said the function takes no keyword
    'threshhold' and to add the parameter; the function has ``threshold``. The closest parameter name is offered
    (difflib, never one of verl's four) and the names it takes are listed; a name close to none gets no guess."""
    from asyncrl.config import ConfigError
    from asyncrl.reward.custom import load_custom_reward

    (tmp_path / "t.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, "
                                   "threshold=0.5, marker='####'):\n    return 0.0\n")
    with pytest.raises(ConfigError, match=r"^custom_reward_function.reward_kwargs.threshhold: .* takes no keyword "
                                          r"'threshhold' \(did you mean 'threshold'\?\), and every call passes it "
                                          r"\(.*\): the reward_kwargs it takes are threshold, marker; rename the key, "):
        load_custom_reward(str(tmp_path / "t.py"), reward_kwargs={"threshhold": 0.9})
    with pytest.raises(ConfigError) as info:
        load_custom_reward(str(tmp_path / "t.py"), reward_kwargs={"zzz": 1, "extra_inf": 2})
    assert "did you mean" not in str(info.value)  # extra_inf is close to extra_info, which reward_kwargs cannot set
    (tmp_path / "four.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                                      "    return 0.0\n")
    with pytest.raises(ConfigError, match=r"takes no keyword 'scale', .*: it takes no keyword besides data_source, "
                                          r"solution_str, ground_truth, extra_info; rename the key"):
        load_custom_reward(str(tmp_path / "four.py"), reward_kwargs={"scale": 2})


def test_a_reward_kwarg_named_as_one_of_the_four_keywords_is_refused(tmp_path):
    """verl merges reward_kwargs over the call's keywords, so ``reward_kwargs.ground_truth`` replaced every row's."""
    from asyncrl.config import ConfigError
    from asyncrl.reward.custom import load_custom_reward

    (tmp_path / "kw.py").write_text("def compute_score(**kwargs):\n    return 1.0\n")
    with pytest.raises(ConfigError, match=r"^custom_reward_function.reward_kwargs.ground_truth: ground_truth is one of "
                                          r"the four keywords every row passes \(data_source, solution_str, "
                                          r"ground_truth, extra_info\); .*: give it another name$"):
        load_custom_reward(str(tmp_path / "kw.py"), reward_kwargs={"ground_truth": "7"})


def test_dry_run_refuses_a_reward_kwarg_the_function_cannot_take(capsys, tmp_path):
    """``asyncrl train --dry-run`` loads the function as a run would, with its reward_kwargs: one config error line,
    exit 2, before anything starts; the accepted keys pass and are printed in the resolved config."""
    import json

    from asyncrl.cli import main
    from asyncrl.data.dataset import get_task_rows

    data = tmp_path / "rows.jsonl"
    rows = get_task_rows("arith", "train", 64, 0)
    data.write_text("".join(json.dumps({**r, "data_source": "my_sum"}) + "\n" for r in rows))
    (tmp_path / "r.py").write_text(SCALED)
    argv = ["train", "--dry-run", f"data.train_files={data}", f"custom_reward_function.path={tmp_path / 'r.py'}"]
    assert main(argv + ["+custom_reward_function.reward_kwargs.weight=2"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"config error: custom_reward_function.reward_kwargs.weight: .*r.py:compute_score\(.*\) takes "
                        r"no keyword 'weight', .*\n", err), err
    assert main(argv + ["+custom_reward_function.reward_kwargs.scale=2"]) == 0
    assert "reward_kwargs:\n    scale: 2\n" in capsys.readouterr().out


def test_a_reward_kwarg_misspelt_only_in_case_gets_the_did_you_mean(tmp_path):
    """A fresh user's pass (session 33): ``reward_kwargs.THRESHOLD=0.9`` got no guess (difflib compares case:
    ``THRESHOLD`` is far from ``threshold``); names are compared case-insensitively too."""
    from asyncrl.config import ConfigError
    from asyncrl.reward.custom import load_custom_reward

    (tmp_path / "t.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, *, "
                                   "threshold=0.5, marker='####'):\n    return 0.0\n")
    for typed in ("THRESHOLD", "Threshhold", "THRESHHOLD"):
        with pytest.raises(ConfigError, match=rf"takes no keyword '{typed}' \(did you mean 'threshold'\?\)"):
            load_custom_reward(str(tmp_path / "t.py"), reward_kwargs={typed: 0.9})

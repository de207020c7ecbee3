"""Command-line overrides read as Hydra (verl) reads them (:mod:`asyncrl.config_overrides`): a mapping given to a
mapping key is merged into it, ``[...]`` / ``{...}`` values follow Hydra's override grammar (not YAML 1.1), and a value
of the wrong type is asyncrl's config error naming the key, the override as typed and the expected type."""

from __future__ import annotations

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.config_overrides import override_value

REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n    return 0.0\n"


@pytest.fixture
def reward(tmp_path):
    path = tmp_path / "r.py"
    path.write_text(REWARD)
    return f"custom_reward_function.path={path}"


@pytest.mark.parametrize("typed, value", [
    ("[yes,no]", ["yes", "no"]), ("[on, off]", ["on", "off"]),  # YAML 1.1: [True, False]
    ("[0123]", ["0123"]), ("[12:30]", ["12:30"]), ("[0x10]", ["0x10"]),  # YAML 1.1: [83], [750], [16]
    ("{a: off}", {"a": "off"}), ("{t: 12:30, v: 0123}", {"t": "12:30", "v": "0123"}),
    ("{a:1}", {"a": 1}), ("{a:1,b:{c:x}}", {"a": 1, "b": {"c": "x"}}),  # YAML: {'a:1': None}, a syntax error
    ("[1, -2, 1_000, 1.5, .5, 1e-3, true, False, null, NULL]", [1, -2, 1000, 1.5, 0.5, 0.001, True, False, None, None]),
    ("['a,b', \"c d\", e\\,f, ' g ']", ["a,b", "c d", "e,f", " g "]),  # quotes and Hydra's escaped comma
    ("[ a b , c ]", ["a b", "c"]), ("[]", []), ("{}", {}), ("{1: a}", {"1": "a"}),  # keys are strings, as Hydra's
    ("[${oc.env:HOME,/x}, 2]", ["${oc.env:HOME,/x}", 2]),  # an interpolation keeps its comma
    ("[/data/a.parquet,~/b.jsonl]", ["/data/a.parquet", "~/b.jsonl"]),
])
def test_bracketed_values_follow_hydras_grammar_not_yaml_1_1(typed, value):
    """A fresh user's pass (session 33): inside brackets YAML 1.1 held, so ``[yes,no]`` was ``[True, False]``,
    ``[0123]`` was ``[83]``, ``{a: off}`` was ``{'a': False}`` and Hydra's ``{a:1}`` the mapping ``{'a:1': None}``."""
    got = override_value(typed)
    assert got == value
    assert [type(v) for v in (got.values() if isinstance(got, dict) else got)] == [
        type(v) for v in (value.values() if isinstance(value, dict) else value)]


def test_a_mapping_override_is_merged_into_the_mapping_key_as_hydra_merges(tmp_path, reward):
    """Hydra (1.0.1 on, hydra PR #952) merges a dictionary override into an existing node, at every depth; ``{}``
    changes nothing; ``~key`` then ``key={...}`` replaces (Hydra's ``~key +key={...}``). ``{a:1}`` needs no space."""
    saved = tmp_path / "config.yaml"
    saved.write_text("actor_rollout_ref:\n  rollout:\n    engine_kwargs:\n      vllm: {max_num_seqs: 8}\n"
                     "      hf: {decode_threads: 2}\n")
    ek = load_config(saved, ["actor_rollout_ref.rollout.engine_kwargs={vllm:{max_model_len:128}}"]
                     ).actor_rollout_ref.rollout.engine_kwargs
    assert ek == {"vllm": {"max_num_seqs": 8, "max_model_len": 128}, "hf": {"decode_threads": 2}}
    assert load_config(saved, ["actor_rollout_ref.rollout.engine_kwargs={}"]).actor_rollout_ref.rollout.engine_kwargs \
        == {"vllm": {"max_num_seqs": 8}, "hf": {"decode_threads": 2}}
    replaced = load_config(saved, ["~actor_rollout_ref.rollout.engine_kwargs",
                                   "actor_rollout_ref.rollout.engine_kwargs={hf: {decode_threads: 1}}"])
    assert replaced.actor_rollout_ref.rollout.engine_kwargs == {"vllm": {}, "hf": {"decode_threads": 1}}
    kwargs = load_config(overrides=[reward, "custom_reward_function.reward_kwargs={a:1}",
                                    "custom_reward_function.reward_kwargs={b: off}"]).custom_reward_function.reward_kwargs
    assert kwargs == {"a": 1, "b": "off"}
    retry = load_config(overrides=["actor_rollout_ref.rollout.agent.sandbox.retry_actions={agent_timeout:retry}"])
    assert retry.actor_rollout_ref.rollout.agent.sandbox.retry_actions == {"agent_timeout": "retry"}


@pytest.mark.parametrize("override, says", [
    ("custom_reward_function.reward_kwargs=null", r"null is not a mapping \(write custom_reward_function.reward_kwargs="
                                                  r"\{name: value\}, merged into the mapping, .*~custom_reward_function"
                                                  r".reward_kwargs empties it\)$"),
    ("actor_rollout_ref.rollout.engine_kwargs=5", r"5 is not a mapping \(write "),  # was: Cannot assign int to Dict
    ("trainer.seed=abc", r"'abc' is not int$"),  # was: Value 'abc' could not be converted to Integer
    ("trainer.seed=5.5", r"5.5 is not int$"),
    ("trainer.seed=[1]", r"\[1\] is not int$"),
    ("actor_rollout_ref.actor.optim.lr=abc", r"'abc' is not a finite number$"),
    ("actor_rollout_ref.actor.optim.betas=[0.9,12:30]", r"\[0.9, '12:30'\] is not a list of 2 finite numbers$"),
    ("trainer.experiment_name=[a]", r"\['a'\] is not str$"),
])
def test_a_value_of_the_wrong_type_names_the_key_the_override_and_the_type(override, says):
    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=rf"^invalid value for '{key}' in override '{__import__('re').escape(override)}'"
                                          rf": {says}"):
        load_config(overrides=[override])


def test_numbers_reach_typed_keys_as_typed_not_as_yaml_1_1():
    """``0123`` is the text 0123 (Hydra), which an int key takes as 123 and a str key keeps: never the octal 83."""
    cfg = load_config(overrides=["trainer.seed=0123", "trainer.experiment_name=0123", "trainer.logger=[console]",
                                 "actor_rollout_ref.actor.optim.betas=[0.9,1e-3]"])
    assert (cfg.trainer.seed, cfg.trainer.experiment_name) == (123, "0123")
    assert cfg.actor_rollout_ref.actor.optim.betas == (0.9, 0.001)
    with pytest.raises(ConfigError, match=r"unknown logger\(s\) \['yes', 'no'\]"):  # was ['True', 'False']
        load_config(overrides=["trainer.logger=[yes,no]"])

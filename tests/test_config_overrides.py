"""Command-line overrides read as Hydra (verl) reads them (:mod:`asyncrl.config_overrides`): a mapping given to a
mapping key is merged into it, ``[...]`` / ``{...}`` values follow Hydra's override grammar (not YAML 1.1), and a value
of the wrong type is asyncrl's config error naming the key, the override as typed and the expected type."""

from __future__ import annotations

import re

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
    ("custom_reward_function.reward_kwargs=null", r"null is not a mapping \(write 'custom_reward_function.reward_kwargs="
                                                  r"\{name: value\}' \(quoted for the shell\), merged into the mapping, "
                                                  r".*~custom_reward_function.reward_kwargs resets it\)$"),
    ("actor_rollout_ref.rollout.engine_kwargs=5", r"5 is not a mapping whose values are each a mapping \(write "),  # was: Cannot assign int to Dict
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


@pytest.mark.parametrize("override, key", [
    ("actor_rollout_ref.rollout.engine_kwargs={vllm:x}", "actor_rollout_ref.rollout.engine_kwargs.vllm"),
    ("actor_rollout_ref.rollout.engine_kwargs.vllm=x", "actor_rollout_ref.rollout.engine_kwargs.vllm"),
    ("actor_rollout_ref.rollout.engine_kwargs={hf: 3}", "actor_rollout_ref.rollout.engine_kwargs.hf"),
    ("actor_rollout_ref.rollout.engine_kwargs.vllm=[1]", "actor_rollout_ref.rollout.engine_kwargs.vllm"),
    ("actor_rollout_ref.rollout.engine_kwargs.vllm=null", "actor_rollout_ref.rollout.engine_kwargs.vllm"),
])
def test_an_engine_kwargs_entry_that_is_no_mapping_is_a_config_error(override, key):
    """A fresh user's pass (session 33): these were an AttributeError in config_ranges ('str' object has no attribute
    'get') or OmegaConf's 'Cannot merge incompatible container types'. engine_kwargs maps a backend to its engine
    arguments (typed ``dict[str, dict[str, Any]]``); each entry is checked before the merge, naming the entry."""
    with pytest.raises(ConfigError, match=rf"^invalid value for '{key}' in override .* is not a mapping of the "
                                          rf"backend's engine arguments \(write '{key}=\{{name: value\}}'"):
        load_config(overrides=[override])


def test_a_list_given_to_a_mapping_entry_and_the_reverse_name_the_entry(reward):
    """``reward_kwargs.a=[1]`` over ``a: {b: 1}`` was OmegaConf's TypeError naming no key: it names the entry and says
    to drop it first with ~ (Hydra refuses the merge too); after ~ it is set."""
    kw = "custom_reward_function.reward_kwargs"
    with pytest.raises(ConfigError, match=rf"^invalid value for '{kw}.a' in override '{kw}.a=\[1\]': it holds a "
                                          rf"mapping, and a list cannot be merged into it .*: write ~{kw}.a before"):
        load_config(overrides=[reward, f"{kw}={{a: {{b: 1}}}}", f"{kw}.a=[1]"])
    with pytest.raises(ConfigError, match=r"it holds a list, and a mapping cannot be merged"):
        load_config(overrides=[reward, f"{kw}={{a: [1]}}", f"{kw}.a={{b: 1}}"])
    cfg = load_config(overrides=[reward, f"{kw}={{a: {{b: 1}}}}", f"~{kw}.a", f"{kw}.a=[1]"])
    assert cfg.custom_reward_function.reward_kwargs == {"a": [1]}


def test_resetting_a_section_is_a_config_error_naming_it():
    """``~trainer`` was OmegaConf's ValidationError (dict is not a subclass of TrainerConfig)."""
    with pytest.raises(ConfigError, match=r"^override '~trainer': 'trainer' is a config section, not a key: ~ resets "
                                          r"one key .* e.g. ~trainer.total_training_steps \(trainer holds: "):
        load_config(overrides=["~trainer"])


@pytest.mark.parametrize("typed", ["1.10", "2024_06_01", "1e-3", "true", "False", "0123", "1_000", "inf", " 7 "])
def test_a_str_key_keeps_the_text_typed(typed):
    """A fresh user's pass (session 33): ``trainer.experiment_name=1.10`` was '1.1' (Hydra reads a float, OmegaConf
    writes it back), so runs 1.1 and 1.10 shared directories; ``=true`` was 'True'. A str key keeps the unquoted text
    (stripped), deliberately unlike Hydra; null is still null, and an int key still converts."""
    assert load_config(overrides=[f"trainer.experiment_name={typed}"]).trainer.experiment_name == typed.strip()
    assert load_config(overrides=[f"data.train_files={typed}"]).data.train_files == typed.strip()  # str or a list
    assert load_config(overrides=["trainer.wandb_mode=null"]).trainer.wandb_mode is None
    assert load_config(overrides=["trainer.seed=1_000"]).trainer.seed == 1000


def test_top_level_escapes_are_undone_as_hydra_does():
    r"""Hydra unescapes ``\,`` (and ``\\``, ``\ ``, ``\(``...) in a top-level value as inside brackets; a backslash
    before another character stays (``\d``), and so does one inside an interpolation."""
    assert override_value(r"a\,b") == "a,b"
    assert override_value(r"a\\b") == "a\\b"
    assert override_value(r"\d+\.\d") == r"\d+\.\d"
    assert override_value(r"${oc.env:X,a\,b}") == r"${oc.env:X,a\,b}"
    assert load_config(overrides=[r"trainer.experiment_name=run\=3"]).trainer.experiment_name == "run=3"


def test_tilde_deletes_an_entry_of_a_free_mapping_as_hydra_does(reward):
    """``~custom_reward_function.reward_kwargs.scale`` said 'unknown config key'; it deletes the entry, and an entry
    the mapping lacks is named with what it holds."""
    kw = "custom_reward_function.reward_kwargs"
    cfg = load_config(overrides=[reward, f"{kw}={{scale: 2, mode: x}}", f"~{kw}.scale"])
    assert cfg.custom_reward_function.reward_kwargs == {"mode": "x"}
    with pytest.raises(ConfigError, match=rf"unknown config key '{kw}.scal' in override '~{kw}.scal'; {kw} holds no "
                                          r"'scal' \(it holds: scale\)"):
        load_config(overrides=[reward, f"{kw}.scale=2", f"~{kw}.scal"])
    ek = load_config(overrides=["actor_rollout_ref.rollout.engine_kwargs.hf.decode_threads=2",
                                "~actor_rollout_ref.rollout.engine_kwargs.hf"]).actor_rollout_ref.rollout.engine_kwargs
    assert ek == {"vllm": {}}


def test_a_name_reset_with_tilde_is_as_if_never_set():
    """``trainer.experiment_name=foo ~trainer.experiment_name data.train_files=...`` kept the recipe's name: the run is
    named after the data, as without the two overrides."""
    plain = load_config(overrides=["data.train_files=my_rows.jsonl"]).trainer.experiment_name
    reset = load_config(overrides=["trainer.experiment_name=foo", "~trainer.experiment_name",
                                   "data.train_files=my_rows.jsonl"]).trainer.experiment_name
    assert reset == plain == "my_rows_arith_grpo_cpu"
    assert load_config(overrides=["~trainer.experiment_name", "trainer.experiment_name=foo",
                                  "data.train_files=my_rows.jsonl"]).trainer.experiment_name == "foo"


@pytest.mark.parametrize("overrides, example", [
    (["custom_reward_function.reward_kwargs={scale:", "2}"], "'custom_reward_function.reward_kwargs={a: 1, b: 2}'"),
    (["custom_reward_function.reward_kwargs={a:1,", "b:2}"], "'custom_reward_function.reward_kwargs={a: 1, b: 2}'"),
    (["trainer.logger=[console,", "tensorboard]"], "'trainer.logger=[a, b]'"),
    (["custom_reward_function.reward_kwargs=a:1", "custom_reward_function.reward_kwargs=b:2"],
     "'custom_reward_function.reward_kwargs={a: 1, b: 2}'"),
    (["custom_reward_function.reward_kwargs.x=a:1", "custom_reward_function.reward_kwargs.x=b:2"],
     "'custom_reward_function.reward_kwargs.x={a: 1, b: 2}'"),
])
def test_a_value_the_shell_split_says_to_quote_the_override(overrides, example):
    """A fresh user's pass (session 33): bash splits ``key={scale: 2}`` at the space and brace-expands ``key={a:1,b:2}``
    into ``key=a:1 key=b:2`` (which set x to 'b:2' without a word). The error says the shell may have split it."""
    with pytest.raises(ConfigError, match=r"the shell may have split it: quote the whole override, " + re.escape(example)):
        load_config(overrides=overrides)
    assert load_config(overrides=["trainer.project_name=a:1"]).trainer.project_name == "a:1"  # one alone is fine


@pytest.mark.parametrize("given, value", [
    ("data.train_files=[a.jsonl]", "[a.jsonl]"),  # a one-element list is kept as its path
    ("data.train_files=a.jsonl", "[a.jsonl]"), ("data.train_files=[a.jsonl]", "a.jsonl"),
    ("trainer.seed=0123", "0123"),  # the text 0123, which the int key takes as 123
    ("trainer.seed='7'", "'7'"), ("async_training.partial_rollout=1", "1"),  # a bool key takes 1 as true
    ("trainer.logger=console", "console"), ("trainer.logger=[console,tensorboard]", "[console,tensorboard]"),
])
def test_tilde_with_a_value_resets_what_the_same_text_set(given, value):
    """A session-34 tester's finding: ``data.train_files=[a.jsonl] '~data.train_files=[a.jsonl]'`` and
    ``trainer.seed=0123 '~trainer.seed=0123'`` were refused ("holds 123, not '0123'"): ``~key=value`` compared the
    value as read, a set converts it to the key's type. Compared now after the set's conversion."""
    key = given.partition("=")[0]
    cfg = load_config(overrides=[given, f"~{key}={value}"])
    assert cfg == load_config()


def test_tilde_with_a_value_resets_only_while_the_key_holds_it(reward):
    """``~key=value`` ignored the value (reset whatever the key held); Hydra deletes only while the key holds it and
    is otherwise an error naming both values."""
    kw = "custom_reward_function.reward_kwargs"
    assert load_config(overrides=["trainer.seed=3", "~trainer.seed=3"]).trainer.seed == 0
    assert load_config(overrides=[reward, f"{kw}={{mode: off, n: 1}}", f"~{kw}.mode=off"]
                       ).custom_reward_function.reward_kwargs == {"n": 1}
    assert load_config(overrides=[reward, f"{kw}={{a: 1, b: [x]}}", f"~{kw}={{a: 1, b: [x]}}"]
                       ).custom_reward_function.reward_kwargs == {}
    assert load_config(overrides=["trainer.experiment_name=1.10", "~trainer.experiment_name=1.10"]
                       ).trainer.experiment_name == "arith_grpo_cpu"  # the text as typed, as a str key keeps it
    assert load_config(overrides=["trainer.seed=3", "~trainer.seed="]).trainer.seed == 0  # an empty value: ~key
    with pytest.raises(ConfigError, match=r"^override '~trainer.seed=4': trainer.seed holds 3, not 4, so it is not "
                                          r"reset \(~key=value resets key only while it holds value, as in Hydra\): "
                                          r"write ~trainer.seed to reset it whatever it holds$"):
        load_config(overrides=["trainer.seed=3", "~trainer.seed=4"])
    with pytest.raises(ConfigError, match=rf"^override '~{kw}.mode=on': {kw}.mode holds 'off', not 'on', "):
        load_config(overrides=[reward, f"{kw}.mode=off", f"~{kw}.mode=on"])
    with pytest.raises(ConfigError, match=r"trainer.experiment_name holds '1.10', not 1.1, "):
        load_config(overrides=["trainer.experiment_name=1.10", "~trainer.experiment_name=1.1"])
    with pytest.raises(ConfigError, match=r"holds True, not 1, "):  # a bool is no number here (Python: True == 1)
        load_config(overrides=[reward, f"{kw}.flag=true", f"~{kw}.flag=1"])  # in a mapping: no type converts 1
    with pytest.raises(ConfigError, match=r"^the value of override '~trainer.seed=\[1' cannot be read: the '\[' here "
                                          r"is never closed"):
        load_config(overrides=["~trainer.seed=[1"])

"""Loading a config from YAML and overrides: every mistake a user can make is a ConfigError naming where it is
(the CLI prints it as ``config error: ...`` and exits 2), never a raw PyYAML or OmegaConf traceback."""

from __future__ import annotations

import pytest

from asyncrl.cli import main
from asyncrl.config import ConfigError, load_config


@pytest.mark.parametrize("override, says", [
    ("trainer.logger=[console", r"the '\[' here is never closed \(a '\]' is missing\) at column 1 of the value; "
                                 r"the shell may have split it: quote the whole override, 'trainer.logger=\[a, b\]'$"),
    ("trainer.logger=[console,,tensorboard]", r"an element is missing \(found ','\) at column 10 of the value$"),
    ("custom_reward_function.reward_kwargs={a}", r"a mapping entry is key: value, not 'a' at column 3 of the value$"),
    ("trainer.logger=[console]x", r"unexpected text 'x' after the closing '\]' at column 10 of the value$"),
    ("trainer.logger=['console]", r"the quote ' is never closed at column 2 of the value$"),
], ids=["unclosed_list", "empty_element", "entry_without_colon", "text_after_list", "unclosed_quote"])
def test_a_bracketed_override_hydra_cannot_read_is_a_config_error(override, says, capsys):
    """Both the unclosed list and (before session 33, when brackets were YAML) ``{vllm:{max_model_len:64}}`` raised
    yaml.scanner.ScannerError / yaml.parser.ParserError through ``asyncrl train``; a bracketed value is now read by
    Hydra's override grammar, and what it cannot read is one config error naming the override and the column."""
    with pytest.raises(ConfigError, match=says):
        load_config(None, [override])
    assert main(["train", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"config error: the value of override {override!r} is not a valid list or mapping "
                          "(Hydra's override grammar, as verl's command line): ") and "Traceback" not in err


def test_a_yaml_file_with_a_syntax_error_or_a_list_at_top_level_is_a_config_error(tmp_path, capsys):
    """A syntax error raised yaml.parser.ParserError; a list at top level ``TypeError: Cannot merge incompatible
    container types``."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  total_training_steps: [1\n")
    with pytest.raises(ConfigError, match=rf"config file '{bad}' is not valid YAML: .* begun at line 2, column 25"):
        load_config(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- trainer.total_training_steps=4\n")
    with pytest.raises(ConfigError, match=rf"config file '{listed}' must be a mapping of keys .*not a list"):
        load_config(listed)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    for path in (bad, listed):
        assert main(["train", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"config error: config file '{path}'") and "Traceback" not in err, err


@pytest.mark.parametrize("key, says", [
    ("data.max_response_length", "actor_rollout_ref.rollout.response_length"),
    ("data.train_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size x async_training.require_batches"),
    ("actor_rollout_ref.actor.clip_ratio", "clip_ratio_low and actor_rollout_ref.actor.clip_ratio_high"),
    ("actor_rollout_ref.actor.grad_clip", "actor_rollout_ref.actor.optim.clip_grad"),
    ("critic.grad_clip", "critic.optim.clip_grad"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.actor.ppo_micro_batch_size"),
    ("trainer.val_before_train", "always evaluates before training"),
    ("trainer.total_epochs", "trainer.total_training_steps"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", "tensor-parallel rollout is not supported"),
])
def test_verl_key_names_that_live_elsewhere_get_a_hint_not_a_misleading_closest_key(key, says):
    """``data.max_response_length`` suggested data.max_prompt_length, ``clip_ratio`` clip_ratio_c, ``grad_clip``
    nothing useful: the closest spelling of a verl name is often the wrong key."""
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{key}=1"])
    assert says in str(err.value) and "did you mean" not in str(err.value), str(err.value)


def test_every_key_a_hint_names_exists():
    import re

    from asyncrl.config import KEY_HINTS, valid_keys

    keys = set(valid_keys())
    for bad, hint in KEY_HINTS.items():
        assert bad not in keys, bad
        named = [k for k in re.findall(r"[a-z_]+(?:\.[a-z_]+)+", hint) if k not in (bad, "e.g")]  # a hint may name
        missing = [k for k in named if k not in keys]  # its own verl key; every other key it names must exist
        assert not missing, (bad, missing)


def test_data_files_take_verl_lists(tmp_path):
    """verl takes a list of files; ``data.train_files=[a,b]`` was ``Cannot convert 'ListConfig' to string``, then a
    ConfigError saying to concatenate them. A one-element list is its path; a longer one stays a list, read in order
    by ``run_rows`` (tests/test_config_data_files.py)."""
    assert load_config(None, ["data.train_files=[/tmp/a.jsonl,/tmp/b.parquet]"]).data.train_files == \
        ["/tmp/a.jsonl", "/tmp/b.parquet"]
    assert load_config(None, ["data.val_files=[/tmp/a.jsonl]"]).data.val_files == "/tmp/a.jsonl"
    yml = tmp_path / "c.yaml"
    yml.write_text("data:\n  train_files:\n    - /tmp/a.jsonl\n    - /tmp/b.jsonl\n")
    assert load_config(yml).data.train_files == ["/tmp/a.jsonl", "/tmp/b.jsonl"]


@pytest.mark.parametrize("value", [0, -1, -5])
def test_save_freq_at_or_below_zero_means_no_checkpoints_as_in_verl(value):
    """``trainer.save_freq=0`` was refused ("use a step count >= 1, or -1") though verl reads any value <= 0 as off and
    the trainer and Experiment here save only when it is > 0."""
    assert load_config(None, [f"trainer.save_freq={value}"]).trainer.save_freq == value


def test_total_training_steps_null_says_what_to_write_instead():
    """verl's default ``trainer.total_training_steps=null`` was ``Incompatible value 'None' for field of type 'int'``."""
    with pytest.raises(ConfigError, match=r"^invalid value for 'trainer.total_training_steps' in override "
                                          r"'trainer.total_training_steps=null': null is not int; verl's null .*give a "
                                          r"step count >= 1"):
        load_config(None, ["trainer.total_training_steps=null"])


def test_hydra_plus_prefixes_read_as_plain_overrides():
    """verl command lines add a key their YAML lacks with Hydra's ``+key=value`` (``++``: add or override); here every
    key is in the schema or inside a mapping, so both read as ``key=value``; an unknown key still names the closest
    one and the override as typed."""
    cfg = load_config(None, ["+trainer.seed=3", "++actor_rollout_ref.rollout.engine_kwargs.vllm.max_num_seqs=4"])
    assert (cfg.trainer.seed, cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"]) == (3, {"max_num_seqs": 4})
    with pytest.raises(ConfigError, match=r"^unknown config key 'trainer.sed' in override '\+trainer.sed=3'; did you "
                                          r"mean 'trainer.seed'\?$"):
        load_config(None, ["+trainer.sed=3"])
    with pytest.raises(ConfigError, match=r"^override '\+=3' is not of the form key=value \(its key is empty\)$"):
        load_config(None, ["+=3"])


@pytest.mark.parametrize("typed, value", [
    ("'#### (\\d+)'", "#### (\\d+)"),  # a GSM8K answer marker: YAML read '#' as a comment, null
    ("'x #y'", "x #y"), ("Answer:", "Answer:"), ("'a: b'", "a: b"), ("'- x'", "- x"),  # were 'x', {Answer: None}, ...
    ("0123", "0123"), ("12:30", "12:30"), ("0x10", "0x10"),  # YAML 1.1: octal 83, base-60 750, hex 16
    ("no", "no"), ("off", "off"), ("yes", "yes"), ("'hello world'", "hello world"),  # YAML 1.1: booleans
    ("2", 2), ("-1", -1), ("1_000", 1000), ("1.5", 1.5), ("1e-3", 0.001), ("true", True), ("False", False),
    ("null", None), ("\"'0123'\"", "0123"), ("[a,0123]", ["a", "0123"]), ("'{a: 1}'", {"a": 1}),
])
def test_an_override_value_reads_as_hydra_reads_it_not_as_yaml_1_1(typed, value, tmp_path):
    """A fresh user's pass (session 32): ``reward_kwargs.v='#### (\\d+)'`` reached the reward as None and ``0123`` as
    83, silently. Plain decimal numbers, true / false and null are read as such; other unquoted, unbracketed text is
    the string as typed, inside brackets too (session 33: ``[a,0123]`` was ``['a', 83]``); a quoted value is YAML."""
    import shlex

    from asyncrl.config import load_config

    reward = tmp_path / "r.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, v=None):\n    return 0.0\n")
    (item,) = shlex.split(f"custom_reward_function.reward_kwargs.v={typed}")  # as a shell hands it over
    cfg = load_config(overrides=[f"custom_reward_function.path={reward}", item])
    assert cfg.custom_reward_function.reward_kwargs == {"v": value}
    assert type(cfg.custom_reward_function.reward_kwargs["v"]) is type(value)


def test_tilde_key_resets_a_key_to_the_bases_value_and_empties_a_mapping(tmp_path):
    """Hydra's ``~key``: ``key={c: 3}`` merges into a mapping (as Hydra does), so a saved run's config.yaml with
    reward_kwargs could not be switched back to the rule reward from the command line (reward_kwargs without path
    is refused): ``~custom_reward_function.reward_kwargs`` empties it; a scalar goes back to the recipe's value."""
    from asyncrl.config import ConfigError, load_config
    from asyncrl.recipes import longtail_grpo_cpu

    reward = tmp_path / "r.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n    return 0.0\n")
    saved = tmp_path / "config.yaml"
    saved.write_text(f"custom_reward_function:\n  path: {reward}\n  reward_kwargs: {{a: 1, b: 2}}\n")
    assert load_config(saved, ["custom_reward_function.reward_kwargs={c: 3}"]).custom_reward_function.reward_kwargs == {
        "a": 1, "b": 2, "c": 3}
    with pytest.raises(ConfigError, match="is set without custom_reward_function.path"):
        load_config(saved, ["custom_reward_function.path=null"])
    rule = load_config(saved, ["custom_reward_function.path=null", "~custom_reward_function.reward_kwargs"])
    assert (rule.custom_reward_function.path, rule.custom_reward_function.reward_kwargs) == (None, {})
    assert load_config(saved, ["~custom_reward_function.reward_kwargs", "custom_reward_function.reward_kwargs.c=3"]
                       ).custom_reward_function.reward_kwargs == {"c": 3}
    recipe = longtail_grpo_cpu()
    back = load_config(base=recipe, overrides=["trainer.total_training_steps=7", "~trainer.total_training_steps"])
    assert back.trainer.total_training_steps == recipe.trainer.total_training_steps != 7
    with pytest.raises(ConfigError, match="unknown config key 'trainer.total_trainig_steps' in override "
                                          "'~trainer.total_trainig_steps'; did you mean 'trainer.total_training_steps'"):
        load_config(overrides=["~trainer.total_trainig_steps"])

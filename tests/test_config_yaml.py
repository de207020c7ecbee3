"""YAML config files read as Hydra reads them (OmegaConf's loader: YAML 1.1 plus its float fix), with YAML 1.1's
silent changes of meaning refused (:mod:`asyncrl.config_yaml`)."""

from __future__ import annotations

import pytest

from asyncrl.config import ConfigError, load_config, to_yaml


def _file(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_exponent_floats_and_yaml_1_1_booleans_of_bool_keys_read_as_hydra_reads_them(tmp_path):
    """``lr: 1e-3`` is a string to PyYAML's YAML 1.1; OmegaConf's loader (Hydra's) reads the float, and so do we."""
    cfg = load_config(_file(tmp_path, "actor_rollout_ref:\n  actor:\n    optim:\n      lr: 1e-3\n"
                                      "async_training:\n  partial_rollout: off\ntrainer:\n  seed: 0x10\n"))
    assert cfg.actor_rollout_ref.actor.optim.lr == 0.001 and isinstance(cfg.actor_rollout_ref.actor.optim.lr, float)
    assert cfg.async_training.partial_rollout is False and cfg.trainer.seed == 16
    reward = tmp_path / "r.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n    return 0\n")
    cfg = load_config(_file(tmp_path, f"custom_reward_function:\n  path: {reward}\n  reward_kwargs: {{a: off, b: 1e-3}}\n"))
    assert cfg.custom_reward_function.reward_kwargs == {"a": False, "b": 0.001}  # an untyped value: YAML's (Hydra's)


@pytest.mark.parametrize("text, says", [
    ("trainer:\n  experiment_name: no\n",
     r"line 2: trainer.experiment_name: no is read by YAML 1.1 as False \(bool\), and the key takes str: write 'no' "
     r"\(quoted\) for the text$"),  # was the run named 'False'
    ("trainer:\n  experiment_name: 1e3\n", r"line 2: trainer.experiment_name: 1e3 is read by YAML 1.1 as 1000.0"),
    ("trainer:\n  seed: 0123\n",
     r"line 2: trainer.seed: 0123 is YAML 1.1's octal number 83, not 123: write 123 for the number, or '0123' "
     r"\(quoted\) for the text$"),  # was seed 83
    ("trainer:\n  cpu_affinity: 0123\n", r"line 2: trainer.cpu_affinity: 0123 is YAML 1.1's octal number 83"),  # was '83'
    ("async_training:\n  rollouter_cpu_affinity: 12:30\n",
     r"line 2: async_training.rollouter_cpu_affinity: 12:30 is YAML 1.1's base-60 number 750: write '12:30' \(quoted\)"),
    ("custom_reward_function:\n  reward_kwargs: {version: 0123}\n",
     r"line 2: custom_reward_function.reward_kwargs.version: 0123 is YAML 1.1's octal number 83"),
    ("trainer:\n  seed: no\n", r"line 2: trainer.seed: no is YAML 1.1's boolean false, and the key takes int$"),
    ("trainer:\n  logger: [console, off]\n", r"line 2: trainer.logger: off is read by YAML 1.1 as False \(bool\)"),
])
def test_a_yaml_1_1_reading_that_changes_the_meaning_is_refused_naming_file_line_key_and_text(text, says, tmp_path):
    path = _file(tmp_path, text)
    with pytest.raises(ConfigError, match=rf"^config file '{path}', {says}"):
        load_config(path)


def test_a_value_of_the_wrong_type_in_a_file_names_the_key_and_the_type(tmp_path):
    path = _file(tmp_path, "trainer:\n  seed: abc\n")
    with pytest.raises(ConfigError, match=rf"^invalid value for 'trainer.seed' in {path}: 'abc' is not int$"):
        load_config(path)


def test_a_saved_config_yaml_with_look_alike_strings_reads_back_the_same(tmp_path):
    """A run's config.yaml (OmegaConf's dumper quotes a string YAML would read as another type) is not refused."""
    reward = tmp_path / "r.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n    return 0\n")
    cfg = load_config(overrides=[f"custom_reward_function.path={reward}", "trainer.experiment_name=0123",
                                 "custom_reward_function.reward_kwargs={a: no, b: 0123, c: 12:30, d: 1e3, e: off}"])
    saved = _file(tmp_path, to_yaml(cfg))
    again = load_config(saved)
    assert again.trainer.experiment_name == "0123"
    assert again.custom_reward_function.reward_kwargs == {"a": "no", "b": "0123", "c": "12:30", "d": 1000.0, "e": "off"}

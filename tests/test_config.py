"""Typed config: YAML + dotlist with verl key names; unknown keys name the closest valid key."""

import pytest

from asyncrl.config import ConfigError, ExperimentConfig, load_config, to_yaml, valid_keys
from asyncrl.recipes import arith_grpo_cpu


def test_defaults_and_overrides(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("async_training:\n  staleness_threshold: 1.0\nactor_rollout_ref:\n  rollout:\n    n: 4\n")
    cfg = load_config(y, ["async_training.trigger_parameter_sync_step=3", "actor_rollout_ref.rollout.n=6"])
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.async_training.staleness_threshold == 1.0
    assert cfg.async_training.trigger_parameter_sync_step == 3
    assert cfg.actor_rollout_ref.rollout.n == 6  # dotlist wins over YAML


def test_unknown_key_names_closest():
    with pytest.raises(ConfigError, match="async_training.staleness_threshold"):
        load_config(overrides=["async_training.staleness_treshold=0.5"])
    with pytest.raises(ConfigError, match="ppo_mini_batch_size"):
        load_config(overrides=["actor_rollout_ref.actor.ppo_mini_batchsize=3"])


def test_bad_values():
    with pytest.raises(ConfigError, match="rollout.n"):
        load_config(overrides=["actor_rollout_ref.rollout.n=abc"])
    with pytest.raises(ConfigError, match="must be >= 1"):
        load_config(overrides=["async_training.require_batches=0"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(overrides=["nonsense"])


def test_recipe_as_base_and_yaml_roundtrip(tmp_path):
    cfg = load_config(base=arith_grpo_cpu(), overrides=["trainer.seed=3"])
    assert cfg.trainer.experiment_name == "arith_grpo_cpu" and cfg.trainer.seed == 3
    y = tmp_path / "resolved.yaml"
    y.write_text(to_yaml(cfg))
    assert load_config(y) == cfg
    assert "async_training.partial_rollout" in valid_keys()

"""``load_config(base=...)`` with what Python lets a caller set on a config: OmegaConf containers, a whole section,
a generator, a misspelt attribute."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from asyncrl.config import ConfigError, ExperimentConfig, load_config, validate


def test_omegaconf_containers_set_on_fields_are_taken_as_plain_ones():
    base = ExperimentConfig()
    base.trainer.logger = OmegaConf.create(["console"])
    base.actor_rollout_ref.rollout.engine_kwargs = OmegaConf.create({"vllm": {"enforce_eager": True}})
    base.actor_rollout_ref.actor.optim.betas = OmegaConf.create([0.9, 0.99])
    cfg = load_config(base=base)
    assert cfg.trainer.logger == ["console"] and type(cfg.trainer.logger) is list
    assert cfg.actor_rollout_ref.rollout.engine_kwargs == {"vllm": {"enforce_eager": True}}
    assert tuple(cfg.actor_rollout_ref.actor.optim.betas) == (0.9, 0.99)
    assert OmegaConf.is_list(base.trainer.logger)  # the caller's object as it was
    nested = ExperimentConfig()  # inside a plain dict too
    nested.actor_rollout_ref.rollout.engine_kwargs = {"vllm": OmegaConf.create({"enforce_eager": False})}
    assert load_config(base=nested).actor_rollout_ref.rollout.engine_kwargs == {"vllm": {"enforce_eager": False}}
    bad = ExperimentConfig()
    bad.trainer.logger = OmegaConf.create([1])  # still checked for its type
    with pytest.raises(ConfigError, match=r"^trainer.logger=\[1\] \(list\) is not valid in the base config: "
                                          r"expected a list of str"):
        load_config(base=bad)


@pytest.mark.parametrize("value, what", [({"staleness_threshold": 0.5}, "a dict"), (None, "None"),
                                         (OmegaConf.create({"staleness_threshold": 0.5}), "a DictConfig")])
def test_a_section_replaced_from_python_is_refused_by_name(value, what):
    base = ExperimentConfig()
    base.async_training = value
    with pytest.raises(ConfigError, match=rf"^async_training is a config section \(AsyncTrainingConfig\), not {what} "
                                          r"in the base config: set its keys \(cfg.async_training.<key> = ...\), or "
                                          r"assign a AsyncTrainingConfig\(...\)$"):
        load_config(base=base)
    inner = ExperimentConfig()
    inner.actor_rollout_ref.actor.optim = None
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.actor.optim is a config section \(OptimConfig\), not "
                                          r"None"):
        load_config(base=inner)
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.actor.optim is a config section"):
        validate(inner)  # a config given to Experiment / simulate directly


@pytest.mark.parametrize("make, kind", [(lambda: (x for x in ["console"]), "generator"),
                                        (lambda: {"console": 1}.keys(), "dict_keys")])
def test_a_value_that_cannot_be_copied_is_refused_by_key(make, kind):
    base = ExperimentConfig()
    base.trainer.logger = make()
    with pytest.raises(ConfigError, match=rf"^trainer.logger=.* \({kind}\) is not valid in the base config: a config "
                                          r"value is null, a bool, a number, a str, or a list / dict of them "
                                          r"\(write list\(...\) for an iterable\)$"):
        load_config(base=base)
    inside = ExperimentConfig()
    inside.actor_rollout_ref.rollout.engine_kwargs = {"vllm": {"x": make()}}
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.rollout.engine_kwargs="):
        load_config(base=inside)


def test_a_misspelt_attribute_is_refused_with_the_closest_key():
    base = ExperimentConfig()
    base.trainer.total_training_step = 5
    with pytest.raises(ConfigError, match=r"^unknown config key 'trainer.total_training_step' set in the base "
                                          r"config; did you mean 'trainer.total_training_steps'\?$"):
        load_config(base=base)
    assert base.trainer.total_training_step == 5  # the caller's object untouched
    hinted = ExperimentConfig()
    hinted.trainer.total_epochs = 3  # a verl key with its own hint, as in a YAML file
    with pytest.raises(ConfigError, match=r"^unknown config key 'trainer.total_epochs' set in the base config; a run "
                                          r"ends after trainer.total_training_steps"):
        load_config(base=hinted)
    top = ExperimentConfig()
    top.mode = "d"
    with pytest.raises(ConfigError, match=r"^unknown config key 'mode' set in the base config; there is no mode key"):
        load_config(base=top)
    private = ExperimentConfig()
    private.trainer._note = "mine"  # not a key: left alone
    assert load_config(base=private).trainer.total_training_steps == ExperimentConfig().trainer.total_training_steps


def test_a_base_that_is_not_a_config_is_refused():
    with pytest.raises(ConfigError, match=r"^expected an ExperimentConfig in the base config, got a dict \(build"):
        load_config(base={"trainer": {"total_training_steps": 3}})

"""Command-line overrides read as Hydra (verl) reads them (:mod:`asyncrl.config_overrides`): a value of the wrong type
is asyncrl's config error naming the key, the override as typed and the expected type."""

from __future__ import annotations

import pytest

from asyncrl.config import ConfigError, load_config

@pytest.mark.parametrize("override, says", [
    ("custom_reward_function.reward_kwargs=null", r"null is not a mapping \(write custom_reward_function.reward_kwargs="
                                                  r"\{name: value\}, merged into the mapping, .*~custom_reward_function"
                                                  r".reward_kwargs empties it\)$"),
    ("actor_rollout_ref.rollout.engine_kwargs=5", r"5 is not a mapping \(write "),  # was: Cannot assign int to Dict
    ("trainer.seed=abc", r"'abc' is not int$"),  # was: Value 'abc' could not be converted to Integer
    ("trainer.seed=5.5", r"5.5 is not int$"),
    ("trainer.seed=[1]", r"\[1\] is not int$"),
    ("actor_rollout_ref.actor.optim.lr=abc", r"'abc' is not a finite number$"),
    ("trainer.experiment_name=[a]", r"\['a'\] is not str$"),
])
def test_a_value_of_the_wrong_type_names_the_key_the_override_and_the_type(override, says):
    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=rf"^invalid value for '{key}' in override '{__import__('re').escape(override)}'"
                                          rf": {says}"):
        load_config(overrides=[override])

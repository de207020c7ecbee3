"""``load_config(base=cfg)`` refuses a value of the wrong Python type set on ``cfg`` instead of coercing it.

``OmegaConf.structured`` read ``"yes"``, ``"true"``, ``1`` and ``2`` for a bool key as true and ``0`` as false, ``"5"``
for an int key as 5, ``"0.5"`` for a float key as 0.5, and ``5`` / ``1.5`` for a str key as ``"5"`` / ``"1.5"``.
It already refused ``True``, ``2.7`` and ``3.0`` for an int key and ``True`` for a float key, with its own words and
the bare leaf name for list keys (``'logger'``, ``'betas'``). ``check_types`` now checks the base first, so every case
names the full key, the value and the expected type. YAML and dotlist overrides keep OmegaConf's / verl's rules
(``async_training.partial_rollout=1`` is true there); this is only about values set from Python.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asyncrl.config import ConfigError, ExperimentConfig, _get, load_config


def _base(key: str, value) -> ExperimentConfig:
    cfg = ExperimentConfig()
    parent, _, leaf = key.rpartition(".")
    setattr(_get(cfg, parent), leaf, value)
    return cfg


@pytest.mark.parametrize("key, value, expected", [
    # before: refused by OmegaConf ("could not be converted to Integer"); still refused, in check_types' words
    ("trainer.total_training_steps", True, "int"),
    ("trainer.total_training_steps", 2.7, "int"),
    ("trainer.total_training_steps", 3.0, "int"),
    ("async_training.staleness_threshold", True, "a finite number"),
    # before: coerced
    ("trainer.total_training_steps", "5", "int"),  # -> 5
    ("async_training.partial_rollout", "yes", "true or false"),  # -> True
    ("async_training.partial_rollout", "true", "true or false"),  # -> True
    ("async_training.partial_rollout", 2, "true or false"),  # -> True
    ("async_training.partial_rollout", 1, "true or false"),  # -> True
    ("async_training.partial_rollout", 0, "true or false"),  # -> False
    ("async_training.staleness_threshold", "0.5", "a finite number"),  # -> 0.5
    ("data.operators", 5, "str"),  # -> "5"
    ("trainer.project_name", 1.5, "str"),  # -> "1.5"
    # before: refused naming only the leaf ('logger', 'betas') or with OmegaConf's words
    ("trainer.logger", "console", "a list of str"),
    ("trainer.logger", ["console", 3], "a list of str"),  # before: "unknown logger(s) ['3']"
    ("actor_rollout_ref.actor.optim.betas", [0.9, True], "a list of 2 finite numbers"),
    ("data.train_files", 3, "str or a list of str or null"),
    ("trainer.total_training_steps", None, "int"),
])
def test_a_wrong_type_on_the_base_is_refused_naming_key_and_value(key, value, expected):
    base = _base(key, value)
    with pytest.raises(ConfigError) as err:
        load_config(base=base)
    msg = str(err.value)
    assert msg.startswith(f"{key}={value!r} ({type(value).__name__}) is not valid in the base config: "
                          f"expected {expected}"), msg
    assert _get(base, key) == value  # the caller's object untouched


def test_a_null_step_count_on_the_base_says_what_to_write_as_an_override_does():
    with pytest.raises(ConfigError, match=r"total_training_steps=None .*expected int; verl's null .* give a step count"):
        load_config(base=_base("trainer.total_training_steps", None))


def test_an_inf_on_the_base_gets_the_range_hint_validate_gives():
    with pytest.raises(ConfigError, match=r"trainer.total_time_s=inf \(float\) is not valid in the base config: "
                                          r"expected a finite number, .*0 = no time budget"):
        load_config(base=_base("trainer.total_time_s", float("inf")))


@pytest.mark.parametrize("key, value, want", [
    ("async_training.staleness_threshold", 1, 1.0),  # an int for a float key: fine, as before
    ("async_training.staleness_threshold", 0.25, 0.25),
    ("trainer.total_training_steps", np.int64(4), 4),  # numpy scalars: their Python values, as before
    ("async_training.partial_rollout", np.True_, True),
    ("async_training.staleness_threshold", np.float64(0.25), 0.25),
    ("actor_rollout_ref.actor.optim.betas", (0.9, 0.99), (0.9, 0.99)),
    ("actor_rollout_ref.actor.optim.betas", (np.float32(0.5), np.float64(0.99)), (0.5, 0.99)),
    ("trainer.logger", ("console",), ["console"]),
    ("actor_rollout_ref.model.path", Path("/tmp/model"), "/tmp/model"),  # a Path for a str key, as before
    ("trainer.total_training_steps", "${oc.env:ASYNCRL_H1_NOPE,3}", 3),  # interpolations: resolved, then validated
    ("async_training.staleness_threshold", "${async_training.trigger_parameter_sync_step}", 1.0),
])
def test_right_types_numpy_scalars_and_interpolations_on_the_base_are_taken(key, value, want):
    out = _get(load_config(base=_base(key, value)), key)
    assert out == want and type(out) is type(want), (out, want)


def test_an_interpolation_on_the_base_is_still_checked_once_resolved():
    with pytest.raises(ConfigError, match=r"trainer.total_training_steps"):
        load_config(base=_base("trainer.total_training_steps", "${trainer.project_name}"))


def test_overrides_keep_omegaconf_and_verl_rules():
    """Unchanged: on the command line / in YAML, 1 and yes are true for a bool key and "5" an int (YAML's own reading)."""
    cfg = load_config(overrides=["async_training.partial_rollout=1", "trainer.total_training_steps=5",
                                 "trainer.project_name=1.5", "actor_rollout_ref.rollout.enforce_eager=yes"])
    assert cfg.async_training.partial_rollout is True and cfg.trainer.total_training_steps == 5
    assert cfg.trainer.project_name == "1.5" and cfg.actor_rollout_ref.rollout.enforce_eager is True
    with pytest.raises(ConfigError, match=r"'async_training.partial_rollout'.*2 is not a bool"):
        load_config(overrides=["async_training.partial_rollout=2"])

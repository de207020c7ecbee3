"""Values a fresh user writes that the ranges of e59ac31 refused or explained badly: verl's ``lr_warmup_steps=-1``,
``inf`` for a time budget, a ``nan`` beta, a seed past what numpy / torch take (``config_ranges.py``,
``config_types.py``, ``trainer/schedule.py``)."""

import re

import pytest

from asyncrl.config import ConfigError, ExperimentConfig, load_config, validate


@pytest.mark.parametrize("section", ["actor_rollout_ref.actor", "critic"])
def test_verl_default_warmup_minus_one_is_taken_and_means_the_ratio(section):
    """verl's default ``lr_warmup_steps=-1`` ("negative: delegate to lr_warmup_steps_ratio", itself 0 by default) was
    refused; it is no warm-up, or ``int(ratio * total_updates)`` updates with a ratio."""
    from asyncrl.trainer.schedule import optim_kwargs, warmup_linear_decay

    cfg = load_config(overrides=[f"{section}.optim.lr_warmup_steps=-1", "trainer.total_training_steps=10"])
    optim = cfg.critic.optim if section == "critic" else cfg.actor_rollout_ref.actor.optim
    kw = optim_kwargs(cfg, optim, 1)
    assert kw["total_updates"] == 10 * cfg.async_training.require_batches == 20 and kw["warmup"] == 0
    schedule = warmup_linear_decay(kw["warmup"], kw["total_updates"])
    assert schedule(0) == 1.0 and schedule(10) == 0.5  # the peak at once, then the decay
    cfg = load_config(overrides=[f"{section}.optim.lr_warmup_steps=-1", f"{section}.optim.lr_warmup_steps_ratio=0.25",
                                 "trainer.total_training_steps=10"])
    optim = cfg.critic.optim if section == "critic" else cfg.actor_rollout_ref.actor.optim
    assert optim_kwargs(cfg, optim, 1)["warmup"] == 5
    assert warmup_linear_decay(-1, 20)(0) == 1.0  # a negative warm-up reaching the schedule is none
    with pytest.raises(ConfigError, match=rf"^{section}.optim.lr_warmup_steps=-2 is not valid: use >= -1 "):
        load_config(overrides=[f"{section}.optim.lr_warmup_steps=-2"])
    with pytest.raises(ConfigError, match=rf"^{section}.optim.lr_warmup_steps_ratio=1.5 is not valid: use in \[0, 1\]"):
        load_config(overrides=[f"{section}.optim.lr_warmup_steps_ratio=1.5"])


@pytest.mark.parametrize("key, says", [
    ("trainer.total_time_s", r"expected a finite number, >= 0 \(seconds of training, 0 = no time budget\)$"),
    ("trainer.watchdog_timeout_s", r"expected a finite number, >= 0 \(.*0 = off\)$"),
    ("actor_rollout_ref.rollout.multi_turn.tool_timeout_s",
     r"expected a finite number, > 0 \(.*\); it has no 'no limit' value: use a large one$"),
])
def test_inf_names_the_keys_no_limit_value_from_the_ranges_table(key, says):
    """``trainer.total_time_s=inf`` said only "expected a finite number": a user asking for no limit learns the key's
    own spelling of it (``0 = no time budget``), or that it has none."""
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}=inf \(float\) is not valid: {says}"):
        load_config(overrides=[f"{key}=inf"])


def test_off_value_is_read_from_the_ranges_text():
    from asyncrl.config_ranges import RANGES, off_value

    assert off_value(RANGES["trainer.total_time_s"][1]) == "0 = no time budget"
    assert off_value(RANGES["trainer.test_freq"][1]) == "0 or -1 (verl's off) = only before and after training"
    assert off_value(RANGES["actor_rollout_ref.rollout.multi_turn.tool_timeout_s"][1]) is None


def test_a_nan_beta_is_called_not_finite():
    with pytest.raises(ConfigError, match=r"optim.betas=\(0.9, nan\) \(tuple\) is not valid: expected a list of 2 "
                                          r"finite numbers, in \[0, 1\)"):
        load_config(overrides=["actor_rollout_ref.actor.optim.betas=[0.9,nan]"])


@pytest.mark.parametrize("seed", [10**23, 2**32])
def test_a_seed_numpy_or_torch_cannot_take_is_refused(seed):
    """``trainer.seed=10**23`` passed validation and overflowed ``torch.manual_seed`` in the trainer actor; vLLM seeds
    numpy's legacy generator (``< 2**32``) with it at the engine's start."""
    cfg = ExperimentConfig()
    cfg.trainer.seed = seed
    with pytest.raises(ConfigError, match=rf"^trainer.seed={seed} is not valid: use in \[0, 4294967295\] "):
        validate(cfg)
    cfg.trainer.seed = 2**32 - 1
    validate(cfg)

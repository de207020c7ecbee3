"""Config keys and what to write instead of a wrong one: every settable key (:func:`valid_keys`), the closest valid
key to an unknown one (:func:`unknown_key_hint`), and the hints for verl names that live elsewhere here
(:data:`KEY_HINTS`) or a null verl allows and asyncrl does not (:data:`NULL_HINTS`). Used by :func:`asyncrl.config.
load_config` and ``asyncrl sim``'s sweep keys; import the names from :mod:`asyncrl.config`.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from asyncrl.config_ranges import range_hint
from asyncrl.config_schema import ExperimentConfig
from asyncrl.config_types import _leaf_types, section_names


def _all_keys(cfg_cls: type, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cfg_cls):
        full = f"{prefix}{f.name}"
        keys.append(full)
        if dataclasses.is_dataclass(f.type if isinstance(f.type, type) else None):
            keys.extend(_all_keys(f.type, full + "."))
        else:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
            if dataclasses.is_dataclass(default):
                keys.extend(_all_keys(type(default), full + "."))
    return keys


def valid_keys() -> list[str]:
    """All dotted keys of :class:`ExperimentConfig`, e.g. ``async_training.staleness_threshold``."""
    return _all_keys(ExperimentConfig)


def _closest(key: str) -> str:
    """The settable key ``key`` most likely means: one with the same last name, else a close spelling of its last
    name in its section (of the whole key where its section does not exist; difflib's 0.6 cutoff), else ``""`` (a
    word like ``foo`` is close to nothing and gets no guess)."""
    leaves = list(_leaf_types())
    section, _, name = key.rpartition(".")
    by_leaf = [k for k in leaves if k.rsplit(".", 1)[-1] == name]
    if by_leaf:
        return by_leaf[0]
    if section in section_names():
        match = difflib.get_close_matches(name, section_names()[section], n=1)
        return f"{section}.{match[0]}" if match else ""
    match = difflib.get_close_matches(key, leaves, n=1)
    return match[0] if match else ""


KEY_HINTS = {
    "mode": "there is no mode key: a mode (a, b, c, d) is a setting of async_training.trigger_parameter_sync_step, "
            "async_training.staleness_threshold and async_training.partial_rollout (README, 'The four modes'); "
            "e.g. mode d: async_training.staleness_threshold=0.5 async_training.partial_rollout=true",
    # verl names that live elsewhere here (the closest spelling would point at the wrong key)
    "data.max_response_length": "the response length is actor_rollout_ref.rollout.response_length (verl sets it "
                                "from data.max_response_length; here it is the one key)",
    "data.train_batch_size": "a trainer step takes actor_rollout_ref.actor.ppo_mini_batch_size x "
                             "async_training.require_batches prompts (as verl's fully-async recipe, which sets "
                             "data.train_batch_size=0); set those two",
    "actor_rollout_ref.actor.clip_ratio": "set actor_rollout_ref.actor.clip_ratio_low and "
                                          "actor_rollout_ref.actor.clip_ratio_high (verl's clip_ratio fills both)",
    "actor_rollout_ref.actor.grad_clip": "the gradient-norm clip is actor_rollout_ref.actor.optim.clip_grad",
    "critic.grad_clip": "the gradient-norm clip is critic.optim.clip_grad",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "the micro-batch is actor_rollout_ref.actor.ppo_micro_batch_size "
                                                            "(sequences per forward/backward chunk)",
    "critic.ppo_micro_batch_size_per_gpu": "the micro-batch is critic.ppo_micro_batch_size",
    "trainer.val_before_train": "there is no switch: asyncrl always evaluates before training (version 0, the "
                                "summary's accuracy_before; not on resume); trainer.test_freq sets evaluations "
                                "during training (0 = only before and after)",
    "trainer.total_epochs": "a run ends after trainer.total_training_steps (or trainer.total_time_s); the data "
                            "repeats in new epochs for as long as that needs",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "tensor-parallel rollout is not supported: each replica "
                                                            "runs on one GPU (rollout.n_gpus_per_node replicas per "
                                                            "node); scale the rollout with more replicas",
}
"""Unknown keys a newcomer is likely to try, with what to write instead (a closest key would mislead)."""

NULL_HINTS = {
    "trainer.total_training_steps": "verl's null (steps from total_epochs) has no equivalent here: give a step count "
                                    ">= 1 (trainer.total_time_s can end the run sooner; the data repeats in epochs)",
}
"""What to write instead of null for a key verl lets be null and asyncrl does not."""


def _base_hint(key: str, value: Any) -> str:
    """What ``check_types`` adds for a value of ``load_config``'s ``base``: the range of a non-finite number (as
    ``validate`` says it), or :data:`NULL_HINTS`' words for a None (as an override's null gets them)."""
    return f"; {NULL_HINTS[key]}" if value is None and key in NULL_HINTS else range_hint(key, value)


def unknown_key_hint(key: str) -> str:
    """What to write instead of the unknown key ``key``: :data:`KEY_HINTS`' words, else the closest valid key, else
    the names its section holds (the top-level sections for a key in none)."""
    if key in KEY_HINTS:
        return KEY_HINTS[key]
    close = _closest(key)
    if close:
        return f"did you mean {close!r}?"
    section = key.rpartition(".")[0]
    while section and section not in section_names():
        section = section.rpartition(".")[0]
    if section:
        return f"{section} holds: {', '.join(section_names()[section])}"
    tops = [name for name in section_names() if "." not in name]
    return (f"the config's top-level sections are {', '.join(tops)} (set a key inside one, e.g. "
            f"trainer.total_training_steps=40)")

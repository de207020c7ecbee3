"""Typed experiment configuration with verl's key names: loading, validation, and the schema's names.

The schema (one ``@dataclass`` per component, every default) is :mod:`asyncrl.config_schema`, with the
agent layer's part in :mod:`asyncrl.config_agent`, the algorithm's in :mod:`asyncrl.config_algorithm` and the
data's in :mod:`asyncrl.config_data`; the key names and hints for a wrong one are
:mod:`asyncrl.config_hints`; import every name from here. :func:`load_config` turns a YAML file plus
dotlist overrides (``async_training.staleness_threshold=0.5``) into an :class:`ExperimentConfig`, rejecting
unknown keys with the closest valid key in the message.

Key names follow verl's fully-async recipe (``async_training.*``, ``actor_rollout_ref.*``,
``data.*``, ``trainer.*``) so that a verl user can carry overrides across.
"""

from __future__ import annotations

import copy
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf
from omegaconf.errors import GrammarParseError, InterpolationResolutionError, ValidationError

from asyncrl.config_algorithm import (ALGORITHM_CHOICES, ALGORITHM_HINTS, AlgorithmConfig, MultiTurnConfig,  # noqa: F401
                                      CustomRewardFunctionConfig, RewardModelConfig, validate_algorithm,
                                      validate_sampling)
from asyncrl.config_data import (RECIPE_MARK, RUN_NAME_REFUSED, mark_recipe_name, name_after_data,
                                 validate_data_files)
from asyncrl.config_hints import (KEY_HINTS, NULL_HINTS, _base_hint, _closest, unknown_key_hint,  # noqa: F401
                                  valid_keys)
from asyncrl.config_schema import (  # noqa: F401 - the schema's names are this module's API
    ConfigError, WordProblemsConfig, LengthWorkloadConfig, DataConfig, ModelConfig, OptimConfig, FSDPConfig,
    ActorConfig, SandboxConfig, AgentConfig, CheckpointEngineConfig, RolloutConfig, ActorRolloutRefConfig,
    AsyncTrainingConfig, CriticModelConfig, CriticConfig, TrainerConfig, RolloutResourceConfig, RayConfig,
    ExperimentConfig, MODEL_DIR)
from asyncrl.config_ranges import RANGES, Range, check_lengths, check_ranges, range_hint, resolved_max_model_len  # noqa: F401
from asyncrl.config_overrides import brace_expansion_problem, not_utf8_problem, sets_key
from asyncrl.config_apply import _merge, _parse_override, _reset, _set  # noqa: F401 - their home before session 34
from asyncrl.config_yaml import load_yaml_file
from asyncrl.run_names import run_name_length_problem
from asyncrl.config_types import (_check_raw, _get, _leaf_types, section_names, _plain_leaves, check_copyable,  # noqa: F401
                                  check_structure, check_types)


# loading


def load_config(
    yaml_path: str | Path | None = None,
    overrides: list[str] | None = None,
    base: ExperimentConfig | None = None,
) -> ExperimentConfig:
    """Build an :class:`ExperimentConfig` from defaults, a YAML file and dotlist overrides.

    Args:
        yaml_path: optional YAML file with a subset of the keys (verl names).
        overrides: ``key=value`` strings, e.g. ``["async_training.staleness_threshold=0.5"]``.
        base: starting config (e.g. a recipe); defaults to :class:`ExperimentConfig()`.

    Returns:
        A validated :class:`ExperimentConfig` (real dataclass instances, not DictConfig). When the YAML file or the
        overrides set ``data.train_files`` and not ``trainer.experiment_name``, the run is named after the data
        (:func:`asyncrl.config_data.data_experiment_name`: ``arith_grpo_cpu`` on ``my_rows.jsonl`` is
        ``my_rows_arith_grpo_cpu``), as is a base recipe's on train files set by attribute; a name they set wins, and so
        does one set on ``base`` after its recipe made it (:func:`asyncrl.config_data.name_after_data`). Unless a
        name is given, it stays marked as the recipe's: train files set later by attribute rename the run again.

    Raises:
        ConfigError: for an unknown key (naming the closest valid one), a value of the wrong type (on ``base``: of
            the wrong Python type, see :func:`check_types`; an int for a float key is fine), a YAML file or
            override value that is not valid YAML (naming line and column), or a file whose top level is not a mapping.
    """
    if yaml_path is not None and not isinstance(yaml_path, (str, Path)):
        hint = (" (a mapping of keys: write it to a YAML file, or give its keys as overrides)" if isinstance(yaml_path, dict)
                else "")
        raise ConfigError(f"load_config(yaml_path): expected a YAML file's path, got a {type(yaml_path).__name__}{hint}")
    if isinstance(overrides, (str, bytes)) or (overrides is not None and (
            not isinstance(overrides, (list, tuple)) or not all(isinstance(o, str) for o in overrides))):
        raise ConfigError(f"load_config(overrides=...): expected a list of 'key=value' strings, got {overrides!r} "
                          "(e.g. overrides=['trainer.total_training_steps=3'])")
    if base is not None:  # the caller's object stays as it is
        where = " in the base config"
        check_structure(base, where, unknown_key_hint)  # a section replaced by a dict / None, a misspelt attribute
        try:
            base = copy.deepcopy(base)
        except Exception:  # noqa: BLE001 - a generator, a dict view, ...: named by its key
            check_copyable(base, where)
            raise
        # numpy values (a sweep's grid) and OmegaConf containers as plain ones, then every value of its key's type:
        # OmegaConf.structured coerces rather than refuses ("yes" or 2 for a bool as true, "5" for an int as 5)
        check_types(base, hint=_base_hint, where=where, interpolations=True, key_hint=unknown_key_hint)
    try:
        cfg = OmegaConf.structured(base if base is not None else ExperimentConfig())
    except ValidationError as exc:  # what check_types lets through and OmegaConf does not take
        raise ConfigError(f"invalid value for {getattr(exc, 'full_key', None) or '?'!r} in the base config: "
                          f"{str(getattr(exc, 'msg', None) or exc).splitlines()[0]}") from None
    defaults = copy.deepcopy(cfg)  # what ~key goes back to: the base's (a recipe's) value, else the schema's
    given: list = []  # what the YAML file and each override set, and each ~key: whether they name the run
    if yaml_path is not None:
        lines: dict = {}
        given.append(load_yaml_file(yaml_path, lines))
        cfg = _merge(cfg, given[-1], f"config file {str(yaml_path)!r}", lines)
    overrides = list(overrides or [])
    problem = brace_expansion_problem(overrides)
    if problem:
        raise ConfigError(problem)
    for typed in overrides:
        key_typed, _, value_typed = typed.lstrip().lstrip("+~").partition("=")
        problem = not_utf8_problem(key_typed.strip(), value_typed, "an override")  # before YAML reads it, and fails
        if problem:
            raise ConfigError(problem)
        if typed.lstrip().startswith("~"):  # Hydra's ~key: back to the base's value (a mapping's entry deleted)
            given.append(_reset(cfg, typed, defaults))
            continue
        cfg, piece = _set(cfg, typed)
        given.append(piece)
    try:
        out = OmegaConf.to_object(cfg)  # resolves interpolations (${oc.env:...}, ${other.key})
    except (InterpolationResolutionError, GrammarParseError, ValidationError) as exc:
        raise ConfigError(f"invalid value for {getattr(exc, 'full_key', None) or '?'!r}: "
                          f"{str(getattr(exc, 'msg', None) or exc).splitlines()[0]}") from None
    # named after the data from the recipe's name (config_data.name_after_data) unless a name is given: by the YAML
    # file, an override, or set on the base after its recipe made it (no mark then)
    start = base if base is not None else ExperimentConfig()
    name_after_data(mark_recipe_name(out, None if sets_key(given, "trainer.experiment_name")
                                     else start.trainer.__dict__.get(RECIPE_MARK)))
    validate(out)
    return out


@dataclass(frozen=True)
class RegistryChoice:
    """Valid values are the names of a registry (:mod:`asyncrl.registry`), looked up at validation time."""

    module: str
    attr: str

    def names(self) -> tuple:
        import importlib

        return tuple(getattr(importlib.import_module(self.module), self.attr).names())

    def check(self, value: Any) -> Optional[str]:
        """None when ``value`` is registered (discovery included), else the registry's error message."""
        import importlib

        from asyncrl.registry import UnknownNameError

        try:
            getattr(importlib.import_module(self.module), self.attr).check(value)
        except UnknownNameError as exc:
            return str(exc)
        return None


# enum-like keys: dotted key -> valid values (a value ending in ":" is a prefix, e.g. "harbor:<name>"),
# or the registry whose names are the valid values
CHOICES: dict[str, Any] = {
    "data.task": RegistryChoice("asyncrl.data.dataset", "TASKS"),
    "actor_rollout_ref.model.dtype": ("float32", "bfloat16"),
    "actor_rollout_ref.rollout.name": RegistryChoice("asyncrl.rollout.backends", "BACKENDS"),
    "actor_rollout_ref.rollout.agent.default_agent_loop": RegistryChoice("asyncrl.agent_loop.base", "AGENT_LOOPS"),
    "actor_rollout_ref.rollout.agent.sandbox.agent": ("bash", "oracle", "harbor:"),
    "actor_rollout_ref.rollout.multi_turn.format": RegistryChoice("asyncrl.agent_loop.tool_parser", "TOOL_PARSERS"),
    "actor_rollout_ref.actor.strategy": ("cpu", "fsdp2"),
    "actor_rollout_ref.rollout.checkpoint_engine.backend": RegistryChoice("asyncrl.sync.base", "CHECKPOINT_ENGINES"),
    "actor_rollout_ref.rollout.load_format": ("auto", "dummy"),
    "actor_rollout_ref.rollout.scheduling_policy": ("fcfs", "priority"),
    "async_training.partial_rollout_mode": ("abort", "keep"),
    "trainer.device": ("cuda", "cpu"),
    "trainer.omp_wait_policy": ("active", "passive", ""),  # OpenMP ignores another word without a sound
    "trainer.resume_mode": ("auto", "disable", "resume_path"),
    "trainer.wandb_mode": (None, "online", "offline", "disabled"),
    **ALGORITHM_CHOICES,
}
HINTS: dict[tuple, str] = {**ALGORITHM_HINTS,
                           ("actor_rollout_ref.actor.strategy", "fsdp"): "FSDP here is fsdp2 (torch fully_shard)",
                           ("actor_rollout_ref.actor.strategy", "megatron"): "not available; use fsdp2"}


def check_choice(key: str, value: Any, choices: Any) -> None:
    """Raise :class:`ConfigError` naming ``key`` and the valid values unless ``value`` is one of ``choices``
    (a tuple, or a :class:`RegistryChoice`)."""
    if isinstance(choices, RegistryChoice):
        err = choices.check(value)
        if err:
            raise ConfigError(f"{key}={value!r} is not valid: {err}")
        return
    ok = value in choices or (isinstance(value, str) and any(
        isinstance(c, str) and c.endswith(":") and value.startswith(c) and len(value) > len(c) for c in choices))
    if not ok:
        valid = ", ".join("null" if c is None else (f"{c}<name>" if c.endswith(":") else c) for c in choices)
        hint = HINTS.get((key, value))
        raise ConfigError(f"{key}={value!r} is not valid; valid values: {valid}" + (f" ({hint})" if hint else ""))


def validate(cfg: ExperimentConfig) -> None:
    """Check enum-like keys (:data:`CHOICES`) and cross-field constraints; raises :class:`ConfigError` naming the key."""
    at, ro = cfg.async_training, cfg.actor_rollout_ref.rollout
    check_types(cfg, hint=range_hint, key_hint=unknown_key_hint)
    for key in _leaf_types():  # a value set from Python with a file name's non-UTF-8 bytes (overrides: load_config)
        problem = not_utf8_problem(key, _get(cfg, key))
        if problem:
            raise ConfigError(problem)
    for key, choices in CHOICES.items():
        check_choice(key, _get(cfg, key), choices)
    vllm_kwargs = (ro.engine_kwargs or {}).get("vllm") or {}
    if "scheduling_policy" in vllm_kwargs:  # the config key's twin, passed to vLLM as it is: checked the same way
        check_choice("actor_rollout_ref.rollout.engine_kwargs.vllm.scheduling_policy", vllm_kwargs["scheduling_policy"],
                     CHOICES["actor_rollout_ref.rollout.scheduling_policy"])
    threads = ((ro.engine_kwargs or {}).get("hf") or {}).get("decode_threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"actor_rollout_ref.rollout.engine_kwargs.hf.decode_threads={threads!r} is not valid: "
                          "a whole number >= 1 (torch threads of a CPU decode step), or null (one thread for small steps)")
    if at.staleness_threshold < 0:
        raise ConfigError("async_training.staleness_threshold must be >= 0")
    files_problem = validate_data_files(cfg.data)
    if files_problem:
        raise ConfigError(files_problem)
    check_ranges(cfg)
    check_lengths(cfg)
    try:
        validate_sampling(ro)
        validate_algorithm(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    from asyncrl.placement import validate_resources  # GPU keys: strategy, sync backend, resource split

    validate_resources(cfg)
    if cfg.actor_rollout_ref.hybrid_engine and at.staleness_threshold > 0:
        raise ConfigError("actor_rollout_ref.hybrid_engine=True generates, trains and syncs in turn, so no sample "
                          "can be stale: set async_training.staleness_threshold=0 (or hybrid_engine=False)")
    if cfg.actor_rollout_ref.hybrid_engine and cfg.algorithm.filter_groups.enable:
        raise ConfigError("actor_rollout_ref.hybrid_engine=True generates exactly one batch per step, so groups dropped "
                          "by algorithm.filter_groups.enable=True could not be replaced: use one of the two")
    from asyncrl.cpu_affinity import CORE_LIST_KEYS, GLUE_AUTO, GLUE_KEY, core_list_hint, parse_cores

    for key in CORE_LIST_KEYS:
        spec = _get(cfg, key)
        try:
            if spec and not (key == GLUE_KEY and spec == GLUE_AUTO):
                parse_cores(spec)
        except ValueError as exc:  # what was wrong (a space, a leading zero, ...), then how to write one
            raise ConfigError(f"{key}={spec!r} is not a CPU core list: {str(exc).partition(': ')[2] or exc}; "
                              f"{core_list_hint(key)}") from None
    lw = cfg.data.length_workload
    if lw.distribution not in ("none", "constant", "uniform", "lognormal", "pareto"):
        raise ConfigError(f"data.length_workload.distribution={lw.distribution!r} is not one of "
                          "none, constant, uniform, lognormal, pareto")
    if lw.distribution != "none":  # each field named with its value (NaN and inf are refused before, as every float)
        for field_, ok, need in (("min_tokens", lw.min_tokens >= 1, ">= 1"), ("median", lw.median > 0, "> 0"),
                                 ("sigma", lw.sigma >= 0, ">= 0"), ("alpha", lw.alpha > 0, "> 0"),
                                 ("max_tokens", not lw.max_tokens or lw.max_tokens >= lw.min_tokens,
                                  f"0 (no cap) or >= min_tokens={lw.min_tokens}")):
            if not ok:
                raise ConfigError(f"data.length_workload.{field_}={getattr(lw, field_)!r} must be {need} (with "
                                  f"distribution={lw.distribution!r})")
    _validate_trainer(cfg)


def _validate_trainer(cfg: ExperimentConfig) -> None:
    tr = cfg.trainer
    name = str(tr.experiment_name)
    if not name.strip() or any(c in name for c in RUN_NAME_REFUSED):  # it names a directory; no glob characters
        raise ConfigError(f"trainer.experiment_name={tr.experiment_name!r}: the name of the run directories "
                          f"(<trainer.default_local_dir>/<name>__<seed>__<time>) must be non-empty and must not "
                          f"contain / or \\ or the glob characters * ? [ ]: use e.g. trainer.experiment_name=my_run")
    problem = run_name_length_problem(tr.experiment_name, tr.seed, tr.default_local_dir)
    if problem:
        raise ConfigError(problem)
    if tr.total_training_steps < 1:  # the fit loop would end before its first step and report zeros
        raise ConfigError(f"trainer.total_training_steps={tr.total_training_steps} would train nothing; use >= 1 "
                          "(trainer.total_time_s can end the run sooner)")
    from asyncrl.tracking import LOGGERS  # one list of valid names

    bad = [x for x in tr.logger if x not in LOGGERS]
    if bad:
        raise ConfigError(f"trainer.logger: unknown logger(s) {bad}; valid: {list(LOGGERS)} (e.g. 'trainer.logger=[console,tensorboard]', quoted for the shell)")
    if tr.resume_mode == "resume_path" and not tr.resume_from_path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<run dir>/checkpoints/global_step_N")
    if tr.resume_from_path and tr.resume_mode != "resume_path":  # verl reads the path only in that mode: it was ignored
        raise ConfigError(f"trainer.resume_from_path={tr.resume_from_path!r} is read only with "
                          f"trainer.resume_mode=resume_path (it is {tr.resume_mode!r}): add that, or drop the path")
    # trainer.save_freq <= 0 means no checkpoints, as in verl (the trainer and Experiment save only when > 0)


def to_yaml(cfg: ExperimentConfig) -> str:
    """The resolved config as YAML (written to every run directory)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg))

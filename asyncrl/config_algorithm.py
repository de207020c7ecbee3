"""Config sections of the RL algorithm: estimators, losses, KL control, DAPO, rollout correction, multi-turn.

Part of the typed config (:mod:`asyncrl.config` assembles :class:`~asyncrl.config.ExperimentConfig`
from these dataclasses and calls the validators here); kept apart so ``config.py`` stays one screenful
per concern. Key names are verl's (``algorithm.*``, ``reward_model.overlong_buffer.*``,
``actor_rollout_ref.rollout.multi_turn.*``). When to use which setting: ``docs/algorithms.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
"""verl ``loss_agg_mode`` names (formulas: :mod:`asyncrl.trainer.losses`)."""
KL_ESTIMATORS = ("k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs")
"""Per-token KL estimators (:func:`asyncrl.trainer.losses.kl_penalty`)."""
ADV_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae")
"""verl ``algorithm.adv_estimator`` names (:mod:`asyncrl.trainer.advantages`)."""


ALGORITHM_CHOICES: dict[str, tuple] = {
    "actor_rollout_ref.actor.loss_agg_mode": LOSS_AGG_MODES,
    "actor_rollout_ref.actor.kl_loss_type": KL_ESTIMATORS,
    "algorithm.adv_estimator": ADV_ESTIMATORS,
    "algorithm.kl_penalty": KL_ESTIMATORS,
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    "algorithm.filter_groups.metric": ("acc", "score", "seq_reward"),
    "algorithm.rollout_correction.rollout_is": (None, "token", "sequence"),
    "algorithm.rollout_correction.rollout_rs": (None, "token", "sequence", "geometric"),
    "critic.loss_agg_mode": LOSS_AGG_MODES,
}
"""Enum-like keys of these sections (merged into :data:`asyncrl.config.CHOICES`)."""
ALGORITHM_HINTS = {("algorithm.adv_estimator", "dr_grpo"): "Dr.GRPO is adv_estimator=grpo with algorithm."
                   "norm_adv_by_std_in_grpo=false and actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"}


@dataclass
class MultiTurnConfig:
    """Knobs of the ``tool_agent`` loop (verl ``actor_rollout_ref.rollout.multi_turn.*``)."""

    enable: bool = False
    """verl's switch: rows without ``agent_name`` run ``tool_agent`` (``agent.default_agent_loop`` must agree)."""
    max_assistant_turns: int = 4
    """Model turns before the trajectory is terminated."""
    max_parallel_calls: int = 4
    """Calls executed per turn; further calls get an error tool message."""
    max_tool_response_length: int = 256
    """Characters of a tool message kept (the rest is replaced by ``...``)."""
    tool_timeout_s: float = 10.0
    """Seconds one tool call may take before it is answered with a timeout error (> 0)."""
    format: str = "hermes"
    """Tool-call parser name (``hermes`` | ``qwen3_coder``)."""
    stop_on_tool_call: bool = True
    """Add the parser's end-of-call token to the stop set (one call per turn)."""




@dataclass
class KLControlConfig:
    """Coefficient of the KL penalty in the reward (verl ``algorithm.kl_ctrl``)."""

    type: str = "fixed"
    """``fixed`` | ``adaptive`` (Ziegler et al. 2019: move the coefficient toward ``target_kl``)."""
    kl_coef: float = 0.001
    """(Initial) coefficient (>= 0)."""
    target_kl: float = 0.1
    """Target KL per token for the adaptive controller."""
    horizon: int = 10000
    """Adaptive controller horizon, in sequences."""


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling (verl ``algorithm.filter_groups``)."""

    enable: bool = False
    """Drop prompt groups whose ``metric`` is equal for every response and fetch more until the batch is full."""
    metric: str = "acc"
    """``acc`` (the rule reward before shaping) | ``score`` / ``seq_reward`` (after overlong shaping)."""
    max_num_gen_batches: int = 0
    """Fail a step after dropping this many batches' worth of groups (0 = keep fetching, as verl: then a warning
    naming this key is logged after each batch's worth dropped in one step)."""


@dataclass
class RolloutCorrectionConfig:
    """Off-policy correction between rollout and trainer (verl ``algorithm.rollout_correction``)."""

    bypass_mode: bool = True
    """True: the rollout's log-probs are the PPO old log-probs (no recompute). False: the trainer
    recomputes old log-probs at the start of each step (decoupled PPO) and IS / RS below apply."""
    rollout_is: Optional[str] = None
    """Truncated importance weights ``min(pi_old / pi_rollout, threshold)``: ``token`` | ``sequence`` | null."""
    rollout_is_threshold: float = 2.0
    """Upper truncation of the IS weights."""
    rollout_rs: Optional[str] = None
    """Rejection (mask out) when the ratio leaves ``[lower, upper]``: ``token`` | ``sequence`` | ``geometric`` | null."""
    rollout_rs_threshold: Optional[float] = None
    """Upper ratio bound of rejection; null = ``rollout_is_threshold``."""
    rollout_rs_threshold_lower: Optional[float] = None
    """Lower ratio bound of rejection; null = ``1 / upper``."""


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"
    """``grpo`` | ``rloo`` | ``reinforce_plus_plus`` | ``reinforce_plus_plus_baseline`` | ``gae`` (needs ``critic``).
    Dr.GRPO is ``grpo`` with ``norm_adv_by_std_in_grpo=false`` and ``loss_agg_mode=seq-mean-token-sum-norm``."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide group-centred rewards by the group std (GRPO); False gives Dr.GRPO's advantage."""
    gamma: float = 1.0
    """Discount over response tokens (``gae``, ``reinforce_plus_plus``)."""
    lam: float = 1.0
    """GAE lambda."""
    use_kl_in_reward: bool = False
    """Subtract ``kl_ctrl`` coefficient x KL(old || reference) from every token's reward."""
    kl_penalty: str = "kl"
    """KL estimator of the in-reward penalty (``k1``/``kl``, ``k2``/``mse``, ``k3``/``low_var_kl``, ``abs``)."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass
class OverlongBufferConfig:
    """DAPO overlong reward shaping (verl ``reward_model.overlong_buffer``)."""

    enable: bool = False
    """Penalise responses longer than ``response_length - len``, linearly up to ``-penalty_factor`` at the cap."""
    len: int = 4
    """Buffer length in tokens before ``actor_rollout_ref.rollout.response_length``."""
    penalty_factor: float = 1.0
    """Penalty at the cap (>= 0)."""


@dataclass
class RewardModelConfig:
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)


@dataclass
class CustomRewardFunctionConfig:
    """verl's ``custom_reward_function``: one Python function that scores every row, in place of the rule reward
    registered for the row's ``data_source`` (:mod:`asyncrl.reward`). It is named by file, not registered in the
    driver, because the rows are scored in Ray actors that never run the driver's code: each loads the file."""

    path: Optional[str] = None
    """A ``.py`` file, loaded by every process that scores; a relative path is resolved against the working directory
    (as verl) and made absolute in the driver when the run starts (the file must be on every machine of a Ray
    cluster); ``None`` = the rule reward registered for each row's ``data_source``."""
    name: str = "compute_score"
    """The function in ``path`` (only with ``path``), called as verl calls it: ``fn(data_source=..., solution_str=...,
    ground_truth=..., extra_info=...) -> float | {"score": float, **extras}`` (numeric extras become ``reward/<key>``
    metrics; :mod:`asyncrl.reward.result`)."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """verl's: more keyword arguments for the function, passed on every call beside the four (only with ``path``;
    verl binds them with ``functools.partial``), e.g. ``custom_reward_function.reward_kwargs.scale=2`` (Hydra's
    ``+custom_reward_function.reward_kwargs.scale=2`` reads the same) or ``'custom_reward_function.reward_kwargs={scale:
    2}'`` (quoted for the shell). The function must accept each key (checked with the four at ``--dry-run``, never by a call); a key named as
    one of the four is refused (verl's would silently replace that argument on every row)."""


# ------------------------------------------------------------------ validation (ValueError -> ConfigError in config.validate)
def validate_sampling(ro: Any) -> None:
    """The trainer applies these same filters (asyncrl/rollout/sampling.py); refuse what it could not match."""
    if ro.temperature < 0:
        raise ValueError(f"actor_rollout_ref.rollout.temperature must be >= 0, got {ro.temperature}")
    if ro.temperature < 1e-5:
        raise ValueError("actor_rollout_ref.rollout.temperature=0 is greedy: every response of a group is the same "
                          "and there are no log-probs of a sampling distribution to train on; use a temperature > 0")
    if not 0.0 < ro.top_p <= 1.0:
        raise ValueError(f"actor_rollout_ref.rollout.top_p must be in (0, 1], got {ro.top_p}")
    if not 0.0 <= ro.min_p < 1.0:
        raise ValueError(f"actor_rollout_ref.rollout.min_p must be in [0, 1), got {ro.min_p}")
    if ro.top_k < -1 or ro.top_k == 1:
        raise ValueError(f"actor_rollout_ref.rollout.top_k must be -1/0 (off) or >= 2, got {ro.top_k} "
                          "(top_k=1 is greedy: no sampling distribution to train on)")


def validate_algorithm(cfg: Any) -> None:
    al, ac, ro, rc = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.algorithm.rollout_correction
    if al.adv_estimator in ("grpo", "rloo", "reinforce_plus_plus_baseline") and ro.n < 2:
        raise ValueError(f"algorithm.adv_estimator={al.adv_estimator} needs a group: actor_rollout_ref.rollout.n >= 2 "
                          f"(got {ro.n}); use reinforce_plus_plus or gae for single responses")
    if cfg.algorithm.filter_groups.enable and ro.n < 2:
        raise ValueError("algorithm.filter_groups.enable needs actor_rollout_ref.rollout.n >= 2")
    if not 0.0 <= al.gamma <= 1.0 or not 0.0 <= al.lam <= 1.0:
        raise ValueError(f"algorithm.gamma and algorithm.lam must be in [0, 1], got {al.gamma}, {al.lam}")
    if ac.use_prefix_grouper and ac.strategy != "cpu":
        raise ValueError(f"actor_rollout_ref.actor.use_prefix_grouper runs with strategy=cpu only (got {ac.strategy}): "
                          "set it to false or null")
    if ac.clip_ratio_c is not None and ac.clip_ratio_c <= 1.0:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_c must be > 1 (or null), got {ac.clip_ratio_c}")
    if ac.loss_scale_factor is not None and ac.loss_scale_factor <= 0:
        raise ValueError(f"actor_rollout_ref.actor.loss_scale_factor must be > 0 (or null), got {ac.loss_scale_factor}")
    if al.kl_ctrl.type == "adaptive" and (al.kl_ctrl.horizon < 1 or al.kl_ctrl.target_kl <= 0):
        raise ValueError("algorithm.kl_ctrl: the adaptive controller needs horizon >= 1 and target_kl > 0")
    if rc.bypass_mode and (rc.rollout_is or rc.rollout_rs):
        raise ValueError("algorithm.rollout_correction.rollout_is / rollout_rs weigh the trainer's old log-probs against "
                          "the rollout's; set algorithm.rollout_correction.bypass_mode=false (recompute old log-probs)")
    if rc.rollout_is_threshold <= 1.0:
        raise ValueError(f"algorithm.rollout_correction.rollout_is_threshold must be > 1, got {rc.rollout_is_threshold}")
    upper = rc.rollout_rs_threshold if rc.rollout_rs_threshold is not None else rc.rollout_is_threshold
    lower = rc.rollout_rs_threshold_lower if rc.rollout_rs_threshold_lower is not None else 1.0 / upper
    if not 0.0 < lower < 1.0 < upper:
        raise ValueError(f"algorithm.rollout_correction: rejection needs 0 < rollout_rs_threshold_lower < 1 < "
                          f"rollout_rs_threshold, got {lower}, {upper}")
    ob = cfg.reward_model.overlong_buffer
    if ob.enable and not 0 < ob.len < ro.response_length:
        raise ValueError(f"reward_model.overlong_buffer.len must be in [1, actor_rollout_ref.rollout.response_length="
                          f"{ro.response_length}), got {ob.len}")
    custom = cfg.custom_reward_function
    if custom.path is None and custom.name != CustomRewardFunctionConfig.name:  # verl's default sets the name always
        raise ValueError(f"custom_reward_function.name={custom.name!r} is set without custom_reward_function.path, so "
                         "nothing would call it (each row is scored by the rule reward of its data_source): set "
                         f"custom_reward_function.path to the .py file that defines {custom.name}, or drop the name")
    if custom.path is None and custom.reward_kwargs:
        raise ValueError(f"custom_reward_function.reward_kwargs={dict(custom.reward_kwargs)!r} is set without "
                         "custom_reward_function.path, so no function would receive them (each row is scored by the rule "
                         "reward of its data_source): set custom_reward_function.path, or drop the reward_kwargs")
    bad = [k for k in custom.reward_kwargs if not isinstance(k, str)]
    if bad:  # set from Python: fn(**kwargs) raises "keywords must be strings" in every actor
        raise ValueError(f"custom_reward_function.reward_kwargs: key {bad[0]!r} ({type(bad[0]).__name__}) is not a "
                         "str: the keys are keyword arguments of the reward function")
    mt = ro.multi_turn
    if mt.enable and ro.agent.default_agent_loop == "single_turn_agent":
        raise ValueError("actor_rollout_ref.rollout.multi_turn.enable=true runs rows without agent_name through "
                          "tool_agent: set actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent too")

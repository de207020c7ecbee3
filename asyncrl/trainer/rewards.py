"""The reward step of ``fit_step``: rule scores -> shaped scores -> token-level rewards (with KL in the reward).

- Overlong reward shaping (DAPO, Yu et al. 2025, verl ``reward_model.overlong_buffer``): with cap
  ``L_max = rollout.response_length`` and buffer ``B``, a response of ``l`` tokens gets
  ``min(0, -(l - (L_max - B)) / B * penalty_factor)`` added: 0 up to ``L_max - B``, falling linearly
  to ``-penalty_factor`` at the cap.
- Token-level rewards: the score sits on the last model token; with ``algorithm.use_kl_in_reward``
  every model token also gets ``-beta * kl_t`` with ``kl_t`` the ``algorithm.kl_penalty`` estimate of
  ``KL(pi_old || pi_ref)`` (verl ``apply_kl_penalty``, Ouyang et al. 2022 / Ziegler et al. 2019).
- ``beta`` comes from a fixed or adaptive controller (Ziegler et al. 2019, verl ``kl_ctrl``): the
  adaptive one moves ``beta *= 1 + clip(kl / target_kl - 1, -0.2, 0.2) * n / horizon`` after each
  step, ``n`` the step's sequences.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import torch

from asyncrl.trainer.advantages import outcome_token_rewards
from asyncrl.trainer.losses import kl_penalty


class FixedKLController:
    """``beta`` stays ``kl_coef``."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op."""


class AdaptiveKLController:
    """Proportional controller toward ``target_kl`` (module doc)."""

    def __init__(self, kl_coef: float, target_kl: float, horizon: int):
        self.value, self.target, self.horizon = float(kl_coef), float(target_kl), int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """``current_kl``: mean per-token KL of the step; ``n_steps``: sequences in the step."""
        err = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + err * n_steps / self.horizon


def make_kl_controller(kl_ctrl: Any):
    """From :class:`asyncrl.config_algorithm.KLControlConfig`."""
    if kl_ctrl.type == "adaptive":
        return AdaptiveKLController(kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon)
    return FixedKLController(kl_ctrl.kl_coef)


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer_len: int, penalty_factor: float) -> torch.Tensor:
    """``(batch,)`` response lengths in tokens -> ``(batch,)`` penalties ``<= 0`` (module doc)."""
    exceed = lengths.float() - (max_len - buffer_len)
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


def shaped_scores(raw: torch.Tensor, lengths: torch.Tensor, cfg: Any) -> torch.Tensor:
    """Rule scores plus the overlong penalty when ``reward_model.overlong_buffer.enable`` (else ``raw``)."""
    ob = cfg.reward_model.overlong_buffer
    if not ob.enable:
        return raw.float()
    return raw.float() + overlong_penalty(lengths, cfg.actor_rollout_ref.rollout.response_length, ob.len,
                                          ob.penalty_factor)


def token_level_rewards(scores: torch.Tensor, mask: torch.Tensor, old_log_probs: Optional[torch.Tensor] = None,
                        ref_log_probs: Optional[torch.Tensor] = None, kl_ctrl: Any = None,
                        kl_type: str = "kl") -> tuple[torch.Tensor, dict]:
    """``(batch,)`` scores -> ``(batch, resp_len)`` token rewards, minus ``beta * kl`` when ``kl_ctrl`` is given.

    Updates ``kl_ctrl`` with the step's KL. Returns ``(rewards, metrics)`` with
    ``actor/reward_kl_penalty`` and ``actor/reward_kl_penalty_coeff`` when the KL applies.
    """
    rewards = outcome_token_rewards(scores, mask)
    if kl_ctrl is None or ref_log_probs is None or old_log_probs is None:
        return rewards, {}
    m = mask.float()
    kl = kl_penalty(old_log_probs, ref_log_probs, kl_type) * m
    beta = kl_ctrl.value
    rewards = rewards - beta * kl
    per_seq = kl.sum(-1) / m.sum(-1).clamp(min=1.0)
    current = float(per_seq.mean())
    kl_ctrl.update(current, n_steps=int(mask.shape[0]))
    return rewards, {"actor/reward_kl_penalty": current, "actor/reward_kl_penalty_coeff": beta}


def has_signal(values: Sequence[float]) -> bool:
    """True when a group's values are not all equal (DAPO keeps it: it carries a learning signal)."""
    vals = list(values)
    return any(v != vals[0] for v in vals[1:])

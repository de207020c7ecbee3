"""The optimizer's settings and learning-rate schedule, shared by both train engines (``TrainEngine``
on CPU, ``FSDPEngine`` on GPUs) and the simulator: one place, so the schedules cannot drift apart."""

from __future__ import annotations

from typing import Any, Callable

from asyncrl.config_schema import ExperimentConfig


def optim_kwargs(cfg: ExperimentConfig, optim: Any, epochs: int) -> dict[str, Any]:
    """Engine optimizer arguments from an ``optim`` section; the linear decay spans the run's updates
    (``total_training_steps * require_batches * epochs``) unless ``total_updates`` is set. The warm-up is
    ``lr_warmup_steps`` updates, or when that is negative (verl's default -1: "delegate to the ratio")
    ``int(lr_warmup_steps_ratio * total_updates)`` (verl's rule; the ratio's default 0 = no warm-up)."""
    per_step = cfg.async_training.require_batches * epochs
    total = optim.total_updates or cfg.trainer.total_training_steps * per_step
    warmup = optim.lr_warmup_steps if optim.lr_warmup_steps >= 0 else int(optim.lr_warmup_steps_ratio * total)
    return dict(lr=optim.lr, warmup=warmup, weight_decay=optim.weight_decay, betas=optim.betas, total_updates=total,
                clip_grad=optim.clip_grad)


def warmup_linear_decay(warmup: int, total_updates: int) -> Callable[[int], float]:
    """LR multiplier: linear warm-up over ``warmup`` updates, then linear decay to 0 at ``total_updates``. A negative
    ``warmup`` is none (0), as :func:`optim_kwargs` resolves verl's -1 before it gets here."""
    warmup = max(0, warmup)
    total = max(total_updates, warmup + 1)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))
    return schedule

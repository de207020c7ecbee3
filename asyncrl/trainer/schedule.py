"""The optimizer's settings and learning-rate schedule, shared by both train engines (``TrainEngine``
on CPU, ``FSDPEngine`` on GPUs) and the simulator: one place, so the schedules cannot drift apart."""

from __future__ import annotations

from typing import Any, Callable

from asyncrl.config_schema import ExperimentConfig


def optim_kwargs(cfg: ExperimentConfig, optim: Any, epochs: int) -> dict[str, Any]:
    """Engine optimizer arguments from an ``optim`` section; the linear decay spans the run's updates
    (``total_training_steps * require_batches * epochs``) unless ``total_updates`` is set."""
    per_step = cfg.async_training.require_batches * epochs
    return dict(lr=optim.lr, warmup=optim.lr_warmup_steps, weight_decay=optim.weight_decay, betas=optim.betas,
                total_updates=optim.total_updates or cfg.trainer.total_training_steps * per_step,
                clip_grad=optim.clip_grad)


def warmup_linear_decay(warmup: int, total_updates: int) -> Callable[[int], float]:
    """LR multiplier: linear warm-up over ``warmup`` updates, then linear decay to 0 at ``total_updates``."""
    total = max(total_updates, warmup + 1)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))
    return schedule

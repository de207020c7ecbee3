"""The trainer's engine and weight sender, chosen by ``actor_rollout_ref.actor.strategy``.

::

    strategy=cpu    TrainEngine in the trainer process   + LocalWeightSender(engine, checkpoint engine)
    strategy=fsdp2  TrainWorkerGroup (one Ray actor per trainer GPU; rank 0 holds the checkpoint engine),
                    which is both the engine and the sender

The checkpoint engine is ``actor_rollout_ref.rollout.checkpoint_engine.backend`` either way.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from asyncrl.api import WeightSender
from asyncrl.config import ExperimentConfig
from asyncrl.trainer.schedule import optim_kwargs


def build_train_engine(cfg: ExperimentConfig, replicas: Sequence[Any],
                       worker_options: Optional[Sequence[dict[str, Any]]] = None) -> tuple[Any, WeightSender]:
    """``(engine, sender)``: the engine has :class:`asyncrl.api.TrainEngine`'s compute / update / state
    methods; the sender pushes its weights into ``replicas`` (actor handles).

    Args:
        worker_options: ``ray.remote`` options per fsdp2 rank (from :class:`asyncrl.placement.Placement`);
            default: CPU actors, one per rank of :func:`asyncrl.placement.trainer_world_size`.
    """
    from asyncrl.placement import trainer_world_size
    from asyncrl.sync.sender import LocalWeightSender, make_checkpoint_engine

    arr = cfg.actor_rollout_ref
    if arr.actor.strategy == "fsdp2":
        from asyncrl.trainer.worker_group import TrainWorkerGroup

        opts = list(worker_options or [{"num_cpus": 0}] * trainer_world_size(cfg))
        group = TrainWorkerGroup(cfg, opts, replicas)
        return group, group
    engine = build_cpu_train_engine(cfg)
    return engine, LocalWeightSender(engine, make_checkpoint_engine(cfg, replicas))


def build_cpu_train_engine(cfg: ExperimentConfig) -> Any:
    """The ``strategy=cpu`` :class:`~asyncrl.trainer.engine.TrainEngine` as the trainer builds it (also what
    :func:`asyncrl.sim.calibrate.measure_train` times, so the simulator prices the trainer's own update)."""
    from asyncrl.rollout.sampling import SamplingFilters
    from asyncrl.trainer.engine import TrainEngine
    from asyncrl.trainer.shared_prefix import uses_prefix_grouper

    arr = cfg.actor_rollout_ref
    actor, al = arr.actor, cfg.algorithm
    return TrainEngine(
        arr.model.path, **optim_kwargs(cfg, actor.optim, actor.ppo_epochs), dtype=arr.model.dtype,
        micro_batch_size=actor.ppo_micro_batch_size, with_reference=actor.use_kl_loss or al.use_kl_in_reward,
        seed=cfg.trainer.seed, sampling=SamplingFilters.from_rollout_config(arr.rollout),
        max_token_len=actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else None,
        skip_zero_advantage=skips_zero_advantage(cfg), use_prefix_grouper=uses_prefix_grouper(cfg))


def skips_zero_advantage(cfg: ExperimentConfig) -> bool:
    """Whether the trainer's engine leaves rows whose advantage is 0 out of its updates: the CPU engine does
    when that is exact (no KL loss, no entropy bonus: see :class:`~asyncrl.trainer.engine.TrainEngine`); the
    fsdp2 engine trains every row. The simulator prices the same rows (``asyncrl.sim.runner``)."""
    actor = cfg.actor_rollout_ref.actor
    return actor.strategy != "fsdp2" and not actor.use_kl_loss and not actor.entropy_coeff

